"""How far a quiet machine's batch prices stray from what their neighbours predict: the spread behind
controller.Costs.doubt.

    python research/cost_shape.py              # about 2 minutes on 2 cores
    python research/cost_shape.py --sizes 33 --samples 9

For Gemma 3 270M Q4_K_M, F16 and F32: every batch size from 1 to --sizes verified --samples times after a
prompt (first of each size dropped as a warm-up), priced at the lower median of its samples as Costs does. Then,
as Costs.believed checks a size it has not confirmed, each size in increasing order against what the smaller
sizes predict for it (Costs.predict): the ratio of its price to that prediction. A quiet machine's largest ratio must stay
well below `doubt`, or real prices would be doubted and measured again and again.
"""

from __future__ import annotations

import argparse
import time

from spectool_lab import common
from spectool_lab.common import models

from spectool.llama import engine
from spectool.core.costs import Costs
from spectool.options import CTX_SIZE


def prices(target, prompt: list[int], sizes: int, samples: int) -> dict[int, float]:
    target.eval(prompt[:-1])
    out = {}
    for b in range(1, sizes + 1):
        seen = []
        for _ in range(samples + 1):
            t0 = time.perf_counter()
            target.eval([prompt[-1]] * b, logits="all")
            seen.append(time.perf_counter() - t0)
            target.rollback(len(prompt) - 1)
        out[b] = sorted(seen[1:])[(samples - 1) // 2]
    return out


def ratios(measured: dict[int, float]) -> tuple[dict[int, float], dict[int, float]]:
    """Each size's price over what Costs.predict makes of the others, as Costs.believed checks a size: from the
    smaller sizes alone (a fresh table's first pass), and from all the others (its nearest neighbours on both
    sides: a saved price judged against this run's)."""
    costs, sizes = Costs(), sorted(measured)
    below = {b: measured[b] / costs.predict(measured, sizes[:i], b)[0] for i, b in enumerate(sizes) if b > 1}
    around = {b: measured[b] / costs.predict(measured, sizes[:i] + sizes[i + 1:], b)[0]
              for i, b in enumerate(sizes) if b > 1}
    return below, around


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, default=17)
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine.set_verbose(False)
    print(f"doubt = {Costs().doubt}; sizes 1-{args.sizes}, lower median of {args.samples} samples each\n")
    print("| model | 1 token ms | from smaller sizes: largest ratio (size) | from neighbours: largest (size) | "
          "ratios of sizes 2.. from their neighbours |\n|---|---:|---:|---:|---|")
    text = common.humaneval_prompts(1)[0]
    for name, path in models().items():
        with engine.Model(path, n_ctx=CTX_SIZE, n_threads=args.threads) as target:
            measured = prices(target, target.tokenize(text), args.sizes, args.samples)
        below, around = ratios(measured)
        w, v = max(below, key=below.get), max(around, key=around.get)
        print(f"| {name} | {measured[1] * 1000:.1f} | {below[w]:.2f} ({w}) | {around[v]:.2f} ({v}) | "
              f"{' '.join(f'{x:.2f}' for x in around.values())} |", flush=True)


if __name__ == "__main__":
    main()
