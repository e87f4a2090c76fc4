"""Where a replay's prediction goes when lookup runs live: the same prompts decoded by spectool plain and spectool
lookup, and replayed, their times taken apart.

    python research/live_gap.py [--models smollm2] [--families qa,instruction,raw,code] [--prompts 4] [--seed N] \
        [--temp T]

A replay (research/mean_bound.py, rule_margin.py) charges each step the batch cost measured beforehand and nothing
else. Live, a step also costs spectool's own work around `llama_decode` (drafting, the controller, its audit,
reading outputs), its decodes cost what they cost then, and the controller chooses from the cost table it has
measured, not from the replay's. Per model: a cost table measured first over 2 tuning prompts of each family (as
benchmarks/vs_llamacpp.py --tables saved does), then for each unseen prompt: its batch costs, spectool plain and
spectool lookup timed as the benchmark times them (prompt processing left out) with every `llama_decode` call in
that window timed too, and the replay of spectool's lookup (its controller, cost table known, audited) over plain's
output. Prompts where lookup's text left plain's at a near-tie of batched rows (docs/exactness.md) are left out:
there the two decoded other texts. Prints, pooled over the prompts: lookup's host time per step (wall less
`llama_decode`), its decodes over what the measured batch costs price its own steps at, those steps over the
replay's, plain's wall time over its price, and the speed-up over plain live and replayed.
`--temp T`: each prompt sampled at T with llama.cpp's default chain, seeded as the benchmark seeds prompt i of its
first repeat (common.generation_seed), plain and lookup alike: a seed draws one text whatever lookup drafts
(docs/exactness.md), and the replay is exact over it (the controller unaudited, as the loop runs sampled).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from spectool_lab import common, formats, replay
from spectool_lab.replay import batch_costs

from spectool.bench import Contender
from spectool.core.controller import Controller
from spectool.core.costs import Costs
from spectool.core.stats import Stats
from spectool.core.verify import Sampling
from spectool.generate.loop import speculative_generate
from spectool.llama import engine
from spectool.options import DRAFT_MAX, Mode, llama_cpp_sampling

from controller_replay import K_MAX, known

WARM = 2  # tuning prompts of each family that measure the cost table first


def timed(target, prompt: list[int], mode: Mode, costs: Costs, tokens: int = 96,
          sampling: Sampling = Sampling(), seed: int | None = None) -> tuple[list[int], list[int], float, float]:
    """(the tokens, each step's draft length, wall seconds of decoding, seconds inside llama_decode then)."""
    lib, inside = target.lib, [0.0]
    decode = lib.llama_decode

    def clocked(*a):
        t0 = time.perf_counter()
        try:
            return decode(*a)
        finally:
            inside[0] += time.perf_counter() - t0

    st = Stats(mode=mode)
    g = Contender(mode.name, mode, DRAFT_MAX).generation(target, {}, tokens, costs, sampling, seed)
    lib.llama_decode = clocked
    try:
        t0 = time.perf_counter()
        steps = list(speculative_generate(g, prompt, st))
        wall = time.perf_counter() - t0 - st.prompt_seconds
    finally:
        lib.llama_decode = decode
    return [t for s in steps for t in s.tokens], [s.drafted for s in steps], wall, inside[0]


def one_model(name: str, args, seed: int) -> None:
    t = dict.fromkeys(("wall", "inside", "steps", "priced", "replayed", "plain wall", "plain priced"), 0.0)
    left, sampling = 0, replace(llama_cpp_sampling(), temp=args.temp) if args.temp else Sampling()
    with common.load(common.real_model(name), 2) as target:
        chat = formats.ChatFormat.of(target)
        costs = Costs()
        for f in formats.FAMILIES:
            for p in formats.tuning(f, WARM):
                timed(target, target.tokenize(p.render(chat), parse_special=True), Mode.lookup, costs)
        for f in args.families.split(","):
            for i, p in enumerate(formats.unseen(f, args.prompts, seed)):
                prompt = target.tokenize(p.render(chat), parse_special=True)
                drawn = (sampling, common.generation_seed(0, i))
                y, _, plain_wall, _ = timed(target, prompt, Mode.none, costs, args.tokens, *drawn)
                ours, drafts, wall, inside = timed(target, prompt, Mode.lookup, costs, args.tokens, *drawn)
                if len(y) <= 1 or ours != y:
                    left += ours != y
                    continue
                cost = batch_costs(target, prompt, K_MAX + 1)
                t["wall"] += wall
                t["inside"] += inside
                t["steps"] += len(drafts)
                t["priced"] += sum(cost[d + 1] for d in drafts)
                t["replayed"] += replay.ours(prompt, y, cost, K_MAX, known(cost), temp=args.temp, ctl=Controller(
                    k_max=K_MAX, costs=known(cost), audit=not args.temp))
                t["plain wall"] += plain_wall
                t["plain priced"] += len(y) * cost[1]
    print(f"| {name} | {1000 * (t['wall'] - t['inside']) / t['steps']:.2f} | {t['inside'] / t['priced']:.3f} | "
          f"{t['priced'] / t['replayed']:.3f} | {t['plain wall'] / t['plain priced']:.3f} | "
          f"{t['plain wall'] / t['wall']:.3f}x | {t['plain priced'] / t['replayed']:.3f}x | {left} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    formats.family_options(ap, families="qa,instruction,raw,code")
    ap.add_argument("--temp", type=float, default=0.0)
    ap.set_defaults(models="smollm2", prompts=4)
    args = ap.parse_args()
    seed = common.fresh_seed(args.seed)
    engine.set_verbose(False)
    print(f"seed {seed}, temperature {args.temp}, {common.machine(2)}\n\n| model | lookup's host ms / step | its decodes / its steps priced "
          "| its steps priced / the replay's | plain's wall / its price | lookup over plain, live | replayed "
          "| left out (other text) |"
          "\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        one_model(name, args, seed)


if __name__ == "__main__":
    main()
