"""Drafters propose the next few tokens; the target verifies them.

Protocol: `peek(history, k_max)` says cheaply what a draft of up to k_max tokens would offer: one key per token
on offer (none: nothing to offer), each naming the evidence the controller keeps acceptance statistics under
(keys.py: the draft model's, or for prompt lookup the match behind that token, see PromptLookup.key); the controller then picks how
many to draft. `propose(history, k, sampling, rng)` returns up to k tokens, with the drafter's probability rows q
when it samples (None, or None for a token, means deterministic: q is one-hot on that token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.keys import Key
from spectool.core.keys import Source
from spectool.core.verify import Dist, Sampling


@dataclass
class Draft:
    tokens: list[int]
    q: list[Dist | None] | None  # the drafter's rows, on the target's vocabulary (None: one-hot)
    source: Source  # lookup | draft | hybrid (lookup, then the draft model) | none
    catch_up_seconds: float = 0.0  # time a drafter spent catching up on tokens it missed while idle


EMPTY = Draft([], None, Source.none)


Estimate = Callable[[Key], float]  # key -> what the controller thinks a token drafted under it is worth


class Drafter(Protocol):
    def prefill(self, history: Sequence[int]) -> None: ...

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None) -> Iterable[Key]: ...

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft: ...
