"""A draft model of another family drafting through text: SmolLM2 135M Instruct (49k-token vocabulary) for Gemma 3
270M (262k), F16 and Q4_K_M, against plain decoding and prompt lookup (issue 61 item 4).

    pip install -e ".[test,bench]"
    python benchmarks/cross_family.py                     # about 25 minutes on 2 cores
    python benchmarks/cross_family.py --samples 1 --prompts 2 --tokens 32   # a smoke run

For each target and each set (unseen ShareGPT free-form questions and grounded questions, `--samples` samples of
`--prompts` prompts drawn by seed, seed + 1, ...), the contenders run interleaved prompt by prompt, greedy, as
`spectool run` runs them: plain (`--spec none`), lookup, the draft through text (`--spec draft`) and hybrid (lookup
and the draft, which `--spec auto` picks for such a pair). Each figure is tokens per second on the stream's clock
(spectool/bench.py), its ratio to plain decoding in the same sample, the draft's acceptance, and the tokens a step
makes. Every greedy output is compared with plain decoding's (identical: prompts whose text is plain's). The best
case of the draft on this machine is research/text_draft_bound.py's oracle replay
(research/notes/2026-12-04-text-draft-bound.md).
"""

from __future__ import annotations

import argparse
import statistics

from spectool_lab import common
from spectool_lab.common import models, smollm2

from spectool import bench
from spectool.bench import Contender, Result
from spectool.llama import engine
from spectool.models.registry import PAIR_DRAFT_MAX
from spectool.options import DRAFT_MAX, Mode

SETS = ("free-form (ShareGPT)", "grounded chat (ShareGPT)")
CONTENDERS = [Contender("plain", Mode.none), Contender("lookup", Mode.lookup, DRAFT_MAX),
              Contender("draft (through text)", Mode.draft, PAIR_DRAFT_MAX),
              Contender("hybrid (auto)", Mode.hybrid, 2 * PAIR_DRAFT_MAX)]


def one_target(kind: str, args, seed: int) -> dict[str, list[list[Result]]]:
    """Every set's samples on target `kind` (F16 or Q4_K_M) with SmolLM2 drafting: {set: [each sample's results]}."""
    out: dict[str, list[list[Result]]] = {}
    with common.load(models((kind,))[kind], args.threads) as target, common.load(smollm2(), args.threads) as draft:
        for name in SETS:
            for s in range(args.samples):
                prompts = [target.tokenize(t) for t in common.unseen(name, args.prompts, seed + s)]
                results = bench.run(target, {0: (draft, None)}, prompts, CONTENDERS, args.tokens,
                                    through_text=True)
                out.setdefault(name, []).append(results)
                print(f"\n{kind}, {name}, sample {s + 1} (--seed {seed + s}):\n"
                      + bench.markdown_table(results), flush=True)
    return out


def summary(kind: str, by_set: dict[str, list[list[Result]]]) -> str:
    """A table per target: each set's contenders over the samples (mean speedup and its spread, tokens per
    second, acceptance, tokens a step, identical outputs)."""
    lines = [f"\n### Gemma 3 270M {kind} + SmolLM2 135M Instruct Q4_1 (through text)\n",
             "| set | contender | vs plain (mean, min-max over samples) | tok/s | acceptance | tokens a step "
             "| identical |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, samples in by_set.items():
        for i, c in enumerate(CONTENDERS):
            rs = [sample[i] for sample in samples]
            ups = [r.speedup for r in rs]
            steps, made = sum(r.steps for r in rs), sum(r.generated for r in rs)
            drafted, accepted = sum(r.drafted for r in rs), sum(r.accepted for r in rs)
            lines.append(f"| {name} | {c.name} | {statistics.mean(ups):.2f}x ({min(ups):.2f}-{max(ups):.2f}) | "
                         f"{statistics.mean(r.tokens_per_second for r in rs):.1f} | "
                         f"{accepted / drafted if drafted else 0:.0%} | {made / steps if steps else 0:.2f} | "
                         f"{sum(r.identical for r in rs)}/{sum(r.prompts for r in rs)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--targets", default="F16,Q4_K_M")
    ap.add_argument("--seed", type=int, default=None, help="the first sample's seed (default: a fresh one)")
    args = ap.parse_args()
    seed = common.fresh_seed(args.seed)
    engine.set_verbose(False)
    tables = [summary(kind, one_target(kind, args, seed)) for kind in args.targets.split(",")]
    print(f"\n{common.machine(args.threads)}; greedy, {args.prompts} prompts a sample, {args.tokens} tokens, "
          f"{args.samples} samples (seeds {seed}..{seed + args.samples - 1}). "
          f"Command: `python benchmarks/cross_family.py --seed {seed}`" + "".join(tables))


if __name__ == "__main__":
    main()
