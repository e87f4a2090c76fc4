"""Replays of lookup's drafting over the target's own greedy output at this machine's measured batch costs, and the
oracle that bounds them: what vs_llamacpp.py reports as the controller's share of its oracle, and what the replays
in research/ build on.

The oracle drafts from the same PromptLookup but knows in advance how many drafted tokens the target will accept (a
shortest path over the output): no controller choosing draft lengths over these drafts can beat it. Replayed costs
leave out Python time and machine noise, so compare ratios between policies replayed on the same costs.
"""

from __future__ import annotations

import time

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (spectool/llama/native.py)
import numpy as np  # noqa: E402

from spectool.core.audit import Audit
from spectool.core.controller import Controller
from spectool.core.costs import Costs
from spectool.drafters.lookup import PromptLookup
from spectool.generate.loop import GenerationConfig, speculative_generate


def accepted(draft, y, j) -> int:
    m = 0
    while m < len(draft) and j + m < len(y) and draft[m] == y[j + m]:
        m += 1
    return m


def batch_costs(target, prompt, sizes: int, reps: int = 5, clock=time.perf_counter,
                logits: str = "all") -> list[float]:
    """Median seconds to verify a batch of b tokens, b = 1..sizes (index 0 unused), by `clock` (time.process_time:
    CPU seconds, for one thread on a machine others keep busy); `logits`: "last" for the last row's only
    (research/row_cost.py: what the rows cost without the output layer's share)."""
    target.sync(prompt[:-1], logits="none")
    n, times = len(prompt) - 1, {b: [] for b in range(1, sizes + 1)}
    filler = (prompt * (sizes // len(prompt) + 1))[:sizes]
    for rep in range(reps + 1):
        for b in range(1, sizes + 1):
            t0 = clock()
            target.eval([prompt[-1], *filler[: b - 1]], logits=logits)
            if rep:  # the first round builds each graph
                times[b].append(clock() - t0)
            target.rollback(n)
    return [0.0] + [float(np.median(times[b])) for b in range(1, sizes + 1)]


def plain_output(target, prompt: list[int], tokens: int, grammar=None) -> list[int]:
    """The target's own greedy output after `prompt` (under `grammar`, without its forced drafts), decoded one
    token a step: what every replayed policy must reproduce."""
    g = GenerationConfig(target, None, max_tokens=tokens, grammar=grammar)
    return [t for s in speculative_generate(g, prompt) for t in s.tokens]


def cost_line(cost: list[float]) -> str:
    return "batch cost (ms): " + " ".join(f"{b}:{1000 * c:.1f}" for b, c in enumerate(cost) if b)


def verified(ctl: Controller, keys, draft: list[int], y, j: int, cost) -> tuple[int, float]:
    """One replayed step that drafted `draft` (under `keys`; None: not the controller's choice) at token j of the
    output y: how many of it the target accepts, and what verifying it costs, both told to the controller."""
    m, seconds = accepted(draft, y, j), cost[len(draft) + 1]
    ctl.observe_verify(len(draft) + 1, seconds)
    if draft and keys:
        ctl.observe_accept(keys, len(draft), m)
    return m, seconds


def ours(p, y, cost, k_max: int, costs: Costs, lookup: PromptLookup | None = None,
         ctl: Controller | None = None, temp: float = 0.0, step=None, audit: Audit | None = None) -> float:
    """spectool's lookup (`lookup`, a fresh one by default) under its controller (`ctl`: one of its own), its picks
    audited against fixed lengths as Loop audits greedy runs (core/audit.py; `audit`: that one) where the controller's
    `audit` is on. `temp`: y is a sample at that temperature, the keys at it as the loop's are (a deterministic draft
    is kept up to where the sample leaves it, so replaying it over y is exact in distribution, as core/audit.py says;
    the audit then runs as the loop does not: research/audit_sampled.py measured it). `step(ctl, offer, j, keys, m,
    n)`, where given, hears of each step: at token j, the offer, the keys drafted (none: the draft was not the
    offer's), m of them accepted, n tokens of y known now."""
    lookup, ctl, total, j = lookup or PromptLookup(), ctl or Controller(k_max=k_max, costs=costs), 0.0, 0
    audit = (audit or Audit()) if ctl.audit and ctl.adaptive and not ctl.k_min else None
    while j < len(y):
        h, limit = p + y[:j], len(y) - j - 1
        offer = lookup.peek(h, min(k_max, limit))
        keys = ctl.pick(offer, temp)
        theirs = None
        if audit is not None:
            k, theirs = audit.choose(len(keys), offer, limit, h)
            keys = [] if theirs is not None else [key.at(temp) for key in offer.keys[:k]]
        draft = theirs or (lookup.propose(h, len(keys), None, None).tokens if keys else [])
        m, seconds = verified(ctl, keys, draft, y, j, cost)
        total += seconds
        if step is not None:
            step(ctl, offer, j, keys if theirs is None else [], m, j + m + 1)
        j += m + 1
        if audit is not None:
            audit.judge(p + y[:j], cost)
    return total


def fixed(p, y, cost, k: int) -> float:
    """Seconds of a fixed policy over the same drafts: lookup's first k tokens (as many as it has) at every step."""
    lookup, total, j = PromptLookup(), 0.0, 0
    while j < len(y):
        draft = lookup.lookup(p + y[:j], min(k, len(y) - j - 1))[0]
        total += cost[len(draft) + 1]
        j += accepted(draft, y, j) + 1
    return total


def cheapest(reach: list[int], cost) -> float:
    """Seconds of the cheapest way through an output whose draft at token j would have its first reach[j] tokens
    accepted: at each step the oracle drafts k <= reach[j] of them, knowing which k pays best over the whole rest
    (a shortest path). No policy drafting those drafts, however it picks k, can be cheaper."""
    n = len(reach)
    best = [0.0] * (n + 1)  # best[j]: the cheapest way to produce y[j:]
    for j in range(n - 1, -1, -1):
        best[j] = min(cost[k + 1] + best[min(n, j + k + 1)] for k in range(reach[j] + 1))
    return best[0]


def oracle(p, y, cost, k_max: int) -> float:
    lookup = PromptLookup()
    return cheapest([accepted(lookup.lookup(p + y[:j], k_max)[0], y, j) for j in range(len(y))], cost)
