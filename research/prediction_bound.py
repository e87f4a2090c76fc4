"""How far a prediction (OpenAI's Predicted Outputs) can take an edit request past prompt lookup: benchmarks/
prediction.py's workload, the drafting policies replayed over the target's own greedy output at this machine's
measured batch costs (as lookup_bound.py replays lookup's), so that machine noise stays out.

    python research/prediction_bound.py [--prompts 8] [--tokens 192] [--seed N]
    python research/prediction_bound.py --clock cpu --threads 1      # a machine others keep busy

Each prompt is a HumanEval function and a request to write it again (spectool_lab.common's code-editing set, drawn
from the prompts off the tuning list); the function is the prediction. Policies, each with one controller over all
the prompts (as one server's requests):
- prompt lookup alone (the request without a prediction), and the prediction ahead of it
  (drafters/prediction.PredictionDrafter), both under spectool's adaptive Controller;
- the oracle over each drafter's drafts (lookup_bound.cheapest: it knows how many tokens of each draft the target
  accepts);
- the oracle over the best any drafter could take from the prediction or from lookup: at each token, the longer of
  lookup's accepted draft and the longest stretch of the prediction, from anywhere in it, that the output goes on
  with;
- a drafter that knows the whole output (every draft accepted): what the batch costs alone allow.
The prompt holds the function, so lookup can copy what the prediction holds: the ratio of the third over lookup's
controller bounds what any use of the prediction adds to lookup on this workload.
"""

from __future__ import annotations

import argparse
import time

from spectool_lab import common
from spectool_lab.common import machine, models, split

from lookup_bound import accepted, batch_costs, cheapest, cost_line, ours, plain_output
from spectool.llama import engine  # llama.cpp's libraries before numpy: spectool/llama/native.py
from spectool.core.controller import Controller
from spectool.core.costs import Costs
from spectool.drafters.lookup import PromptLookup
from spectool.drafters.prediction import PredictionDrafter
from spectool.options import CTX_SIZE


def drafter(prediction: list[int] | None, p: list[int]):
    d = PromptLookup() if prediction is None else PredictionDrafter(prediction, PromptLookup())
    d.start(p)
    return d


def reach_of(d, p, y, k_max: int) -> list[int]:
    """How many tokens of `d`'s draft of k_max tokens the target would accept, at each token of `y`."""
    out = []
    for j in range(len(y)):
        h = p + y[:j]
        offered = list(d.peek(h, min(k_max, len(y) - j - 1)))
        out.append(accepted(d.propose(h, len(offered), None, None).tokens if offered else [], y, j))
    return out


def best_stretch(prediction: list[int], y: list[int], j: int, k_max: int) -> int:
    """The longest stretch of the prediction, from anywhere in it, that y goes on with at token j (k_max at
    most)."""
    return max((accepted(prediction[i : i + k_max], y, j) for i in range(len(prediction))), default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="batch costs by the wall clock, or by CPU time (with --threads 1: a busy machine)")
    common.sample_options(ap)
    args = ap.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        raise SystemExit("--clock cpu needs --threads 1 (ggml's threads spin while they wait)")
    seed = common.fresh_seed(args.seed)
    engine.set_verbose(False)
    k = args.k_max
    with engine.Model(models()["F16"], n_ctx=CTX_SIZE, n_threads=args.threads) as target:
        data = []
        for text in common.chosen(next(iter(common.SETS)), args.prompts, args, seed):
            p = target.tokenize(text, add_special=True, parse_special=True)
            q = target.tokenize(split(text), add_special=False, parse_special=False)
            data.append((p, plain_output(target, p, args.tokens), q))
        cost = batch_costs(target, data[0][0], k + 1,
                           clock=time.process_time if args.clock == "cpu" else time.perf_counter)
    n = sum(len(y) for _, y, _ in data)
    rows = [("plain decoding", n * cost[1])]
    for name, with_q in (("controller: prompt lookup (no prediction)", False),
                         ("controller: the prediction, then lookup", True)):
        ctl = Controller(k_max=k, costs=Costs())
        rows.append((name, sum(ours(p, y, cost, k, ctl.costs, drafter(q if with_q else None, p), ctl)
                               for p, y, q in data)))
    for name, with_q in (("oracle: prompt lookup's drafts", False), ("oracle: the prediction drafter's", True)):
        rows.append((name, sum(cheapest(reach_of(drafter(q if with_q else None, p), p, y, k), cost)
                               for p, y, q in data)))
    rows.append(("oracle: the best of lookup and any stretch of the prediction", sum(
        cheapest([max(r, best_stretch(q, y, j, min(k, len(y) - j - 1)))
                  for j, r in enumerate(reach_of(drafter(None, p), p, y, k))], cost) for p, y, q in data)))
    rows.append(("a drafter that knows the output", sum(cheapest([min(k, len(y) - j - 1) for j in range(len(y))],
                                                                 cost) for _, y, _ in data)))
    drawn = "the tuning list" if args.tuning else f"unseen, --seed {seed}"
    print(f"{machine(args.threads)}\n{cost_line(cost)} ({args.clock} clock)\n\nF16 Gemma 3 270M, code editing (HumanEval), "
          f"{len(data)} prompts ({drawn}), {n} tokens, greedy\n")
    print("| policy, replayed | tok/s | vs plain | vs lookup's controller |\n|---|---:|---:|---:|")
    for name, seconds in rows:
        print(f"| {name} | {n / seconds:.1f} | {rows[0][1] / seconds:.2f}x | {rows[1][1] / seconds:.2f}x |")


if __name__ == "__main__":
    main()
