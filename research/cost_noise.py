"""What moves spectool lookup's figure between identical runs (issue 57, item 3): the same prompt decoded N times,
greedy, each time on a fresh cost table (calibrated anew, as each repeat of benchmarks/vs_llamacpp.py starts), and on
copies of one table calibrated and measured over --warm runs of the same prompt, as a user's saved table is: "warm"
goes on measuring; "frozen" takes no measurement. Interleaved. (The settled tables of
research/notes/2026-12-06-settled-prices.md, --settle, were measured at commit 38d12f4 and not kept.)

    python research/cost_noise.py [--models smollm2] [--families raw,instruction] [--prompts 2] [--runs 5] [--seed N]
                                  [--warm 4]

The text is the same every time (greedy), and lookup's drafts are a deterministic function of it, so two runs that
draft alike took the same steps. Prints per prompt, for each table: the decode time's mean and range over the runs
(prompt processing excluded, as the benchmark times it), the drafted and accepted tokens' range, and how many distinct
step sequences the runs took. Where the frozen table takes one sequence and its time barely moves while fresh tables
take several, the spread is the cost table's measurement noise steering the controller's choices; the warm table
says whether a table that has measured runs is still steered by what it goes on measuring.
"""

from __future__ import annotations

import argparse
import copy
import time

from spectool_lab import common, formats

from spectool.bench import Contender
from spectool.core.costs import Costs
from spectool.core.stats import Stats
from spectool.generate.loop import speculative_generate
from spectool.llama import engine
from spectool.options import DRAFT_MAX, Mode


def decode(target, prompt: list[int], tokens: int, costs: Costs) -> tuple[float, int, int, tuple]:
    """(seconds of decoding, drafted, accepted, the steps as (drafted, accepted) pairs)."""
    st = Stats(mode=Mode.lookup)
    g = Contender("lookup", Mode.lookup, DRAFT_MAX).generation(target, {}, tokens, costs)
    t0 = time.perf_counter()
    steps = tuple((s.drafted, s.accepted) for s in speculative_generate(g, prompt, st))
    return time.perf_counter() - t0 - st.prompt_seconds, st.n_drafted, st.n_accepted, steps


def frozen(table: Costs) -> Costs:
    """A copy of `table` that takes no measurement: its prices stay what they were."""
    out = copy.deepcopy(table)
    out.observe_verify = lambda *a: None  # type: ignore[method-assign]
    out.observe_draft = lambda *a: None  # type: ignore[method-assign]
    return out


def spread(values: list[float]) -> str:
    mean = sum(values) / len(values)
    return f"{1e3 * mean:.0f} ms ({100 * (max(values) - min(values)) / mean:.1f}%)"


def options(doc: str, families: str, each: str, warm: bool = False) -> tuple[argparse.Namespace, int]:
    """A probe's options (SmolLM2, `families`, 2 prompts, --runs 5) and its seed, printed with the machine; llama.cpp
    quiet. `each`: what the runs are counted per ("table")."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    formats.family_options(ap, families=families)
    ap.set_defaults(models="smollm2", prompts=2)
    ap.add_argument("--runs", type=int, default=5)
    if warm:
        ap.add_argument("--warm", type=int, default=1, help="runs of the prompt that measure the warm table first")
    args = ap.parse_args()
    seed = common.fresh_seed(args.seed)
    engine.set_verbose(False)
    print(f"seed {seed}, greedy, {args.tokens} tokens at most, {args.runs} runs a {each}; {common.machine(2)}\n")
    return args, seed


def main() -> None:
    args, seed = options(__doc__, "raw,instruction", "table", warm=True)
    print("| model | family | prompt | table | decode time (range over mean) | drafted | accepted | step sequences |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for name, target, fam, prompts in formats.each_family(args, seed):
        for i, prompt in enumerate(prompts):
            base = Costs()
            for _ in range(args.warm):  # calibrated, then measured over --warm runs
                decode(target, prompt, args.tokens, base)
            tables = {"fresh": Costs, "warm": lambda: copy.deepcopy(base), "frozen": lambda: frozen(base)}
            runs: dict[str, list] = {table: [] for table in tables}
            for _ in range(args.runs):
                for table, made in tables.items():
                    runs[table].append(decode(target, prompt, args.tokens, made()))
            for table, rs in runs.items():
                seconds, drafted, accepted, steps = zip(*rs)
                print(f"| {name} | {fam} | {i + 1} | {table} | {spread(list(seconds))} | "
                      f"{min(drafted)}-{max(drafted)} | {min(accepted)}-{max(accepted)} | {len(set(steps))} |",
                      flush=True)


if __name__ == "__main__":
    main()
