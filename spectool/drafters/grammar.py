"""Drafting under a grammar: the tokens it forces first, then the drafter's own, up to the first one
it rejects."""

from __future__ import annotations

from itertools import chain
from typing import Iterable, Sequence


from spectool.core.grammar import Constraint
from spectool.core.evidence import GRAMMAR, Evidence
from spectool.core.evidence import Source
from spectool.core.verify import Random, Sampling
from spectool.core.protocol import EMPTY, Branch, Draft, Drafter, Estimate
from spectool.drafters.lookup import PromptLookup


class GrammarDrafter(Drafter):
    """Any drafter (or none) under one generation's grammar. Prompt lookup and the grammar take
    turns: lookup's tokens up to the first one the grammar rejects, the tokens it forces from there
    (its fast-forward tokens, under the key GRAMMAR: no drafting, and accepted unless the model
    spells the same text with other tokens), lookup again after them, and so on. Another drafter's
    offer starts with the forced tokens, then its own, peeked at after them and cut at the first
    token the grammar rejects. A draft model or MTP head draws from the grammar's masked rows
    (drafters/draw.py), so its q is what it drew from and rejection sampling stays exact."""

    def __init__(self, inner: Drafter | None, constraint: Constraint, forced: bool = True):
        self.inner, self.constraint, self.force = inner, constraint, forced
        # the tokens offered ahead of the inner drafter's: (token, forced)
        self._taken: list[tuple[int, bool]] = []
        # lookup's and the grammar's keys of them, in turn (their sources)
        self._keys: list[Evidence] = []
        # the history the inner drafter peeked at: the real one + forced
        self._ahead: Sequence[int] | None = None
        # whether the last draft holds the inner drafter's tokens (lookup's turns, or its own after
        # the forced ones): its siblings are offered beside it
        self._inner_drafted = False

    def start(self, history: Sequence[int], constraint: Constraint | None = None) -> None:
        """(It drafts under its own grammar state: `constraint` is the same one, or None.)"""
        if self.inner is not None:
            self.inner.start(history)

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> Iterable[Evidence]:
        self._taken = []
        if isinstance(self.inner, PromptLookup):
            self._ahead = None
            return self._lookup_and_forced(self.inner, history, k_max)
        ff = self.constraint.forced()[:k_max] if self.force else []
        self._taken, self._ahead = [(t, True) for t in ff], None
        keys = [GRAMMAR] * len(ff)
        if self.inner is None or len(ff) >= k_max:
            return keys
        self._ahead = ahead = [*history, *ff] if ff else history
        return chain(keys, self.inner.peek(ahead, k_max - len(ff), estimate, final=len(history)))

    def _lookup_and_forced(self, lookup: PromptLookup, history: Sequence[int],
                           k_max: int) -> list[Evidence]:
        """Prompt lookup and the grammar in turn, up to k_max tokens (see the class). Lookup goes
        first where its next token fits: it splits a text into tokens as that text was split before.
        In JSON a value copied from the prompt ends where the prompt's text goes on otherwise, the
        grammar forces the next key's name, and lookup copies the punctuation around it as the
        output wrote it so far. A string's first word follows its quote, not the space it had in the
        text: where lookup finds nothing after the history's last token, it looks again as if that
        token had its space (" max" for "max": the tokenizer's twin, Vocabulary.spaced)."""
        c, taken, keys = self.constraint, self._taken, []
        try:
            while len(taken) < k_max and not (taken and taken[-1][0] in c.eog):
                room = k_max - len(taken)
                ahead = [*history, *(t for t, _ in taken)] if taken else history
                tokens, new_keys = lookup.lookup(ahead, room, final=len(history))
                n = c.valid(tokens)
                if not n and not taken and history[-1] in c.vocabulary.spaced:
                    tokens, new_keys = lookup.lookup_instead(history,
                                                             c.vocabulary.spaced[history[-1]], room)
                    n = c.valid(tokens)
                if n:
                    tokens, new_keys = tokens[:n], new_keys[:n]
                else:
                    tokens = c.forced()[:room] if self.force else []
                    new_keys = [GRAMMAR] * len(tokens)
                if not tokens:
                    break
                c.push(tokens)
                taken += ((t, not n) for t in tokens)
                keys += new_keys
        finally:
            c.pop(len(taken))
        self._keys = keys
        return keys

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: Random,
                constraint: Constraint | None = None) -> Draft:
        taken = self._taken[:k]
        forced = sum(f for _, f in taken)
        self._inner_drafted = isinstance(self.inner, PromptLookup)
        if k <= len(taken) or self._ahead is None or self.inner is None:
            tokens = [t for t, _ in taken]
            # lookup in earlier requests' text
            corpus = any(key.source is Source.corpus for key in self._keys[:k])
            source = (
                Source.grammar
                if forced == len(tokens)
                else Source.corpus
                if corpus
                else Source.lookup
            )
            return Draft(tokens, None, source, forced=forced) if tokens else EMPTY
        ff = [t for t, _ in taken]
        c = self.constraint
        c.push(ff)
        try:
            d = self.inner.propose(self._ahead, k - len(ff), sampling, rng, c)
            self._inner_drafted = True
            n = c.valid(d.tokens)
        finally:
            c.pop(len(ff))
        tokens = ff + d.tokens[:n]
        if not tokens:
            return EMPTY
        q = None if d.q is None else [*[None] * len(ff), *d.q[:n]]
        return Draft(tokens, q, d.source if n else Source.grammar, d.catch_up_seconds,
                     forced=forced)

    def branches(self, history: Sequence[int], chain: Sequence[int], width: int) -> list[Branch]:
        """The inner drafter's siblings beside the chain just proposed, where it drafted some of it,
        each where the grammar takes it after the chain before it: a draft tree under the grammar.
        The tokens the grammar forces are a trunk, free to draft (beside them it takes only other
        spellings of the same text); lookup, which takes turns with them, offers its siblings at any
        depth, a draft model beside its own tokens after them, a prediction along the chain."""
        if self.inner is None or not self._inner_drafted:
            return []
        offered = self.inner.branches(history, chain, width)
        c, out, at = self.constraint, [], 0
        try:
            for b in sorted(offered, key=lambda b: b.depth):  # (stable: the likeliest first)
                c.push(chain[at : b.depth])
                at = b.depth
                out += [b] if c.allows(b.token) else []
        finally:
            c.pop(at)
        return out
