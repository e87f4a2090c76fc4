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
from spectool.verify import Dist, Sampling, distribution, greedy_token, top_probability


@dataclass
class Draft:
    tokens: list[int]
    q: list[Dist] | None  # the drafter's rows, on the target's vocabulary
    source: str  # "lookup" | "draft"
    catch_up_seconds: float = 0.0  # time a drafter spent catching up on tokens it missed while idle


EMPTY = Draft([], None, "none")


class Drafter(Protocol):
    def prefill(self, history: Sequence[int]) -> None: ...

    def peek(self, history: Sequence[int], k_max: int) -> tuple[str, int] | None: ...

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft: ...


@dataclass
class VocabMap:
    """Token ids between a draft's vocabulary and the target's, for drafts whose vocabulary is not the target's
    id for id: a pruned draft (see prune.py: its token i is the target's ids[i]) or a draft with a few tokens more
    or fewer (llama.cpp accepts sizes within 128). Draft tokens the target lacks are never proposed; target tokens
    the draft lacks reach it as its token 0 (a special token in both)."""

    to_target: np.ndarray  # draft id -> target id, -1 where the target has no such token
    to_draft: np.ndarray  # target id -> draft id (0 where the draft has no such token)
    banned: np.ndarray  # draft ids the target lacks

    @classmethod
    def between(cls, n_draft: int, n_target: int, ids: np.ndarray | None = None) -> VocabMap | None:
        """The map for a draft of `n_draft` tokens (`ids`: a pruned draft's kept target ids), or None when the
        two vocabularies are the same id for id."""
        if ids is None and n_draft == n_target:
            return None
        to_target = np.arange(n_draft, dtype=np.int64) if ids is None else np.asarray(ids, np.int64).copy()
        to_target[to_target >= n_target] = -1
        ok = np.flatnonzero(to_target >= 0)
        to_draft = np.zeros(n_target, np.int64)
        to_draft[to_target[ok]] = ok
        return cls(to_target, to_draft, np.flatnonzero(to_target < 0))


class DraftModel:
    """A small model with its own KV cache, kept in step with the accepted tokens by `Model.sync`. Its rows go
    through the same sampler chain as the target's, penalties included, so q is the distribution each draft was
    drawn from, on the target's vocabulary (see VocabMap for drafts with another one)."""

    def __init__(self, model: Model, p_min: float = 0.0, ids: np.ndarray | None = None, n_target: int = 0):
        self.model = model
        self.p_min = p_min
        self.n_target = n_target or model.n_vocab
        self.map = VocabMap.between(model.n_vocab, self.n_target, ids)
        self._seen: list[int] = []  # history in target ids ...
        self._mapped: list[int] = []  # ... and in draft ids

    def _map(self, history: Sequence[int]) -> list[int]:
        if self.map is None:
            return list(history)
        n = len(self._seen)
        if n > len(history) or self._seen != list(history[:n]):
            self._seen, self._mapped, n = [], [], 0
        new = list(history[n:])
        self._seen += new
        self._mapped += self.map.to_draft[new].tolist() if new else []
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
        mapped = self._map(history)
        caught_up = m.sync(mapped)
        catch_up = time.perf_counter() - t0 if caught_up > 2 else 0.0
        banned = self.map.banned if self.map is not None and len(self.map.banned) else None
        recent = mapped[-sampling.window:] if sampling.window else []
        tokens: list[int] = []  # in the draft's own ids
        qs: list[Dist] = []
        for i in range(k):
            logits = m.logits(-1)
            if sampling.greedy:
                if self.p_min > 0 and top_probability(logits) < self.p_min:
                    break
                t = greedy_token(logits, sampling, recent + tokens, banned)
            else:
                q = distribution(logits, sampling, recent + tokens, banned)
                if self.p_min > 0 and q.p.max() < self.p_min:  # decided before the draw: keeps sampling exact
                    break
                t = q.sample(rng)
                qs.append(q)
            tokens.append(t)
            if i < k - 1:
                m.eval([t])
        if self.map is not None:  # back to the target's ids
            tokens = self.map.to_target[tokens].tolist()
            qs = [self._on_target(q) for q in qs]
        return Draft(tokens, None if sampling.greedy else qs, "draft", catch_up)

    def _on_target(self, q: Dist) -> Dist:
        ids = self.map.to_target[q.ids]
        order = np.argsort(ids)
        return Dist(ids[order], q.p[order], self.n_target)


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
