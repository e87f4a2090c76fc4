"""A step of the speculative loop under way: what the drafter offered before the controller's pick
(Offered), and what was drafted, verified and accepted (Plan); generate/loop.py makes them, for one
sequence or for each of a batch's (generate/batch.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from spectool.core.evidence import Evidence
from spectool.core.protocol import Branch, Draft
from spectool.core.verify import TokenLogprob
from spectool.llama.parallel import Tree


@dataclass(slots=True)
class Offered:
    """A step's offer before the controller's pick: the drafter's keys (lazy), the most the step
    may draft, and when planning began."""

    keys: Iterable[Evidence]
    limit: int
    t0: float


@dataclass(slots=True)
class Plan:
    """One step under way: the drafts the controller chose (their keys, the draft, what choosing
    and drafting took), then what the target's rows made of them (accept): how many drafts hold,
    the target's own next token (-1: the grammar admits none) and, where asked, their logprobs."""

    keys: list[Evidence]
    draft: Draft
    draft_seconds: float
    drawn: int = 0  # the tokens the drafter drew (the draft may end before: Loop.ended)
    n_acc: int = 0
    token: int = -1
    logprobs: list[TokenLogprob] | None = None
    logprob_seconds: float = 0.0
    # a draft tree: the chain `draft`, then its siblings (Controller.branch: `branches`; the tree
    # is set where there are any), and the accepted path's nodes (the root first)
    tree: Tree | None = None
    branches: list[Branch] = field(default_factory=list)
    path: list[int] | None = None

    @property
    def rows(self) -> int:
        """The rows the target's pass decodes for it."""
        return len(self.draft.tokens) + 1 + self.siblings

    @property
    def siblings(self) -> int:
        """The rows of its draft tree beside the chain (0: a chain)."""
        return len(self.branches)

    @property
    def chain_keys(self) -> list[Evidence]:
        """The keys of the tokens drafted (the controller may have picked more than were)."""
        return self.keys[: len(self.draft.tokens)]

    @property
    def accepted_tokens(self) -> list[int]:
        """The drafted tokens accepted."""
        if self.tree is None or self.path is None:
            return self.draft.tokens[: self.n_acc]
        return [self.tree.tokens[i] for i in self.path[1:]]

    @property
    def taken(self) -> Branch | None:
        """The sibling the accepted path went through, if any (a tree's path leaves the chain at
        most once, where the chain was refused)."""
        if self.path is None or self.chain_acc == self.n_acc:
            return None
        return self.branches[self.path[self.chain_acc + 1] - len(self.draft.tokens) - 1]

    @property
    def chain_acc(self) -> int:
        """How far along the chain `draft` the accepted path went (a tree's may then take a
        sibling)."""
        if self.path is None:
            return self.n_acc
        return sum(i <= len(self.draft.tokens) for i in self.path[1:])
