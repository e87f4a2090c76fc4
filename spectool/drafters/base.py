"""Drafters propose the next few tokens; the target verifies them.

Protocol, once a step: `peek(history, k_max, estimate)` offers up to k_max tokens cheaply, as one key per token
(keys.py: the evidence the controller keeps acceptance statistics under), possibly lazily (prompt lookup predicts
a token only when the controller draws its key); the controller picks how many to draft (Controller.pick); then
`propose(history, k, sampling, rng)`, with the history peeked at, drafts the first k tokens of that offer. A draft
holds the drafter's probability rows q when it samples (None, or None for a token, means deterministic: q is
one-hot on that token). Under a grammar (drafters/grammar.py) the history peeked at may end with tokens the grammar
forces that are not final yet (`final`: how many of it are), and `propose` gets the grammar's state (`constraint`):
a drafter that draws from rows draws from the grammar's masked rows, so that q stays what it drew from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.keys import Key
from spectool.core.keys import Source
from spectool.core.grammar import Constraint, NothingAllowed, dist_under, token_under
from spectool.core.verify import Dist, Sampling, dist_at, token_at, top_probability


@dataclass
class Draft:
    tokens: list[int]
    q: list[Dist | None] | None  # the drafter's rows, on the target's vocabulary (None: one-hot)
    source: Source
    catch_up_seconds: float = 0.0  # time a drafter spent catching up on tokens it missed while idle
    forced: int = 0  # of the tokens, this many were forced by a grammar (Source.grammar; the rest: source's)


EMPTY = Draft([], None, Source.none)


Estimate = Callable[[Key], float]  # key -> what the controller thinks a token drafted under it is worth


class Drafter(Protocol):
    def prefill(self, history: Sequence[int]) -> None: ...

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> Iterable[Key]: ...

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator,
                constraint: Constraint | None = None) -> Draft: ...


def draw(model, row: int, k: int, advance: Callable[[int, int], None], sampling: Sampling, rng: np.random.Generator,
         recent: list[int], p_min: float = 0.0, banned=None, constraint: Constraint | None = None,
         to_target: np.ndarray | None = None) -> tuple[list[int], list[Dist]]:
    """Up to k draft tokens, one at a time from output `row` of `model`'s last decode, through the target's sampler
    chain (`recent`: the history its penalties see; `banned`: ids never drawn): its token at temperature 0, else a
    sample of its distribution, which is kept (q). `advance(token, i)` feeds token i to the drafter before the
    next is read. A draft stops before a token whose most likely candidate is below `p_min`: decided before the
    draw, which keeps sampling exact. Under a grammar (`constraint`, in the target's ids: `to_target` maps the
    model's) each row is masked first, and the grammar state is back where it was when the draft is made."""
    tokens: list[int] = []
    qs: list[Dist] = []
    try:
        for i in range(k):
            if sampling.greedy:
                if p_min > 0 and top_probability(model.logits(row)) < p_min:
                    break
                t = token_at(model, row, sampling, recent + tokens, banned) if constraint is None else \
                    token_under(model, row, sampling, recent + tokens, constraint, to_target, banned)
            else:
                q = dist_at(model, row, sampling, recent + tokens, banned) if constraint is None else \
                    dist_under(model, row, sampling, recent + tokens, constraint, to_target, banned)
                if p_min > 0 and q.p.max() < p_min:
                    break
                t = q.sample(rng)
                qs.append(q)
            if constraint is not None and not constraint.push([t if to_target is None else int(to_target[t])]):
                del qs[len(tokens):]  # a token the grammar refused (it cannot happen): the draft ends before it
                break
            tokens.append(t)
            if i < k - 1:
                advance(t, i)
    except NothingAllowed:
        pass  # the draft ends where the grammar does
    finally:
        if constraint is not None:
            constraint.pop(len(tokens))
    return tokens, qs
