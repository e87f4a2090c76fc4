"""The target's own MTP (NextN) head as the drafter."""

from __future__ import annotations

import time
from typing import Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.keys import MTP, Key
from spectool.core.keys import Source
from spectool.core.verify import Sampling
from spectool.drafters.base import EMPTY, Draft, Estimate, draw


class Mtp:
    """The target's own MTP (NextN) head as the drafter (engine.MtpContext, which mirrors the target's decodes
    into the head's context as they happen), and a draft chains the head from the last position
    whose hidden state the target computed, through any tokens after it (a hybrid's lookup tokens), then on its
    own outputs, as llama.cpp's draft-mtp does. Its rows go through the target's sampler chain, so q is the
    distribution each draft was drawn from."""

    def __init__(self, head, p_min: float = 0.0):
        self.head, self.p_min = head, p_min

    def prefill(self, history: Sequence[int]) -> None:
        self.head.catch_up()  # the target's prefill reached the head through on_decode, unless it came earlier

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None) -> list[Key]:
        return [MTP] * max(0, min(k_max, self.head.n_ctx - len(history)))

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft:
        head, n = self.head, len(history)
        k = min(k, head.n_ctx - n)
        q0 = min(n - 2, len(head.target.tokens) - 1)  # the last position whose hidden state the target made
        h = head.h.get(q0)
        if k <= 0 or h is None:
            return EMPTY
        t0 = time.perf_counter()
        for pos in range(q0 + 1, n - 1):  # tokens the target has not seen yet (lookup's, in a hybrid draft)
            h = head.step(history[pos], pos, h)
        catch_up = time.perf_counter() - t0 if n - 1 - (q0 + 1) > 2 else 0.0
        h = head.step(history[-1], n - 1, h)  # the first draft's row

        def advance(token: int, i: int) -> None:  # draft i at position n + i, on the head's own hidden state
            nonlocal h
            h = head.step(token, n + i, h)

        recent = list(history[-sampling.window:]) if sampling.window else []
        tokens, qs = draw(head, 0, k, advance, sampling, rng, recent, self.p_min)
        return Draft(tokens, None if sampling.greedy else qs, Source.mtp, catch_up) if tokens else EMPTY
