"""Prompt lookup while its evidence holds, then a draft model (of the target's vocabulary or through
text) or MTP head for the rest of a step."""

from __future__ import annotations

from typing import Sequence


from spectool.core.grammar import Constraint
from spectool.core.evidence import Evidence
from spectool.core.evidence import Source
from spectool.core.verify import Random, Sampling
from spectool.core.protocol import EMPTY, Branch, Draft, Drafter, Estimate, no_grammar
from spectool.drafters.draft_model import DraftModel
from spectool.drafters.lookup import PromptLookup
from spectool.drafters.mtp import Mtp
from spectool.drafters.text import TextDraft


class Hybrid(Drafter):
    """Prompt lookup while its evidence holds, the draft model (or the target's MTP head) for the
    rest of the step: lookup's tokens are offered up to the first one worth less than a draft-model
    token (Controller.worth: acceptance less what drafting costs), and the draft model continues
    from there (from the start where lookup finds nothing)."""

    def __init__(self, lookup: PromptLookup, draft: DraftModel | Mtp | TextDraft):
        self.lookup, self.draft = lookup, draft
        self._n_lookup = 0

    def start(self, history: Sequence[int], constraint: Constraint | None = None) -> None:
        no_grammar(constraint)
        self.lookup.start(history)
        self.draft.start(history)

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> list[Evidence]:
        keys = list(self.lookup.peek(history, k_max, final=final))
        model = self.draft.peek(history, k_max)
        bar = {key: estimate(key) for key in set(model)} if estimate is not None else {}
        j = 0
        while j < len(keys) and j < len(model) and (estimate is None
                                                    or estimate(keys[j]) >= bar[model[j]]):
            j += 1
        self._n_lookup = j
        return keys[:j] + model[j:]

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: Random,
                constraint: Constraint | None = None) -> Draft:
        j = min(k, self._n_lookup)
        head = self.lookup.propose(history, j, sampling, rng) if j else EMPTY
        if constraint is not None and head.tokens:  # cut at the first token the grammar rejects
            n = constraint.valid(head.tokens)
            if n < len(head.tokens):
                return Draft(head.tokens[:n], None, head.source) if n else EMPTY
        if k <= len(head.tokens):
            return head
        if constraint is not None:
            constraint.push(head.tokens)
        try:
            tail = self.draft.propose([*history, *head.tokens], k - len(head.tokens), sampling, rng,
                                      constraint)
        finally:
            if constraint is not None:
                constraint.pop(len(head.tokens))
        if not head.tokens:
            return tail
        q = None if tail.q is None else [*[None] * len(head.tokens), *tail.q]
        return Draft(head.tokens + tail.tokens, q, Source.hybrid, tail.catch_up_seconds)

    def branches(self, history: Sequence[int], chain: Sequence[int], width: int) -> list[Branch]:
        """Lookup's other followers at every depth of the chain just proposed, and beside the draft
        model's part of it, its runner-ups (DraftModel.branches): each source's, which the
        controller weighs as that source's shares turned out (Controller.branch)."""
        return [*self.lookup.branches(history, chain, width),
                *self.draft.branches(history, chain, width)]
