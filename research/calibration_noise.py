"""Whether a fresh cost table that measures more before its first step steers lookup's controller alike run to run
(issue 57, item 3): the same prompt decoded N times, greedy, each time on a fresh table, calibrated as shipped
(generate/prompt.py: batches of 1, 2, 4, 8, each twice, the first a warm-up) or densely (every batch size up to
the step's largest, 16 at most, three times after a warm-up, priced at the lower median), interleaved.

    python research/calibration_noise.py [--models smollm2] [--families raw,instruction,chat,qa] [--prompts 2]
                                         [--runs 5] [--seed N]

research/notes/2026-12-05-cost-noise.md found fresh tables taking 3-5 step sequences a prompt where a frozen one
takes one: the table's first measurements steer the controller. The benchmark excludes prompt processing, the
calibration with it, so what dense calibration costs is printed on its own (a user pays it once per model and
machine). Prints per prompt, for each way: the decode time's mean and range over the runs, the drafted tokens'
range, and how many distinct step sequences the runs took.
"""

from __future__ import annotations

import time

from cost_noise import decode, options, spread
from spectool_lab import formats

from spectool.core.costs import Costs
from spectool.generate import loop, prompt as prompt_processing

SHIPPED = prompt_processing.calibrate
DENSE_MAX, TIMES = 16, 3


def dense(target, x, ctl, output) -> None:
    """generate/prompt.py's calibrate, densely: every size up to the step's largest (DENSE_MAX at most; on these
    CPUs the shipped one stops at 8 there too, a batch of 16 costing several tokens'), a warm-up then TIMES
    measurements each."""
    costs = ctl.costs
    if not costs.timed or any(b >= 2 for b in costs.verify):
        return
    for b in range(1, min(ctl.k_max + 1, DENSE_MAX) + 1):
        if len(x) - 1 + b > target.n_ctx:
            break
        for i in range(1 + TIMES):
            t0 = time.perf_counter()
            target.eval([x[-1]] * b, logits="all", output=output)
            if i:
                ctl.observe_verify(b, time.perf_counter() - t0)
            target.rollback(len(x) - 1)


def main() -> None:
    args, seed = options(__doc__, "raw,instruction,chat,qa", "way")
    print("| model | family | prompt | calibration | decode time (range over mean) | drafted | step sequences |")
    print("|---|---|---:|---|---:|---:|---:|")
    spent: dict[str, list[float]] = {"as shipped": [], "dense": []}  # seconds each calibration took

    def timed(way, calibrate):
        def run(*a) -> None:
            t0 = time.perf_counter()
            calibrate(*a)
            spent[way].append(time.perf_counter() - t0)
        return run

    ways = {"as shipped": timed("as shipped", SHIPPED), "dense": timed("dense", dense)}
    for name, target, fam, prompts in formats.each_family(args, seed):
        for i, prompt in enumerate(prompts):
            runs: dict[str, list] = {way: [] for way in ways}
            for _ in range(args.runs):
                for way, calibrate in ways.items():
                    loop.calibrate = calibrate  # what generate/loop.py calls before the first step
                    try:
                        runs[way].append(decode(target, prompt, args.tokens, Costs()))
                    finally:
                        loop.calibrate = SHIPPED
            for way, rs in runs.items():
                seconds, drafted, _, steps = zip(*rs)
                print(f"| {name} | {fam} | {i + 1} | {way} | {spread(list(seconds))} | {min(drafted)}-{max(drafted)} "
                      f"| {len(set(steps))} |", flush=True)
    print("\ncalibration, mean over the runs: " + ", ".join(f"{way} {1e3 * sum(s) / max(1, len(s)):.0f} ms"
                                                     for way, s in spent.items()))


if __name__ == "__main__":
    main()
