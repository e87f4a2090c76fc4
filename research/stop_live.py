"""Drafts that end where the output would, live: spectool's lookup at its defaults with Loop.ended (a draft ends at
the token that completes a stop string, or at its first end-of-generation token) against the same with that cut
undone, decoded for real, interleaved prompt by prompt, repeated.

    python research/stop_live.py [--models gemma-f16,smollm2] [--families qa,instruction,raw,chat,second-turn]
                                 [--repeats 3] [--prompts 8] [--seed N]

Each format family (spectool_lab.formats: unseen samples, seeded and printed) ends its output as a user would end
it: qa at "Question:" (the README's command), instruction at "###", raw text at a blank line ("\n\n"), the chat
families at the template's end-of-turn token (no stop string). Every prompt runs both contenders, their order
turned at each prompt and repeat, each with its own fresh cost table at each repeat, greedy. Prints tokens per
second of decoding (prompt processing excluded) per family, mean and range over repeats, cut over uncut, the
drafted and generated tokens, and whether the texts are the same (the cut drops only drafts whose acceptance the
output would not show; where they part, the target's logit gap there after a plain prefill: a near-tie's is small,
docs/exactness.md).
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager, nullcontext

from spectool_lab import common, formats

from tree_live import gap

from spectool.bench import Contender
from spectool.core.costs import Costs
from spectool.core.stats import Stats
from spectool.generate import loop
from spectool.generate.loop import speculative_generate
from spectool.llama import engine
from spectool.options import DRAFT_MAX, Mode

STOPS = {"qa": ["Question:"], "instruction": ["###"], "raw": ["\n\n"], "chat": [], "second-turn": []}


@contextmanager
def uncut():
    """Loop.ended undone: drafts run past where the output would end."""
    ended = loop.Loop.ended
    loop.Loop.ended = lambda self, d, keys: d  # type: ignore[method-assign]
    try:
        yield
    finally:
        loop.Loop.ended = ended  # type: ignore[method-assign]


def decode(target, prompt: list[int], stop: list[str], tokens: int, costs: Costs, cut: bool):
    st = Stats()
    g = Contender("lookup", Mode.lookup, DRAFT_MAX).generation(target, {}, tokens, costs)
    t0 = time.perf_counter()
    with nullcontext() if cut else uncut():
        out = [t for step in speculative_generate(g, prompt, st, stop=stop) for t in step.tokens]
    return out, time.perf_counter() - t0 - st.prompt_seconds, st.n_drafted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    formats.family_options(ap, families="qa,instruction,raw,chat,second-turn")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    seed = common.fresh_seed(args.seed)
    engine.set_verbose(False)
    print(f"seed {seed}, greedy, {args.tokens} tokens at most; tokens/s of decoding, mean (range over "
          f"{args.repeats} repeats)\n")
    print("| model | family | stop | uncut | cut | cut / uncut | drafted uncut | drafted cut | generated | same |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, target, fam, texts in formats.each_family(args, seed):
        speed: dict[bool, list[float]] = {False: [], True: []}
        drafted, made, same, gaps = {False: 0, True: 0}, 0, 0, []
        for r in range(args.repeats):
            costs = {False: Costs(), True: Costs()}
            done = {False: [0, 0.0], True: [0, 0.0]}
            for i, prompt in enumerate(texts):
                outs = {}
                for cut in ((False, True) if (i + r) % 2 else (True, False)):
                    out, seconds, n = decode(target, prompt, STOPS[fam], args.tokens, costs[cut], cut)
                    outs[cut], drafted[cut] = out, drafted[cut] + n
                    done[cut][0] += len(out)
                    done[cut][1] += seconds
                same += outs[False] == outs[True]
                if outs[False] != outs[True]:
                    gaps.append(gap(target, prompt, outs[False], outs[True]))
                made += len(outs[True])
            for cut in (False, True):
                speed[cut].append(done[cut][0] / done[cut][1])
        mean = {c: sum(v) / len(v) for c, v in speed.items()}
        text = {c: f"{mean[c]:.1f} ({min(v):.1f}-{max(v):.1f})" for c, v in speed.items()}
        print(f"| {name} | {fam} | {STOPS[fam] or 'end of turn'!r} | {text[False]} | {text[True]} | "
              f"{mean[True] / mean[False]:.3f}x | {drafted[False]} | {drafted[True]} | {made} | "
              f"{same}/{len(texts) * args.repeats} |"
              + (f" (logit gaps where the texts part: {', '.join(f'{g:.4f}' for g in gaps)})" if gaps else ""),
              flush=True)


if __name__ == "__main__":
    main()
