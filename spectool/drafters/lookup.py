"""Prompt lookup: n-gram drafting from the prompt and the text so far."""

from __future__ import annotations

from itertools import islice
from typing import Iterator, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.keys import AGREED, MOSTLY, SPLIT, Key, bucket
from spectool.core.keys import Source
from spectool.core.verify import Sampling
from spectool.drafters.base import EMPTY, Draft, Estimate


class NGramIndex:
    """Every n-gram (n_min <= n <= n_max) of a token sequence -> the tokens that followed it, with counts, in the
    order of their last occurrence; kept up to date as the sequence grows. A prediction costs O(n_max)
    dictionary look-ups, whatever the sequence's length."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []  # the sequence indexed
        # An n-gram is a string of n characters, chr(token) each (token ids are far below 0x110000): sliced,
        # hashed and compared in one piece, and not tracked by the garbage collector as a tuple would be.
        self._follow: dict[str, dict[int, int]] = {}
        self._n_first = n_max  # the first match of the last prediction: the next one's first guess

    def extend(self, history: Sequence[int], end: int | None = None) -> None:
        """Index `history` (its first `end` tokens): the tokens past those indexed, or all of it anew where it does
        not extend them."""
        n_old, end = len(self.tokens), len(history) if end is None else end
        if n_old > end or (n_old and history[n_old - 1] != self.tokens[-1]):
            self.tokens, self._follow, n_old = [], {}, 0
        toks, follow, n_min, n_max = self.tokens, self._follow, self.n_min, self.n_max
        tail = "".join(map(chr, toks[-n_max:]))  # the n-grams before the next token are the ends of this
        for t in history[n_old:end]:
            m = len(tail)
            for n in range(n_min, m + 1):
                gram = tail[m - n :]
                f = follow.get(gram)
                if f is None:
                    follow[gram] = {t: 1}
                else:  # counted, and moved last: a follower's order is that of its last occurrence
                    f[t] = f.pop(t, 0) + 1
            toks.append(t)
            tail = tail[1 - n_max :] + chr(t) if n_max > 1 else chr(t)

    def predict(self, context: Sequence[int]) -> Iterator[tuple[int, int, int, int]]:
        """What follows `context`, token after token, each predicted token taken as the next one's context:
        (token, n, its count, the count of every follower) for the longest n-gram ending the context that was
        seen before, voting for its most frequent follower (ties: the last seen). Ends only where no n-gram was
        seen: take as many as needed.

        The longest match is searched from a guess, up or down: an n-gram seen (followed by something) means each
        of its suffixes was seen, and one not seen means no longer one was. The guess is one more than the last
        match (right at the first look-up along a copied stretch), first the last prediction's first match."""
        follow, n_min, n_max = self._follow, self.n_min, self.n_max
        seq = "".join(map(chr, context[-n_max:]))
        guess, first = self._n_first, True
        while True:
            top = min(n_max, len(seq))
            n = max(n_min, min(guess, top))
            f = follow.get(seq[-n:])
            if f:
                while n < top and (longer := follow.get(seq[-n - 1 :])):
                    n, f = n + 1, longer
            else:
                while not f:
                    n -= 1
                    if n < n_min:
                        return
                    f = follow.get(seq[-n:])
            if first:
                self._n_first, first = n, False
            if len(f) == 1:  # the usual case: one follower
                ((t, c),) = f.items()
                yield t, n, c, c
            else:
                t = max(reversed(f), key=f.__getitem__)  # the most frequent; of those, the last seen
                yield t, n, f[t], sum(f.values())
            seq += chr(t)
            guess = n + 1


class LookupOffer:
    """What PromptLookup.peek offers: iterated, the key of each predicted token, predicted as it is drawn (the
    controller draws only while a longer draft could pay); `take(k)` the first k tokens, however many keys were
    drawn before."""

    __slots__ = ("history", "n_history", "tokens", "_keys")

    def __init__(self, lookup: PromptLookup, history: Sequence[int], k_max: int, final: int | None = None):
        self.history, self.n_history = history, len(history)
        self.tokens: list[int] = []  # the tokens behind the keys drawn so far
        self._keys = lookup._keys(history, k_max, self.tokens, final)

    def __iter__(self) -> Iterator[Key]:
        return self._keys

    def take(self, k: int) -> list[int]:
        """The first k tokens on offer (fewer where the prediction ends)."""
        if len(self.tokens) < k:
            for _ in islice(self._keys, k - len(self.tokens)):
                pass  # drawing a key predicts its token
        return self.tokens[:k]

    def is_for(self, history: Sequence[int]) -> bool:
        return history is self.history and len(history) == self.n_history


class PromptLookup:
    """N-gram drafting from the prompt and the text so far (NGramIndex): a draft extends the current suffix one
    token at a time by the followers of its longest n-gram seen before."""

    STRETCH_MAX = 16  # continuations further along a stretch share one key

    def __init__(self, n_min: int = 1, n_max: int = 12):
        if not 1 <= n_min <= n_max:
            raise ValueError("lookup n-gram sizes need 1 <= n_min <= n_max")
        self.index = NGramIndex(n_min, n_max)
        self._offer: LookupOffer | None = None  # the last peek's, until propose drafts from it

    def _keys(self, history: Sequence[int], k: int, tokens: list[int], final: int | None = None) -> Iterator[Key]:
        """For LookupOffer: the controller keys of up to k tokens predicted after `history`, lazily, each key's
        token appended to the offer's `tokens` as the key is yielded.

        A draft copies a stretch of the history: its first token comes from an n-gram match, and each next one
        usually from the same match one token longer, which by then includes drafted tokens and so proves nothing
        new. Such a continuation is keyed by where its stretch began and how far along it is ("lookup:2+3": the
        third token after a 2-gram start), so the controller learns how stretches wear out. A token whose own
        evidence breaks the stretch (a shorter match: the copied text went another way before; or followers that
        disagreed) starts a new one under its own key (`key`). Only the first `final` tokens of the history are
        indexed (the rest, a grammar's forced tokens, may yet be rejected)."""
        self.index.extend(history, final)
        yield from self._predicted(history, k, tokens)

    def _predicted(self, history: Sequence[int], k: int, tokens: list[int]) -> Iterator[Key]:
        """`_keys` on the index as it is."""
        n_max = self.index.n_max
        key, prev_n = None, 0
        for t, n, count, total in islice(self.index.predict(history), k):
            if key is not None and count == total and n == min(prev_n + 1, n_max):
                if key.pos < self.STRETCH_MAX:
                    key = key.next
            else:
                key = self.key(n, count, total)
            tokens.append(t)
            prev_n = n
            yield key

    def lookup_instead(self, history: Sequence[int], last: int, k: int) -> tuple[list[int], list[Key]]:
        """Up to k tokens predicted after `history` (indexed already) with its last token taken as `last` instead,
        and their keys."""
        tokens: list[int] = []
        keys = list(self._predicted([*history[:-1], last], k, tokens))
        return tokens, keys

    def lookup(self, history: Sequence[int], k: int, final: int | None = None) -> tuple[list[int], list[Key]]:
        """Up to k tokens predicted after `history`, and the controller key of each (see `_keys`)."""
        offer = LookupOffer(self, history, k, final)
        keys = list(offer)
        return offer.tokens, keys

    @staticmethod
    def key(n: int, count: int, total: int) -> Key:
        """The evidence class of a predicted token: an n-gram match (its length bucketed) that was always followed
        by this token (AGREED, "lookup:N"), followed by others too but mostly by this one (MOSTLY, "lookup:N~"),
        or not mostly (SPLIT, "lookup:N?"). See Controller.priors for how often each is accepted."""
        agreement = AGREED if count == total else MOSTLY if 2 * count > total else SPLIT
        return Key.lookup(bucket(n), agreement)

    def prefill(self, history: Sequence[int]) -> None:
        self.index.extend(history)

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> LookupOffer:
        self._offer = LookupOffer(self, history, k_max, final)
        return self._offer

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator,
                constraint=None) -> Draft:
        """The first k tokens of the last peek's offer, where it was for this history; else predicted afresh. A
        grammar (`constraint`) cuts them afterwards (drafters/grammar.py): predicting them asks nothing of it."""
        offer, self._offer = self._offer, None
        if offer is None or not offer.is_for(history):
            offer = LookupOffer(self, history, k)
        tokens = offer.take(k)
        return Draft(tokens, None, Source.lookup) if tokens else EMPTY
