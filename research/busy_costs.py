"""A cost table that a busy minute poisoned, against a quiet one: does prompt lookup recover its speed by itself?

    python research/busy_costs.py                 # about 10 minutes on 2 cores
    python research/busy_costs.py --factor 8 --passes 3 --prompts 8

Gemma 3 270M F16, greedy, prompt lookup (`--spec lookup`, the default draft length), 8 code-editing prompts
(HumanEval) and 8 free-form questions (ShareGPT), 128 new tokens. Every prompt is a run of its own: its cost table
is written out and read back between prompts (controller.Costs.to_json / from_json), as between two
`spectool run`s. The quiet table is what one pass over the set learnt on a fresh table, on a quiet machine. The
poisoned table is that table with the batches of 2 to 9 tokens priced `--factor` times higher, as a busy minute
leaves them. Then, pass by pass and prompt by prompt, both tables run the same prompt, alternating, each learning
as it goes; the table prints the poisoned table's tok/s over the quiet one's per pass. Issue 30's bar: at least
0.95x by the third pass.

Nothing else should run meanwhile. The script reads tables written by older versions of controller.Costs too, so
an older checkout can run it (copy it there) for a comparison on the same machine.
"""

from __future__ import annotations

import argparse

from spectool_lab import common
from spectool_lab.common import models
from spectool_lab.helpers import one_run, poison  # noqa: F401 - the tests' cost-table fixtures

from spectool import bench
from spectool.llama import engine
from spectool.options import CTX_SIZE


def alternate(target, tables: dict[str, dict | None], prompts: list[list[int]], tokens: int) -> dict[str, bench.Result]:
    """Every prompt a run on each table in turn (`tables` updated as they learn): each table's totals."""
    totals = {k: bench.Result(k) for k in tables}
    for prompt in prompts:
        for k in tables:
            tables[k], _ = one_run(target, tables[k], prompt, tokens, totals[k])
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--factor", type=float, default=8.0, help="how much dearer the poisoned sizes are")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine.set_verbose(False)
    path = models()["F16"]
    sets = {"code editing (HumanEval)": common.humaneval_prompts(args.prompts),
            "free-form (ShareGPT)": common.freeform_prompts(args.prompts)}
    print(f"{path.name}, prompt lookup, {args.prompts} prompts a set, {args.tokens} tokens a prompt; batches of 2-9 "
          f"poisoned {args.factor:g}x\n")
    print("| set | pass | quiet tok/s | poisoned tok/s | ratio | tokens/step quiet | poisoned |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    with engine.Model(path, n_ctx=CTX_SIZE, n_threads=args.threads) as target:
        for name, texts in sets.items():
            prompts = [target.tokenize(t) for t in texts]
            quiet = None
            for prompt in prompts:  # the quiet table: one pass on a fresh table
                quiet, _ = one_run(target, quiet, prompt, args.tokens)
            tables = {"quiet": quiet, "poisoned": poison(quiet, args.factor, range(2, 10))}
            for n in range(1, args.passes + 1):
                totals = alternate(target, tables, prompts, args.tokens)
                q, p = totals["quiet"], totals["poisoned"]
                print(f"| {name} | {n} | {q.tokens_per_second:.1f} | {p.tokens_per_second:.1f} | "
                      f"{p.tokens_per_second / q.tokens_per_second:.2f}x | {q.mean_accepted_length:.1f} | "
                      f"{p.mean_accepted_length:.1f} |", flush=True)


if __name__ == "__main__":
    main()
