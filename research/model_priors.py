"""Whether lookup's priors should be each model's own: the controller's prior acceptance for each of lookup's keys
measured on a model's tuning lists, replayed on unseen samples of every format family, held-out ones included.

    python research/model_priors.py [--models smollm2,gemma-f16] [--prompts 8] [--seed N]

spectool/core/controller.py's LOOKUP_PRIORS were measured on Gemma 3 270M (research/notes/2026-12-02-lab.md,
"Lookup's priors") and serve every model. For each model: its greedy output of every tuning prompt (8 a family),
each key's acceptance pooled over them (as controller_replay.hindsight counts it: of the tokens lookup would draft
under the key, the share accepted once those before were), kept where 20 tokens or more say so, at the shipped
prior's weight. Then on unseen samples, at this machine's batch costs, spectool's lookup replayed (its controller,
cost table known, audited) with the shipped priors, with the model's own, and with the other model's, each as plain
decoding's replayed seconds over its own (the family's prompts pooled), beside the oracle over the same drafts.
"""

from __future__ import annotations

import argparse

from spectool_lab import common, formats, replay
from spectool_lab.replay import batch_costs, oracle

from spectool.core.controller import Controller, _default_priors
from spectool.core.evidence import Source
from spectool.llama import engine
from spectool.options import CTX_SIZE

import rule_margin
from controller_replay import K_MAX, key_counts, known

ENOUGH = 20  # tokens drafted under a key, pooled, before its measured acceptance replaces the shipped prior


def measured(data) -> dict:
    """The shipped priors, each of lookup's keys with ENOUGH tokens over `data` (prompt, output) at its pooled
    acceptance there (controller_replay.key_counts)."""
    counts: dict = {}
    for p, y in data:
        key_counts(p, y, counts=counts)
    priors = _default_priors()
    for k, (tries, hits) in counts.items():
        if k in priors and k.source == Source.lookup and tries >= ENOUGH:
            priors[k] = (hits / tries, priors[k][1])
    return priors


def outputs(target, chat, prompts) -> list:
    """rule_margin.outputs of 96 tokens, those that ended at once left out."""
    return [(p, y) for p, y in rule_margin.outputs(target, chat, prompts, 96) if len(y) > 1]


def replayed(data, cost, priors: dict | None) -> float:
    total = 0.0
    for p, y in data:
        ctl = Controller(k_max=K_MAX, costs=known(cost))
        if priors is not None:
            ctl.priors = dict(priors)
        total += replay.ours(p, y, cost, K_MAX, ctl.costs, ctl=ctl)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma-f16")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    engine.set_verbose(False)
    seed, names = common.fresh_seed(args.seed), args.models.split(",")
    own, unseen = {}, {}
    for name in names:
        with engine.Model(common.real_model(name), n_ctx=CTX_SIZE, n_threads=2) as target:
            chat = formats.ChatFormat.of(target)
            own[name] = measured(outputs(target, chat, [p for f in formats.FAMILIES
                                                        for p in formats.tuning(f, args.prompts)]))
            unseen[name] = {}
            for f in formats.FAMILIES:
                data = outputs(target, chat, formats.unseen(f, args.prompts, seed))
                unseen[name][f] = data, batch_costs(target, data[0][0], K_MAX + 1)
    print(f"{common.machine(2)}; seed {seed}; replayed speed-up over plain decoding, the family's prompts pooled\n\n"
          "| model | family | oracle | shipped priors | the model's own | the other model's |\n"
          "|---|---|---:|---:|---:|---:|")
    for name in names:
        other = next((own[m] for m in names if m != name), None)
        for f, (data, cost) in unseen[name].items():
            plain = sum(len(y) for _, y in data) * cost[1]
            cells = [plain / sum(oracle(p, y, cost, K_MAX) for p, y in data), plain / replayed(data, cost, None),
                     plain / replayed(data, cost, own[name])]
            cells += [plain / replayed(data, cost, other)] if other is not None else []
            print(f"| {name} | {f}{' (held out)' if formats.FAMILIES[f].held_out else ''} | "
                  + " | ".join(f"{c:.3f}x" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
