"""The draw loop a draft model and an MTP head share: draft tokens one at a time from a model's
rows, through the target's sampler chain, under a grammar where there is one."""

from __future__ import annotations

from typing import Callable

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.grammar import Constraint, NothingAllowed, dist_under, mask_for, token_under
from spectool.core.verify import (Dist, Random, Sampling, dist_at, likeliest, token_at,
                                  top_probability)


def draw(model, row: int, k: int, advance: Callable[[int, int], None], sampling: Sampling,
         rng: Random,
         recent: list[int], p_min: float = 0.0, banned=None, constraint: Constraint | None = None,
         to_target: np.ndarray | None = None, width: int = 0) -> tuple[list[int], list[Dist]]:
    """Up to k draft tokens, one at a time from output `row` of `model`'s last decode, through the
    target's sampler chain (`recent`: the history its penalties see; `banned`: ids never drawn): its
    token at temperature 0 (`width`: with the softmax of its `width` likeliest tokens, kept), else
    a sample of its distribution, which is kept (q). `advance(token, i)` feeds token i to the
    drafter before the next is read. A draft stops before a token whose
    most likely candidate is below `p_min`: decided before the draw, which keeps sampling exact.
    Under a grammar (`constraint`, in the target's ids: `to_target` maps the model's) each row is
    masked first, and the grammar state is back where it was when the draft is made."""
    tokens: list[int] = []
    qs: list[Dist] = []
    try:
        for i in range(k):
            if sampling.greedy:
                if p_min > 0 and top_probability(model.logits(row)) < p_min:
                    break
                t, runner_ups = _greedy(model, row, sampling, recent + tokens, banned, constraint,
                                        to_target, width)
                qs += [runner_ups] if runner_ups is not None else []
            else:
                if constraint is None:
                    q = dist_at(model, row, sampling, recent + tokens, banned)
                else:
                    q = dist_under(model, row, sampling, recent + tokens, constraint, to_target,
                                   banned)
                if p_min > 0 and q.p.max() < p_min:
                    break
                t = q.sample(rng)
                qs.append(q)
            if constraint is not None and not constraint.push([t if to_target is None
                                                               else int(to_target[t])]):
                # a token the grammar refused (it cannot happen): the draft ends before it
                del qs[len(tokens):]
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


def _greedy(model, row: int, sampling: Sampling, recent: list[int], banned,
            constraint: Constraint | None, to_target: np.ndarray | None,
            width: int) -> tuple[int, Dist | None]:
    """The row's token at temperature 0 and, with `width`, the softmax of its `width` likeliest (a
    draft tree's runner-ups), under the grammar where there is one."""
    if constraint is None:
        t = token_at(model, row, sampling, recent, banned)
    else:
        t = token_under(model, row, sampling, recent, constraint, to_target, banned)
    if not width:
        return t, None
    mask = banned if constraint is None else mask_for(constraint, to_target, banned)
    return t, likeliest(model, row, width, sampling, recent, mask)
