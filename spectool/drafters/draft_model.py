"""A small draft model with its own KV cache, on the target's vocabulary or mapped onto it
(VocabMap)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.llama.engine import Model
from spectool.llama.outputs import IDS, ROWS, Output
from spectool.core.grammar import Constraint
from spectool.core.evidence import DRAFT, Evidence
from spectool.core.evidence import Source
from spectool.core.verify import Dist, Random, Sampling, backend_chain
from spectool.core.protocol import EMPTY, WIDTH, Branch, Draft, Drafter, Estimate, no_grammar
from spectool.drafters.draw import draw


@dataclass
class VocabMap:
    """Token ids between a draft's vocabulary and the target's, for drafts whose vocabulary is not
    the target's id for id: a pruned draft (see prune.py: its token i is the target's ids[i]) or a
    draft with a few tokens more or fewer (llama.cpp accepts sizes within 128). Draft tokens the
    target lacks are never proposed; target tokens the draft lacks reach it as its token 0 (a
    special token in both)."""

    to_target: np.ndarray  # draft id -> target id, -1 where the target has no such token
    to_draft: np.ndarray  # target id -> draft id (0 where the draft has no such token)
    banned: np.ndarray  # draft ids the target lacks

    @classmethod
    def between(cls, n_draft: int, n_target: int, ids: np.ndarray | None = None) -> VocabMap | None:
        """The map for a draft of `n_draft` tokens (`ids`: a pruned draft's kept target ids), or
        None when the two vocabularies are the same id for id."""
        if ids is None and n_draft == n_target:
            return None
        to_target = (np.arange(n_draft, dtype=np.int64) if ids is None
                     else np.asarray(ids, np.int64).copy())
        to_target[to_target >= n_target] = -1
        ok = np.flatnonzero(to_target >= 0)
        to_draft = np.zeros(n_target, np.int64)
        to_draft[to_target[ok]] = ok
        return cls(to_target, to_draft, np.flatnonzero(to_target < 0))


SEEN = 8  # the history's last tokens a draft's runner-ups are kept with, to know it again


class DraftModel(Drafter):
    """A small model with its own KV cache, kept in step with the accepted tokens by `Model.sync`.
    Its rows go through the same sampler chain as the target's, penalties included, so q is the
    distribution each draft was drawn from, on the target's vocabulary (see VocabMap for drafts with
    another one)."""

    def __init__(self, model: Model, p_min: float = 0.0, ids: np.ndarray | None = None,
                 n_target: int = 0, runner_ups: bool = False):
        """`runner_ups`: steps may verify draft trees, and a greedy draft keeps each depth's WIDTH
        likeliest tokens (llama.cpp's graph picks them instead of the argmax alone)."""
        self.model = model
        self.p_min = p_min
        self.runner_ups = runner_ups
        self.n_target = n_target or model.n_vocab
        self.map = VocabMap.between(model.n_vocab, self.n_target, ids)
        self._seen: list[int] = []  # history in target ids ...
        self._mapped: list[int] = []  # ... and in draft ids
        # the last draft: the history's length and its last tokens, the draft's tokens and the q
        # each was drawn from (sampled), or its runner-ups' (greedy, runner_ups)
        self._drawn: tuple[int, list[int], list[int], list[Dist]] = (-1, [], [], [])

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

    def start(self, history: Sequence[int], constraint: Constraint | None = None) -> None:
        no_grammar(constraint)
        self._drawn = (-1, [], [], [])
        h = self._map(history)  # the prompt is prompt processing, not drafting
        if len(h) > 1:
            self.model.sync(h[:-1], logits="none")
        else:
            self.model.reset()

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> list[Evidence]:
        return [DRAFT] * max(0, min(k_max, self.model.n_ctx - len(history)))

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: Random,
                constraint: Constraint | None = None) -> Draft:
        m = self.model
        room = m.n_ctx - len(history)
        k = min(k, room)
        if k <= 0:
            return EMPTY
        t0 = time.perf_counter()
        banned = self.map.banned if self.map is not None and len(self.map.banned) else None
        # llama.cpp samples in the graph, but p_min at temperature 0 needs the whole row's softmax
        on_graph = ROWS if (sampling.greedy and self.p_min > 0) or constraint is not None else \
            backend_chain(sampling, banned)  # a grammar's mask needs the whole row too
        if self.runner_ups and on_graph is IDS:
            on_graph = Output.top_k(WIDTH)
        # usually 1-2 new tokens (the target's own, after the accepted drafts); many after steps
        # without drafts
        mapped = self._map(history)
        caught_up = m.sync(mapped, output=on_graph)
        catch_up = time.perf_counter() - t0 if caught_up > 2 else 0.0
        recent = mapped[-sampling.window:] if sampling.window else []
        tokens, qs = draw(m, -1, k, lambda t, i: m.eval([t], output=on_graph), sampling, rng,
                          recent, self.p_min,
                          # in the draft's ids
                          banned, constraint, None if self.map is None else self.map.to_target,
                          WIDTH if self.runner_ups else 0)
        if self.map is not None:  # back to the target's ids
            tokens = self.map.to_target[tokens].tolist()
            qs = [self._on_target(q, self.map) for q in qs]
        self._drawn = (len(history), list(history[-SEEN:]), tokens, qs)
        return Draft(tokens, None if sampling.greedy else qs, Source.draft, catch_up)

    def branches(self, history: Sequence[int], chain: Sequence[int], width: int) -> list[Branch]:
        """Beside a draft just drawn from q (sampled), or a greedy one that kept its runner-ups (the
        softmax of each depth's top WIDTH): at each depth the likeliest other tokens (EAGLE-2's
        runner-ups), at most width - 1, each at its share of q beyond the drafted token. Its draft
        may follow other tokens of the chain (a hybrid's lookup, a grammar's forced tokens)."""
        n, seen, tokens, qs = self._drawn
        at = n - len(history)  # (the chain's tokens ahead of its draft)
        if not 0 <= at <= len(chain) or [*history, *chain[:at]][-SEEN:] != seen \
                or list(chain[at:]) != tokens[: len(chain) - at]:
            return []  # (its last draft followed another history)
        out: list[Branch] = []
        for d, (token, q) in enumerate(zip(chain[at:], qs), at):
            rest = max(1e-9, 1.0 - q.prob(token))
            best = [j for j in np.argsort(-q.p, kind="stable") if q.ids[j] != token][: width - 1]
            out += [Branch(d, int(q.ids[j]), float(q.p[j]) / rest, Source.draft) for j in best]
        return out

    def _on_target(self, q: Dist, vocab_map: VocabMap) -> Dist:
        ids = vocab_map.to_target[q.ids]
        order = np.argsort(ids)
        return Dist(ids[order], q.p[order], self.n_target)
