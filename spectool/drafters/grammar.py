"""Drafting under a grammar: the tokens it forces first, then the drafter's own, up to the first one it rejects."""

from __future__ import annotations

from itertools import chain
from typing import Iterable, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.grammar import Constraint
from spectool.core.keys import GRAMMAR, Key
from spectool.core.keys import Source
from spectool.core.verify import Sampling
from spectool.drafters.base import EMPTY, Draft, Drafter, Estimate
from spectool.drafters.lookup import PromptLookup


class Constrained:
    """Any drafter (or none) under one generation's grammar. Each step's offer starts with the tokens the grammar
    forces from the history (its fast-forward tokens, under the key GRAMMAR: no drafting, and accepted unless the
    model spells the same text with other tokens), then the drafter's, peeked at after them; the draft is cut at
    the first token the grammar rejects, before verification. A draft model or MTP head draws from the grammar's
    masked rows (drafters/base.draw), so its q is what it drew from and rejection sampling stays exact."""

    def __init__(self, inner: Drafter | None, constraint: Constraint, forced: bool = True):
        self.inner, self.constraint, self.force = inner, constraint, forced
        self._forced: list[int] = []
        self._ahead: list[int] | None = None  # the history the inner drafter peeked at: the real one + forced

    def prefill(self, history: Sequence[int]) -> None:
        if self.inner is not None:
            self.inner.prefill(history)

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None) -> Iterable[Key]:
        ff = self.constraint.forced()[:k_max] if self.force else []
        self._forced, self._ahead = ff, None
        if ff and isinstance(self.inner, PromptLookup):  # lookup copying a text that goes on as the grammar
            first, _ = self.inner.lookup(history, 1)  # says: its draft, split into tokens as that text was
            if first and self.constraint.valid(first):
                self._ahead = history
                self._forced = []
                return self.inner.peek(history, k_max, estimate)
        keys = [GRAMMAR] * len(ff)
        if self.inner is None or len(ff) >= k_max:
            return keys
        self._ahead = ahead = [*history, *ff] if ff else history
        return chain(keys, self.inner.peek(ahead, k_max - len(ff), estimate, final=len(history)))

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft:
        ff = self._forced[:k]
        if k <= len(ff) or self._ahead is None:
            return Draft(ff, None, Source.grammar, forced=len(ff)) if ff else EMPTY
        c = self.constraint
        c.push(ff)
        try:
            d = self.inner.propose(self._ahead, k - len(ff), sampling, rng, c)
            n = c.valid(d.tokens)
        finally:
            c.pop(len(ff))
        tokens = ff + d.tokens[:n]
        if not tokens:
            return EMPTY
        q = None if d.q is None else [None] * len(ff) + d.q[:n]
        return Draft(tokens, q, d.source if n else Source.grammar, d.catch_up_seconds, forced=len(ff))
