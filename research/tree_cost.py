"""What a draft tree costs to verify on this machine against a chain of as many rows: the assumption of
research/tree_bound.py ("a tree of R nodes is one decode of R + 1 rows", priced by the chain's table) checked
on the real decode (ParallelModel.eval_tree, a unified KV cache).

    python research/tree_cost.py                    # Gemma 3 270M F16, 400-token history, CPU time at 1 thread
    python research/tree_cost.py --clock wall --threads 2

For each row count R: a chain through Model.eval (today's verification), the same chain as a one-leaf tree
through eval_tree (the history copied into a spare sequence, then dropped), and a tree of R rows over W leaves
(the root, then W branches of equal length). Each is the median of --reps decodes, the history restored
between them.
"""

from __future__ import annotations

import argparse
import statistics
import time

from spectool.llama.engine import Model
from spectool.llama.parallel import ParallelModel, Tree
from spectool_lab.common import machine, real_model

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def branches(rows: int, width: int) -> Tree:
    """The root, then `width` branches of (rows - 1) / width nodes each (the first ones a node longer)."""
    tokens, parents = [1], [-1]
    for b in range(width):
        parent = 0
        for _ in range((rows - 1) // width + (b < (rows - 1) % width)):
            tokens.append(100 + len(tokens))
            parents.append(parent)
            parent = len(tokens) - 1
    return Tree(tokens, parents)


def median_of(reps: int, clock, run) -> float:
    times = []
    for _ in range(reps):
        t0 = clock()
        run()
        times.append(clock() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--widths", default="2,4,8")
    ap.add_argument("--history", type=int, default=400)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=CLOCKS, default="cpu")
    args = ap.parse_args()
    clock, path = CLOCKS[args.clock], real_model("gemma-f16")
    widths = [int(w) for w in args.widths.split(",")]
    history = [2] + [1000 + i % 5000 for i in range(args.history - 1)]
    print(f"{machine(args.threads)}; Gemma 3 270M F16, {args.history}-token history, {args.threads} thread(s), "
          f"{args.clock} clock, median of {args.reps} (ms)\n")
    print("| rows | chain (eval) | chain as a tree | " + " | ".join(f"{w} leaves" for w in widths) + " |")
    print("|---:|---:|---:|" + "---:|" * len(widths))
    with Model(path, n_ctx=2048, n_threads=args.threads) as one, \
            ParallelModel(path, n_ctx=2048, n_threads=args.threads, n_seq_max=1 + max(widths),
                          kv_unified=True) as trees:
        one.eval(history, logits="none")
        trees.eval(history, logits="none")
        for rows in map(int, args.rows.split(",")):
            chain = list(range(100, 100 + rows))

            def plain():
                one.eval(chain, logits="all")
                one.rollback(len(history))

            def as_tree(tree):
                def run():
                    trees.eval_tree(tree)
                    trees.keep_path([0])
                    trees.rollback(len(history))
                return run

            cells = [median_of(args.reps, clock, plain),
                     median_of(args.reps, clock, as_tree(branches(rows, 1)))]
            cells += [median_of(args.reps, clock, as_tree(branches(rows, w))) if rows > w else float("nan")
                      for w in widths]
            print(f"| {rows} | " + " | ".join("-" if c != c else f"{1000 * c:.1f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
