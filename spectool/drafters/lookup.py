"""Prompt lookup: n-gram drafting from the prompt and the text so far."""

from __future__ import annotations

from typing import Iterator, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.keys import AGREED, MOSTLY, SPLIT, Key
from spectool.core.keys import Source
from spectool.core.verify import Sampling
from spectool.drafters.base import EMPTY, Draft, Estimate


class PromptLookup:
    """N-gram drafting from the prompt and the text so far.

    An incremental index maps every n-gram (n_min <= n <= n_max) to the tokens that followed it, with counts, in
    the order of their last occurrence. A draft extends the current suffix one token at a time: the longest n-gram
    of the suffix that was seen before votes for its most frequent follower (ties: the most recent). Each token
    costs O(n_max) dictionary look-ups, whatever the history's length.
    """

    KEY_BUCKETS = (8, 4, 3, 2, 1)  # match lengths the controller keeps apart: 1, 2, 3, 4-7, 8 and more
    STRETCH_MAX = 16  # continuations further along a stretch share one key

    def __init__(self, n_min: int = 1, n_max: int = 12):
        if not 1 <= n_min <= n_max:
            raise ValueError("lookup n-gram sizes need 1 <= n_min <= n_max")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        # every n-gram seen (n_min <= n <= n_max) -> the tokens that followed it -> how often, in the order of their
        # last occurrence. An n-gram is written as a string of n characters, chr(token) each (token ids are far
        # below 0x110000): a string is sliced, hashed and compared in one piece, and the garbage collector does not
        # track it, where it would track a tuple (a step's new n-grams would set off a collection every few steps)
        self.follow: dict[str, dict[int, int]] = {}
        self._peeked: tuple[int, list[int]] | None = None
        self._n_first = n_max  # how long the first match of the last prediction was (see _next)

    def _index(self, history: Sequence[int]) -> None:
        n_old = len(self.tokens)
        if n_old > len(history) or (n_old and history[n_old - 1] != self.tokens[-1]):
            self.tokens, self.follow = [], {}  # not an extension: rebuild
            n_old = 0
        toks, follow, n_min, n_max = self.tokens, self.follow, self.n_min, self.n_max
        tail = "".join(map(chr, toks[-n_max:]))  # the n-grams before the next token are the ends of this
        for t in history[n_old:]:
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

    def _next(self, seq: str, n_guess: int) -> tuple[int, int, int, int] | None:
        """(token, n-gram size, its count, the count of every follower) the index predicts after `seq` (tokens as
        characters, see `follow`), or None.

        The longest n-gram ending `seq` that was seen before is searched from `n_guess` up or down: an n-gram seen
        (followed by something) means each of its suffixes was seen, and one not seen means no longer one was. In
        a stretch the guess (one more than the last match) is right at the first look-up."""
        follow, top = self.follow, min(self.n_max, len(seq))
        n = max(self.n_min, min(n_guess, top))
        f = follow.get(seq[-n:])
        if f:
            while n < top and (longer := follow.get(seq[-n - 1 :])):
                n, f = n + 1, longer
        else:
            while not f:
                n -= 1
                if n < self.n_min:
                    return None
                f = follow.get(seq[-n:])
        if len(f) == 1:  # the usual case: one follower
            ((t, c),) = f.items()
            return t, n, c, c
        t = max(reversed(f), key=f.__getitem__)  # the most frequent; of those, the last seen
        return t, n, f[t], sum(f.values())

    def predict(self, history: Sequence[int], k: int, tokens: list[int]) -> Iterator[Key]:
        """The controller keys of up to k tokens predicted after `history`, one at a time (lazily); each token is
        appended to `tokens` as its key is yielded.

        A draft copies a stretch of the history: its first token comes from an n-gram match, and each next one
        usually from the same match one token longer, which by then includes drafted tokens and so proves nothing
        new. Such a continuation is keyed by where its stretch began and how far along it is ("lookup:2+3": the
        third token after a 2-gram start), so the controller learns how stretches wear out. A token whose own
        evidence breaks the stretch (a shorter match: the copied text went another way before; or followers that
        disagreed) starts a new one under its own key (`key`)."""
        self._index(history)
        seq = "".join(map(chr, history[-self.n_max :]))
        key, prev_n = None, 0
        for _ in range(k):
            nxt = self._next(seq, prev_n + 1 if key is not None else self._n_first)
            if nxt is None:
                return
            t, n, count, total = nxt
            if key is None:
                self._n_first = n  # the next step's first guess
            if key is not None and count == total and n == min(prev_n + 1, self.n_max):
                if key.pos < self.STRETCH_MAX:
                    key = key.next
            else:
                key = self.key(n, count, total)
            seq += chr(t)
            tokens.append(t)
            prev_n = n
            yield key

    def lookup(self, history: Sequence[int], k: int) -> tuple[list[int], list[Key]]:
        """Up to k tokens predicted after `history`, and the controller key of each (see `predict`)."""
        tokens: list[int] = []
        return tokens, list(self.predict(history, k, tokens))

    @classmethod
    def key(cls, n: int, count: int, total: int) -> Key:
        """The evidence class of a predicted token: an N-gram match (N bucketed) that was always followed by this
        token (AGREED, "lookup:N"), followed by others too but mostly by this one (MOSTLY, "lookup:N~"), or not
        mostly (SPLIT, "lookup:N?"). See Controller.priors for how often each is accepted."""
        agreement = AGREED if count == total else MOSTLY if 2 * count > total else SPLIT
        return Key.lookup(next(b for b in cls.KEY_BUCKETS if n >= b), agreement)

    def prefill(self, history: Sequence[int]) -> None:
        self._index(history)

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None) -> Iterator[Key]:
        """Lazily: the controller asks for tokens only while a longer draft could still pay (Controller.pick)."""
        tokens: list[int] = []
        self._peeked = (len(history), tokens)
        return self.predict(history, k_max, tokens)

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft:
        if self._peeked is not None and self._peeked[0] == len(history) and len(self._peeked[1]) >= k:
            tokens = self._peeked[1][:k]
        else:
            tokens = self.lookup(history, k)[0]
        self._peeked = None
        return Draft(tokens, None, Source.lookup) if tokens else EMPTY
