"""Drafters propose the next few tokens; the target verifies them.

Protocol: `peek(history, k_max)` says cheaply what a draft of up to k_max tokens would offer: one key per token
on offer (none: nothing to offer), each naming the evidence the controller keeps acceptance statistics under
(keys.py: the draft model's, or for prompt lookup the match behind that token, see PromptLookup.key); the controller then picks how
many to draft. `propose(history, k, sampling, rng)` returns up to k tokens, with the drafter's probability rows q
when it samples (None, or None for a token, means deterministic: q is one-hot on that token).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol, Sequence

from spectool import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.engine import Model
from spectool.keys import AGREED, DRAFT, MOSTLY, MTP, SPLIT, Key
from spectool.options import Spec
from spectool.verify import Dist, Sampling, backend_chain, dist_at, token_at, top_probability


@dataclass
class Draft:
    tokens: list[int]
    q: list[Dist | None] | None  # the drafter's rows, on the target's vocabulary (None: one-hot)
    source: Spec  # lookup | draft | hybrid (lookup, then the draft model) | none
    catch_up_seconds: float = 0.0  # time a drafter spent catching up on tokens it missed while idle


EMPTY = Draft([], None, Spec.none)


Estimate = Callable[[Key], float]  # key -> what the controller thinks a token drafted under it is worth


class Drafter(Protocol):
    def prefill(self, history: Sequence[int]) -> None: ...

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None) -> Iterable[Key]: ...

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

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None) -> list[Key]:
        return [DRAFT] * max(0, min(k_max, self.model.n_ctx - len(history)))

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft:
        m = self.model
        room = m.n_ctx - len(history)
        k = min(k, room)
        if k <= 0:
            return EMPTY
        t0 = time.perf_counter()
        banned = self.map.banned if self.map is not None and len(self.map.banned) else None
        # llama.cpp samples in the graph, but p_min at temperature 0 needs the whole row's softmax
        on_graph = None if sampling.greedy and self.p_min > 0 else backend_chain(sampling, banned)
        # usually 1-2 new tokens (the target's own, after the accepted drafts); many after steps without drafts
        mapped = self._map(history)
        caught_up = m.sync(mapped, sample=on_graph)
        catch_up = time.perf_counter() - t0 if caught_up > 2 else 0.0
        recent = mapped[-sampling.window:] if sampling.window else []
        tokens: list[int] = []  # in the draft's own ids
        qs: list[Dist] = []
        for i in range(k):
            if sampling.greedy:
                if self.p_min > 0 and top_probability(m.logits(-1)) < self.p_min:
                    break
                t = token_at(m, -1, sampling, recent + tokens, banned)
            else:
                q = dist_at(m, -1, sampling, recent + tokens, banned)
                if self.p_min > 0 and q.p.max() < self.p_min:  # decided before the draw: keeps sampling exact
                    break
                t = q.sample(rng)
                qs.append(q)
            tokens.append(t)
            if i < k - 1:
                m.eval([t], sample=on_graph)
        if self.map is not None:  # back to the target's ids
            tokens = self.map.to_target[tokens].tolist()
            qs = [self._on_target(q) for q in qs]
        return Draft(tokens, None if sampling.greedy else qs, Spec.draft, catch_up)

    def _on_target(self, q: Dist) -> Dist:
        ids = self.map.to_target[q.ids]
        order = np.argsort(ids)
        return Dist(ids[order], q.p[order], self.n_target)


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
        recent = list(history[-sampling.window:]) if sampling.window else []
        tokens: list[int] = []
        qs: list[Dist] = []
        token = history[-1]
        for i in range(k):
            h = head.step(token, n - 1 + i, h)
            if sampling.greedy:
                if self.p_min > 0 and top_probability(head.logits(0)) < self.p_min:
                    break
                token = token_at(head, 0, sampling, recent + tokens)
            else:
                q = dist_at(head, 0, sampling, recent + tokens)
                if self.p_min > 0 and q.p.max() < self.p_min:  # decided before the draw: keeps sampling exact
                    break
                token = q.sample(rng)
                qs.append(q)
            tokens.append(token)
        catch_up = time.perf_counter() - t0 if n - 1 - (q0 + 1) > 2 else 0.0
        return Draft(tokens, None if sampling.greedy else qs, Spec.mtp, catch_up) if tokens else EMPTY


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
        return Draft(tokens, None, Spec.lookup) if tokens else EMPTY


class Hybrid:
    """Prompt lookup while its evidence holds, the draft model (or the target's MTP head) for the rest of the step:
    lookup's tokens are offered up to the first one worth less than a draft-model token (Controller.worth:
    acceptance less what drafting costs), and the draft model continues from there (from the start where lookup
    finds nothing)."""

    def __init__(self, lookup: PromptLookup, draft: DraftModel | Mtp):
        self.lookup, self.draft = lookup, draft
        self._n_lookup = 0

    def prefill(self, history: Sequence[int]) -> None:
        self.lookup.prefill(history)
        self.draft.prefill(history)

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None) -> list[Key]:
        keys = list(self.lookup.peek(history, k_max))
        model = self.draft.peek(history, k_max)
        bar = {key: estimate(key) for key in set(model)} if estimate is not None else {}
        j = 0
        while j < len(keys) and j < len(model) and (estimate is None or estimate(keys[j]) >= bar[model[j]]):
            j += 1
        self._n_lookup = j
        return keys[:j] + model[j:]

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Draft:
        j = min(k, self._n_lookup)
        head = self.lookup.propose(history, j, sampling, rng) if j else EMPTY
        if k <= len(head.tokens):
            return head
        tail = self.draft.propose([*history, *head.tokens], k - len(head.tokens), sampling, rng)
        if not head.tokens:
            return tail
        q = None if tail.q is None else [None] * len(head.tokens) + tail.q
        return Draft(head.tokens + tail.tokens, q, Spec.hybrid, tail.catch_up_seconds)
