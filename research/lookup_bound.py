"""How far prompt lookup can go on each set, its tuning list and unseen samples: replays drafting policies over the
target's own greedy output, with this machine's measured batch costs.

    python research/lookup_bound.py [--prompts 8] [--tokens 96] [--samples 3] [--seed N]

It decodes each prompt plainly once (the output every policy must reproduce), measures what verifying a batch
of 1..k_max+1 tokens costs, then charges each policy that cost per step, without running the model again:
- llama-cpp-python's LlamaPromptLookupDecoding (the earliest match of the last 2-gram or 1-gram, 10 tokens),
  through its own drafting function;
- spectool's PromptLookup with its adaptive Controller (learning costs and acceptance as it goes);
- an oracle that drafts from the same PromptLookup but knows in advance how many drafted tokens the target will
  accept (a shortest path over the output): no controller can beat it with these drafts;
- llama-lookup's drafting (common/ngram-cache.cpp ported: `llama_lookup_steps`, checked against the tool in
  research/test_lab.py), 8 tokens a step as benchmarks/vs_llamacpp.py runs it.
Replayed costs leave out Python time and machine noise, so compare the ratios, not the tokens/s.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from spectool_lab import common
from spectool_lab.common import models

from spectool.llama import engine  # llama.cpp's libraries before numpy: spectool/llama/native.py
from spectool.core.costs import Costs
from spectool.core.ngram_cache import NgramCache
import numpy as np
from spectool_lab.replay import (accepted, batch_costs, cheapest, cost_line, oracle,  # noqa: F401
                                 ours, plain_output, verified)  # handed on
from spectool.options import CTX_SIZE


THEIR_DRAFT = 10  # llama-cpp-python's lookup drafts this many tokens a step, whatever --k-max says


def theirs(p, y, cost) -> float:
    """llama-cpp-python's own drafting function, as Llama.generate calls it: one batch per step."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft_of = LlamaPromptLookupDecoding(num_pred_tokens=THEIR_DRAFT)
    total, j = 0.0, 0
    while j < len(y):
        draft = draft_of(np.array(p + y[:j], dtype=np.intc)).tolist()
        total += cost[len(draft) + 1]
        j += accepted(draft, y, j) + 1
    return total


def llama_lookup_steps(p, y, n_draft: int = 8) -> list[tuple[int, int]]:
    """llama-lookup's steps over output y of prompt p (examples/lookup, no static or dynamic cache file), as
    (tokens drafted, tokens accepted): spectool's NgramCache (common_ngram_cache_draft ported), each step's draft
    up to `n_draft` tokens."""
    cache = NgramCache(n_draft)
    seq, steps, j = list(p) + y[:1], [(0, 0)], 1
    while j < len(y):
        draft = cache.draft(seq)
        m = accepted(draft, y, j)
        steps.append((len(draft), m))
        seq += y[j:j + m + 1]
        j += m + 1
    return steps


def llama_lookup(p, y, cost, n_draft: int = 8) -> float:
    """Seconds of llama-lookup's drafting over output y of prompt p, replayed at `cost`."""
    return sum(cost[d + 1] for d, _ in llama_lookup_steps(p, y, n_draft))


def replayed(data, cost, k_max: int) -> list[tuple[str, float]]:
    """Seconds of each policy over `data` (prompt, output pairs), replayed at `cost`."""
    n, shared = sum(len(y) for _, y in data), Costs()
    return [("plain", n * cost[1]), ("llama-cpp-python lookup", sum(theirs(p, y, cost) for p, y in data)),
            ("spectool lookup", sum(ours(p, y, cost, k_max, shared) for p, y in data)),
            ("oracle (knows what is accepted)", sum(oracle(p, y, cost, k_max) for p, y in data)),
            ("llama-lookup (8)", sum(llama_lookup(p, y, cost) for p, y in data))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=3, help="unseen samples a set, beside its tuning list")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--save", type=Path, help="write the prompts, outputs and batch costs replayed here (JSON)")
    args = ap.parse_args()
    engine.set_verbose(False)
    seed = common.fresh_seed(args.seed)
    print(f"{common.machine(args.threads)}; unseen samples drawn with --seed {seed}")
    print("\n| set | sample | plain | llama-cpp-python lookup | spectool lookup | oracle | llama-lookup (ported) |"
          " controller / oracle |\n|---|---|---:|---:|---:|---:|---:|---:|")
    with engine.Model(models()["F16"], n_ctx=CTX_SIZE, n_threads=args.threads) as target:
        cost: list[float] = []
        saved: dict = {}
        for name in common.SETS:
            for sample, texts in common.samples(name, args.prompts, seed, args.samples).items():
                data = []
                for text in texts:
                    p = target.tokenize(text)
                    data.append((p, plain_output(target, p, args.tokens)))
                cost = cost or batch_costs(target, data[0][0], max(args.k_max, THEIR_DRAFT) + 1)
                saved[f"{name} / {sample}"] = data
                rows = replayed(data, cost, args.k_max)
                base = rows[1][1]
                cells = " | ".join(f"{base / seconds:.2f}x" for _, seconds in rows)
                print(f"| {name} | {sample} | {cells} | {rows[3][1] / rows[2][1]:.0%} |", flush=True)
    print("\n(speeds relative to llama-cpp-python's lookup, replayed) " + cost_line(cost))
    if args.save:
        args.save.write_text(json.dumps({"seed": seed, "cost": cost, "data": saved}))


if __name__ == "__main__":
    main()
