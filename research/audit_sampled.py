"""Whether the audit pays sampled (issue 57, item 2): lookup's controller with and without its audit against fixed
policies (core/audit.py), and with one that judges drafting nothing alone (the safety net against drafts that keep
failing), replayed over the target's own samples at temperature 0.8, beside the best fixed length
and plain decoding, at this machine's batch costs.

    python research/audit_sampled.py [--seed N] [--models gemma-f16,smollm2] [--samples 3] [--temp 0.8]

For each real model and format family (spectool_lab.formats: unseen samples), `--samples` seeded samples of plain
decoding with llama.cpp's default sampling chain at `--temp` after each of `--prompts` (8). A deterministic draft is kept
up to where the sample leaves it, so replaying lookup's drafting over a sample is exact in distribution
(replay.ours); every policy is replayed over the same samples, so the comparison holds none of the live run's noise
(where each contender samples its own text). Each cell is tokens a second, relative to plain decoding's.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import replace

from spectool_lab import common, formats
from spectool_lab.replay import batch_costs, fixed, ours

from spectool.core.audit import LENGTHS, Audit
from spectool.core.controller import Controller
from spectool.generate.loop import GenerationConfig, speculative_generate
from spectool.llama import engine
from spectool.options import CTX_SIZE, llama_cpp_sampling

from controller_replay import K_MAX, known


def samples(target, prompt: list[int], args, seeds=None) -> list[list[int]]:
    """Seeded samples of plain decoding after `prompt` (those that made a token): one a seed of `seeds`, by
    default `args.samples` of them, seeded 0, 1, ..."""
    s = replace(llama_cpp_sampling(), temp=args.temp)
    out = []
    for seed in range(args.samples) if seeds is None else seeds:
        g = GenerationConfig(target, None, s, max_tokens=args.tokens, seed=seed)
        out.append([t for step in speculative_generate(g, prompt) for t in step.tokens])
    return [y for y in out if y]


# the audit as greedy runs it; one judging drafting nothing alone (no fixed length, llama-lookup's rule never
# leading); none, as the loop runs sampled
AUDITS = {"audited": Audit, "nothing": lambda: Audit(lengths=(), rule_margin=math.inf), "unaudited": None}


def speeds(data: list[tuple[list[int], list[int]]], cost: list[float], temp: float) -> dict[str, float]:
    """Each policy's tokens a second over `data` relative to plain decoding's: the controller under each of AUDITS
    (a fresh controller each sample, the cost table known, as after a first run), and the best fixed length."""
    def controlled(p: list[int], y: list[int], audit) -> float:  # one sample's seconds, its own table
        costs = known(cost)
        return ours(p, y, cost, K_MAX, costs, ctl=Controller(k_max=K_MAX, costs=costs, audit=audit is not None),
                    temp=temp, audit=audit and audit())

    plain = sum(len(y) for _, y in data) * cost[1]
    out = {name: plain / sum(controlled(p, y, audit) for p, y in data) for name, audit in AUDITS.items()}
    by_length = {k: sum(fixed(p, y, cost, k) for p, y in data) for k in LENGTHS}
    best = min(by_length, key=by_length.__getitem__)
    return {**out, "best fixed": plain / by_length[best], "best k": best}


def options(doc: str) -> tuple[argparse.Namespace, int]:
    """The flags of a replay over samples (this script's and research/seed_peek.py's), parsed, and the seed."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    formats.family_options(ap)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--temp", type=float, default=0.8)
    args = ap.parse_args()
    return args, common.fresh_seed(args.seed)


def main() -> None:
    args, seed = options(__doc__)
    print(f"unseen samples drawn with --seed {seed}; temperature {args.temp:g}, {args.samples} samples a prompt\n")
    print("| model | family | audited | against drafting nothing alone | unaudited | audited / unaudited | "
          "against nothing / unaudited | best fixed length (k) | audited / best fixed |"
          "\n|---|---|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    engine.set_verbose(False)
    ratios, nothing = [], []
    for name in args.models.split(","):
        with engine.Model(common.real_model(name), n_ctx=CTX_SIZE, n_threads=2) as target:
            chat, cost = formats.ChatFormat.of(target), None
            for fam in args.families.split(","):
                texts = [p.render(chat) for p in formats.chosen(fam, args.prompts, seed)]
                prompts = [target.tokenize(t, parse_special=True) for t in texts]
                data = [(p, y) for p in prompts for y in samples(target, p, args)]
                cost = cost or batch_costs(target, prompts[0], K_MAX + 1)
                s = speeds(data, cost, args.temp)
                ratios.append(s["audited"] / s["unaudited"])
                nothing.append(s["nothing"] / s["unaudited"])
                print(f"| {name} | {fam} | {s['audited']:.3f}x | {s['nothing']:.3f}x | {s['unaudited']:.3f}x | "
                      f"{s['audited'] / s['unaudited']:.3f}x | {nothing[-1]:.3f}x | "
                      f"{s['best fixed']:.3f}x ({s['best k']}) | "
                      f"{s['audited'] / s['best fixed']:.3f}x |", flush=True)
    for what, r in (("audited", ratios), ("against drafting nothing alone", nothing)):
        print(f"\n{what} / unaudited: mean {statistics.mean(r):.3f}x, {min(r):.3f}-{max(r):.3f}x")


if __name__ == "__main__":
    main()
