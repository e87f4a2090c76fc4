"""What a decode asks for and hands back: which tokens of a batch produce an output (`Logits`), and
what each output is (`Output`): a whole logits row read on the host, or what llama.cpp sampled
inside its graph, the argmax's id or the k best candidates (Model.sample_on_backend)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

# the outputs of a batch: none, its final token's, every token's
Logits = Literal["none", "last", "all"]


class Kind(enum.Enum):
    ROWS = "rows"  # whole logits rows: Model.logits(i)
    # the argmax's id, picked in the graph: Model.sampled_tokens(), Model.sampled_token(i)
    IDS = "ids"
    TOP_K = "top-k"  # the k best ids with their logits, picked in the graph: Model.candidates(i)


@dataclass(frozen=True)
class Output:
    """What one output of a decode is: ROWS, IDS or Output.top_k(k), one object each, so that the
    hot path can test `output is IDS` (reading `Kind.IDS` costs an enum lookup in Python 3.11); `k`
    is TOP_K's."""

    kind: Kind
    k: int = 0

    @staticmethod
    @lru_cache(maxsize=None)
    def top_k(k: int) -> Output:
        """The k best candidates (one object per k, so that a decode asking again is seen as the
        same ask)."""
        if k < 1:
            raise ValueError(f"top-k needs k >= 1, not {k}")
        return Output(Kind.TOP_K, k)

    def canonical(self) -> Output:
        """The one object equal to this one (ROWS, IDS or Output.top_k(k))."""
        return ROWS if self == ROWS else IDS if self == IDS else Output.top_k(self.k)

    def __str__(self) -> str:
        return f"top-{self.k}" if self.kind is Kind.TOP_K else self.kind.value


ROWS = Output(Kind.ROWS)
IDS = Output(Kind.IDS)
