"""The audit's margin for llama-lookup's rule (core/audit.py RULE_MARGIN), replayed over every format family.

    python research/rule_margin.py [--tuning] [--seed N]

For each real model (F16 Gemma 3 270M, SmolLM2 135M) and format family (spectool_lab.formats: the prompts
benchmarks/vs_llamacpp.py measures), the target's greedy output of 8 prompts, then spectool's lookup replayed over
it (spectool_lab.replay.ours: its controller, cost table known, audited) at this machine's measured batch costs,
with the rule's margin at each of MARGINS (and the rule never taking over), against llama-lookup's drafting replayed
(lookup_bound.llama_lookup) and the best fixed length over lookup's drafts. Replayed costs leave out Python time and
machine noise: compare the ratios. Unseen samples by default; --tuning: the tuning lists (held-out families have
none).
"""

from __future__ import annotations

import argparse
import functools

from spectool_lab import common, formats, replay
from spectool_lab.replay import batch_costs, fixed, plain_output

from spectool.core.audit import LENGTHS, Audit
from spectool.core.controller import Controller
from spectool.llama import engine
from spectool.options import CTX_SIZE

from controller_replay import K_MAX, known
from lookup_bound import llama_lookup

MARGINS = (0.0, 0.1, 0.2, 0.3, None)  # None: the rule never takes over


def seconds(data, cost, margin: float | None) -> list[float]:
    """spectool's replayed seconds over each prompt of `data` with the rule's margin at `margin`."""
    audit = functools.partial(Audit, rule_margin=1e9 if margin is None else margin)
    real, replay.Audit = replay.Audit, audit  # type: ignore[misc]
    try:
        return [replay.ours(p, y, cost, K_MAX, known(cost), ctl=Controller(k_max=K_MAX, costs=known(cost)))
                for p, y in data]
    finally:
        replay.Audit = real  # type: ignore[misc]


def parser(doc: str) -> argparse.ArgumentParser:
    """The flags of a replay over the families (formats.family_options): this script's, research/audit_lag.py's and
    research/mean_bound.py's, which adds its own."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    formats.family_options(ap, tuning=True)
    return ap


def options(doc: str, ap: argparse.ArgumentParser | None = None) -> tuple[argparse.Namespace, int]:
    """The flags parsed (`ap`, else `parser(doc)`), llama.cpp quiet, and the seed."""
    args = (ap or parser(doc)).parse_args()
    engine.set_verbose(False)
    return args, common.fresh_seed(args.seed)


def main() -> None:
    args, seed = options(__doc__)
    print(f"seed {seed}, {'tuning lists' if args.tuning else 'unseen samples'}; replayed seconds, as llama-lookup's "
          "over spectool's (above 1: spectool faster): over the family, and (in brackets) its worst prompt\n")
    print("| model | family | " + " | ".join(f"margin {m}" if m is not None else "no rule" for m in MARGINS)
          + " | best fixed length |\n|---|---|" + "---:|" * (len(MARGINS) + 1))
    for name, fam, data, cost, theirs, best, _ in each_family(args, seed):
        cells = [cell(theirs, seconds(data, cost, m)) for m in MARGINS]
        print(f"| {name} | {fam} | " + " | ".join(cells) + f" | {sum(theirs) / best:.3f}x |", flush=True)


def outputs(target, chat, prompts, tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, the target's greedy output of up to `tokens`) of each of `prompts` (formats.Prompt), rendered in
    the model's format `chat` and tokenized as llama.cpp's tools tokenize them."""
    out = []
    for pr in prompts:
        p = target.tokenize(pr.render(chat), parse_special=True)
        out.append((p, plain_output(target, p, tokens)))
    return out


def each_family(args, seed: int):
    """For each real model of --models and format family: its name, the family's, the target's greedy output of
    --prompts of its prompts (prompt, output), this machine's batch costs, llama-lookup's replayed seconds on each,
    the best fixed length's seconds over them all, and the target (open until the next model)."""
    for name in args.models.split(","):
        with engine.Model(common.real_model(name), n_ctx=CTX_SIZE, n_threads=2) as target:
            chat = formats.ChatFormat.of(target)
            for fam in args.families.split(","):
                data = outputs(target, chat, formats.chosen(fam, args.prompts, seed, args.tuning), args.tokens)
                if not data:
                    continue
                cost = batch_costs(target, data[0][0], K_MAX + 1)
                theirs = [llama_lookup(p, y, cost) for p, y in data]
                best = min(sum(fixed(p, y, cost, k) for p, y in data) for k in LENGTHS)
                yield name, fam, data, cost, theirs, best, target


def cell(theirs: list[float], ours: list[float]) -> str:
    """llama-lookup's replayed seconds over spectool's, over the family and (in brackets) its worst prompt."""
    worst = min(t / o for t, o in zip(theirs, ours) if o)  # (an output that ended at once: none)
    return f"{sum(theirs) / sum(ours):.3f}x ({worst:.2f}x)"


if __name__ == "__main__":
    main()
