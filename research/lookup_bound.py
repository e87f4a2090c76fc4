"""How far prompt lookup can go on the code-editing set: replays drafting policies over the target's own greedy
output, with this machine's measured batch costs.

    python research/lookup_bound.py [--prompts 8] [--tokens 128]

It decodes each prompt plainly once (the output every policy must reproduce), measures what verifying a batch
of 1..k_max+1 tokens costs, then charges each policy that cost per step, without running the model again:
- llama-cpp-python's LlamaPromptLookupDecoding (the earliest match of the last 2-gram or 1-gram, 10 tokens),
  through its own drafting function;
- spectool's PromptLookup with its adaptive Controller (learning costs and acceptance as it goes);
- an oracle that drafts from the same PromptLookup but knows in advance how many drafted tokens the target will
  accept (a shortest path over the output): no controller can beat it with these drafts.
Replayed costs leave out Python time and machine noise, so compare the ratios, not the tokens/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "benchmarks"))
sys.path.insert(0, str(HERE.parent))

import common  # noqa: E402
from common import models  # noqa: E402

from spectool.llama import engine  # noqa: E402 (llama.cpp's libraries before numpy: spectool/llama/native.py)
from spectool.core.costs import Costs  # noqa: E402
from spectool.core.controller import Controller  # noqa: E402
import numpy as np  # noqa: E402
from spectool.drafters.lookup import PromptLookup  # noqa: E402
from spectool.generate.loop import GenerationConfig, speculative_generate  # noqa: E402
from spectool.options import CTX_SIZE  # noqa: E402


def accepted(draft, y, j) -> int:
    m = 0
    while m < len(draft) and j + m < len(y) and draft[m] == y[j + m]:
        m += 1
    return m


def batch_costs(target, prompt, sizes: int, reps: int = 5) -> list[float]:
    """Median seconds to verify a batch of b tokens, b = 1..sizes (index 0 unused)."""
    target.sync(prompt[:-1], logits="none")
    n, times = len(prompt) - 1, {b: [] for b in range(1, sizes + 1)}
    filler = (prompt * (sizes // len(prompt) + 1))[:sizes]
    for rep in range(reps + 1):
        for b in range(1, sizes + 1):
            t0 = time.perf_counter()
            target.eval([prompt[-1], *filler[: b - 1]], logits="all")
            if rep:  # the first round builds each graph
                times[b].append(time.perf_counter() - t0)
            target.rollback(n)
    return [0.0] + [float(np.median(times[b])) for b in range(1, sizes + 1)]


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


def ours(p, y, cost, k_max: int, costs: Costs, lookup: PromptLookup | None = None,
         ctl: Controller | None = None) -> float:
    """spectool's lookup (`lookup`, a fresh one by default) under its controller (`ctl`: one of its own)."""
    lookup, ctl, total, j = lookup or PromptLookup(), ctl or Controller(k_max=k_max, costs=costs), 0.0, 0
    while j < len(y):
        h = p + y[:j]
        keys = ctl.pick(lookup.peek(h, min(k_max, len(y) - j - 1)))
        draft = lookup.propose(h, len(keys), None, None).tokens if keys else []
        m, seconds = verified(ctl, keys, draft, y, j, cost)
        total += seconds
        j += m + 1
    return total


def verified(ctl: Controller, keys, draft: list[int], y, j: int, cost) -> tuple[int, float]:
    """One replayed step that drafted `draft` (under `keys`; None: not the controller's choice) at token j of the
    output y: how many of it the target accepts, and what verifying it costs, both told to the controller."""
    m, seconds = accepted(draft, y, j), cost[len(draft) + 1]
    ctl.observe_verify(len(draft) + 1, seconds)
    if draft and keys:
        ctl.observe_accept(keys, len(draft), m)
    return m, seconds


def oracle(p, y, cost, k_max: int) -> float:
    lookup = PromptLookup()
    return cheapest([accepted(lookup.lookup(p + y[:j], k_max)[0], y, j) for j in range(len(y))], cost)


def plain_output(target, prompt: list[int], tokens: int, grammar=None) -> list[int]:
    """The target's own greedy output after `prompt` (under `grammar`, without its forced drafts), decoded one
    token a step: what every replayed policy must reproduce."""
    g = GenerationConfig(target, None, max_tokens=tokens, grammar=grammar)
    return [t for s in speculative_generate(g, prompt) for t in s.tokens]


def cost_line(cost: list[float]) -> str:
    return "batch cost (ms): " + " ".join(f"{b}:{1000 * c:.1f}" for b, c in enumerate(cost) if b)


def cheapest(reach: list[int], cost) -> float:
    """Seconds of the cheapest way through an output whose draft at token j would have its first reach[j] tokens
    accepted: at each step the oracle drafts k <= reach[j] of them, knowing which k pays best over the whole rest
    (a shortest path). No policy drafting those drafts, however it picks k, can be cheaper."""
    n = len(reach)
    best = [0.0] * (n + 1)  # best[j]: the cheapest way to produce y[j:]
    for j in range(n - 1, -1, -1):
        best[j] = min(cost[k + 1] + best[min(n, j + k + 1)] for k in range(reach[j] + 1))
    return best[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine.set_verbose(False)
    with engine.Model(models()["F16"], n_ctx=CTX_SIZE, n_threads=args.threads) as target:
        data = []
        for text in common.humaneval_prompts(args.prompts):
            p = target.tokenize(text)
            data.append((p, plain_output(target, p, args.tokens)))
        cost = batch_costs(target, data[0][0], max(args.k_max, THEIR_DRAFT) + 1)
    print(cost_line(cost))
    n = sum(len(y) for _, y in data)
    shared = Costs()
    rows = [("plain", n * cost[1]), ("llama-cpp-python lookup", sum(theirs(p, y, cost) for p, y in data)),
            ("spectool lookup", sum(ours(p, y, cost, args.k_max, shared) for p, y in data)),
            ("oracle (knows what is accepted)", sum(oracle(p, y, cost, args.k_max) for p, y in data))]
    base = rows[1][1]
    print("\n| policy, replayed | tok/s | vs llama-cpp-python |\n|---|---:|---:|")
    for name, seconds in rows:
        print(f"| {name} | {n / seconds:.1f} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    main()
