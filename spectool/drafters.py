"""Drafters propose the next few tokens; the target verifies them.

Protocol: `peek(history, k_max)` says cheaply whether and from where a draft of up to k_max tokens would come:
None, or (key, most tokens it can offer), the key naming what the controller keeps statistics under;
`propose(history, k, sampling, rng)` returns up to k tokens, with the drafter's probability rows q when it
samples (None means deterministic: q is one-hot on each drafted token).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from spectool.engine import Model
from spectool.verify import Sampling, probs, sample, top_probability


@dataclass
class Draft:
    tokens: list[int]
    q: list[np.ndarray] | None
    source: str  # "lookup" | "draft"
    catch_up_seconds: float = 0.0  # time a drafter spent catching up on tokens it missed while idle


EMPTY = Draft([], None, "none")


class Drafter(Protocol):
    def prefill(self, history: Sequence[int]) -> None: ...

    def peek(self, history: Sequence[int], k_max: int) -> tuple[str, int] | None: ...

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft: ...


class DraftModel:
    """A small model with its own KV cache, kept in step with the accepted tokens by `Model.sync`.

    `ids` is for a draft with a pruned vocabulary (see prune.py): its token i is the target's ids[i]; the
    target's other tokens reach it as its token 0 (a special token), and it proposes only tokens it has."""

    def __init__(self, model: Model, p_min: float = 0.0, ids: np.ndarray | None = None, n_target: int = 0):
        self.model = model
        self.p_min = p_min
        self.ids = ids
        if ids is not None:  # prune.py keeps ids 0-4, so the draft's token 0 is the target's token 0
            self.to_draft = np.zeros(max(n_target, int(ids.max()) + 1), dtype=np.int64)
            self.to_draft[ids] = np.arange(len(ids))
        self._seen: list[int] = []  # history in target ids ...
        self._mapped: list[int] = []  # ... and in draft ids

    def _map(self, history: Sequence[int]) -> list[int]:
        if self.ids is None:
            return list(history)
        n = len(self._seen)
        if n > len(history) or self._seen != list(history[:n]):
            self._seen, self._mapped, n = [], [], 0
        new = list(history[n:])
        self._seen += new
        self._mapped += self.to_draft[new].tolist() if new else []
        return list(self._mapped)

    def prefill(self, history: Sequence[int]) -> None:
        h = self._map(history)
        self.model.sync(h[:-1], logits="none") if len(h) > 1 else self.model.reset()

    def peek(self, history: Sequence[int], k_max: int = 16) -> tuple[str, int] | None:
        room = self.model.n_ctx - len(history)
        return ("draft", room) if room > 0 else None

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft:
        m = self.model
        room = m.n_ctx - len(history)
        k = min(k, room)
        if k <= 0:
            return EMPTY
        t0 = time.perf_counter()
        # usually 1-2 new tokens (the target's own, after the accepted drafts); many after steps without drafts
        caught_up = m.sync(self._map(history))
        catch_up = time.perf_counter() - t0 if caught_up > 2 else 0.0
        tokens: list[int] = []  # in the draft's own ids
        qs: list[np.ndarray] = []
        for i in range(k):
            logits = m.logits(-1)
            if sampling.greedy:
                if self.p_min > 0 and top_probability(logits) < self.p_min:
                    break
                t = int(np.argmax(logits))
            else:
                q = probs(logits, sampling)
                if self.p_min > 0 and q.max() < self.p_min:  # decided before the draw: keeps sampling exact
                    break
                t = sample(q, rng)
                qs.append(q)
            tokens.append(t)
            if i < k - 1:
                m.eval([t])
        if self.ids is not None:  # back to the target's ids; q spread over the target's vocabulary
            tokens = self.ids[tokens].tolist()
            qs = [self._widen(q) for q in qs]
        return Draft(tokens, None if sampling.greedy else qs, "draft", catch_up)

    def _widen(self, q: np.ndarray) -> np.ndarray:
        out = np.zeros(len(self.to_draft))
        out[self.ids] = q
        return out


class PromptLookup:
    """N-gram drafting from the prompt and the text so far.

    An incremental index maps every n-gram (n_min <= n <= n_max) to the tokens that followed it, with counts and
    the last position seen. A draft extends the current suffix one token at a time: the longest n-gram of the
    suffix that was seen before votes for its most frequent follower (ties: the most recent). Each token costs
    O(n_max) dictionary look-ups, whatever the history's length.
    """

    KEY_BUCKETS = (8, 4, 3, 2, 1)  # match lengths the controller keeps apart: 1, 2, 3, 4-7, 8 and more

    def __init__(self, n_min: int = 1, n_max: int = 12):
        if not 1 <= n_min <= n_max:
            raise ValueError("lookup n-gram sizes need 1 <= n_min <= n_max")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.follow: list[dict[tuple[int, ...], dict[int, list[int]]]] = [{} for _ in range(n_max + 1)]
        self._peeked: tuple[int, list[int]] | None = None

    def _index(self, history: Sequence[int]) -> None:
        n_old = len(self.tokens)
        if n_old > len(history) or (n_old and history[n_old - 1] != self.tokens[-1]):
            self.tokens, self.follow = [], [{} for _ in range(self.n_max + 1)]  # not an extension: rebuild
            n_old = 0
        toks = self.tokens
        for j in range(n_old, len(history)):
            t = history[j]
            toks.append(t)
            for n in range(self.n_min, min(self.n_max, j) + 1):
                f = self.follow[n].setdefault(tuple(toks[j - n : j]), {})
                c = f.get(t)
                if c is None:
                    f[t] = [1, j]
                else:
                    c[0] += 1
                    c[1] = j

    def _next(self, seq: list[int]) -> tuple[int, int, bool] | None:
        """(token, n-gram size, whether every follower seen agreed) the index predicts after `seq`, or None."""
        for n in range(min(self.n_max, len(seq)), self.n_min - 1, -1):
            f = self.follow[n].get(tuple(seq[-n:]))
            if f:
                return max(f.items(), key=lambda kv: kv[1])[0], n, len(f) == 1
        return None

    def lookup(self, history: Sequence[int], k: int) -> tuple[list[int], str | None]:
        """Up to k tokens predicted after `history`, and the controller key of the first (None: no match)."""
        self._index(history)
        seq = list(history[-self.n_max :])
        out: list[int] = []
        key = None
        for _ in range(k):
            nxt = self._next(seq)
            if nxt is None:
                break
            out.append(nxt[0])
            seq.append(nxt[0])
            key = key or self.key(nxt[1], nxt[2])
        return out, key

    @classmethod
    def key(cls, n: int, unanimous: bool) -> str:
        """"lookup:N" when the N-gram (bucketed) was always followed by the same token, "lookup:N?" when its
        followers disagreed: measured on Gemma 3 270M, the second kind is accepted 3 times less often."""
        return f"lookup:{next(b for b in cls.KEY_BUCKETS if n >= b)}" + ("" if unanimous else "?")

    def prefill(self, history: Sequence[int]) -> None:
        self._index(history)

    def peek(self, history: Sequence[int], k_max: int = 16) -> tuple[str, int] | None:
        tokens, key = self.lookup(history, k_max)
        self._peeked = (len(history), tokens)
        return (key, len(tokens)) if tokens else None

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft:
        if self._peeked is not None and self._peeked[0] == len(history) and len(self._peeked[1]) >= k:
            tokens = self._peeked[1][:k]
        else:
            tokens = self.lookup(history, k)[0]
        self._peeked = None
        return Draft(tokens, None, "lookup") if tokens else EMPTY


class Hybrid:
    """Prompt lookup first; the draft model where lookup finds nothing."""

    def __init__(self, lookup: PromptLookup, draft: DraftModel):
        self.lookup, self.draft = lookup, draft
        self._use_lookup = False

    def prefill(self, history: Sequence[int]) -> None:
        self.lookup.prefill(history)
        self.draft.prefill(history)

    def peek(self, history: Sequence[int], k_max: int = 16) -> tuple[str, int] | None:
        found = self.lookup.peek(history, k_max)
        self._use_lookup = found is not None
        return found or self.draft.peek(history, k_max)

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft:
        if self._use_lookup:
            return self.lookup.propose(history, k, sampling, rng)
        return self.draft.propose(history, k, sampling, rng)
