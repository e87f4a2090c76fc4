"""Drafters propose the next few tokens; the target verifies them.

Protocol, once a step: `peek(history, k_max, estimate)` offers up to k_max tokens cheaply, as one key per token
(keys.py: the evidence the controller keeps acceptance statistics under), possibly lazily (prompt lookup predicts
a token only when the controller draws its key); the controller picks how many to draft (Controller.pick); then
`propose(history, k, sampling, rng)`, with the history peeked at, drafts the first k tokens of that offer. A draft
holds the drafter's probability rows q when it samples (None, or None for a token, means deterministic: q is
one-hot on that token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.keys import Key
from spectool.core.keys import Source
from spectool.core.verify import Dist, Sampling, dist_at, token_at, top_probability


@dataclass
class Draft:
    tokens: list[int]
    q: list[Dist | None] | None  # the drafter's rows, on the target's vocabulary (None: one-hot)
    source: Source
    catch_up_seconds: float = 0.0  # time a drafter spent catching up on tokens it missed while idle


EMPTY = Draft([], None, Source.none)


Estimate = Callable[[Key], float]  # key -> what the controller thinks a token drafted under it is worth


class Drafter(Protocol):
    def prefill(self, history: Sequence[int]) -> None: ...

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None) -> Iterable[Key]: ...

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft: ...


def draw(model, row: int, k: int, advance: Callable[[int, int], None], sampling: Sampling, rng: np.random.Generator,
         recent: list[int], p_min: float = 0.0, banned=None) -> tuple[list[int], list[Dist]]:
    """Up to k draft tokens, one at a time from output `row` of `model`'s last decode, through the target's sampler
    chain (`recent`: the history its penalties see; `banned`: ids never drawn): its token at temperature 0, else a
    sample of its distribution, which is kept (q). `advance(token, i)` feeds token i to the drafter before the
    next is read. A draft stops before a token whose most likely candidate is below `p_min`: decided before the
    draw, which keeps sampling exact."""
    tokens: list[int] = []
    qs: list[Dist] = []
    for i in range(k):
        if sampling.greedy:
            if p_min > 0 and top_probability(model.logits(row)) < p_min:
                break
            t = token_at(model, row, sampling, recent + tokens, banned)
        else:
            q = dist_at(model, row, sampling, recent + tokens, banned)
            if p_min > 0 and q.p.max() < p_min:
                break
            t = q.sample(rng)
            qs.append(q)
        tokens.append(t)
        if i < k - 1:
            advance(t, i)
    return tokens, qs
