"""The speculative loop: a generator of Step events, draft -> verify -> accept -> observe -> emit.

Notation: x is the token history (prompt + accepted output); the target's KV cache always holds
x[:-1], so each step feeds [x[-1], d_1..d_k] in one batch and reads k+1 rows of target logits
p_0..p_k, where p_i is the target's distribution after x + d_1..d_i. q are the drafter's
distributions (see core/verify.py).

The loop takes the drafter it is given (drafters/builder.py builds one whole: grammar, corpus,
fallback) and decides nothing of it: the controller picks each step's draft length, the acceptance
rule keeps the target's distribution.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.controller import Controller
from spectool.core.evidence import Evidence, Source
from spectool.core.grammar import Constraint, Grammar, NothingAllowed, dist_under, token_under
from spectool.core.protocol import EMPTY, Draft, Drafter
from spectool.core.stats import Stats
from spectool.core.verify import (Sampling, TokenLogprob, accept_greedy, accept_sampled,
                                  backend_chain, dist_at,
                                  greedy_rows, token_logprob)
from spectool.generate.prompt import calibrate, freeze_startup_objects, prefill
from spectool.generate.stream import TextStream
from spectool.llama.engine import Model
from spectool.llama.outputs import ROWS, Output


@dataclass(slots=True, kw_only=True)
class Step:
    """One target pass: the tokens it made final, where its drafts came from, and what it cost."""

    tokens: list[int]  # the new final tokens: accepted drafts, then the target's own token
    drafted: int = 0
    # of the drafted tokens, before any cut at end-of-generation, the budget or a stop string
    accepted: int = 0
    source: Source = Source.none
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    text: str = ""  # what became final as text, when the generation makes text (generate_text)
    draft_chars: int = 0  # how much of `text` came from accepted drafts
    # of the drafted tokens, how many a grammar forced (Source.grammar; the rest are `source`'s)
    forced: int = 0
    # on the last step: "stop" | "length" | "context" | "interrupted"
    finish_reason: str | None = None
    notice: str | None = None  # a one-line message for the user (e.g. the draft model failed)
    # one per token of `tokens`, when GenerationConfig.logprobs asks
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerationConfig:
    """Everything one generation needs besides the prompt."""

    target: Model
    # built whole (drafters/builder.py); under a grammar, it drafts under it
    drafter: Drafter | None = None
    sampling: Sampling = field(default_factory=Sampling)
    controller: Controller = field(default_factory=Controller)
    max_tokens: int = 256
    seed: int | None = None
    # made from `seed` on first use and kept: a chat's turns go on drawing
    rng: np.random.Generator | None = None
    # hears (done, total) while the prompt is processed
    on_prefill: Callable[[int, int], None] | None = None
    grammar: Grammar | None = None  # every token follows it (core/grammar.py)
    # each token's log-probability and this many alternatives (Step.logprobs); None:
    logprobs: int | None = None
    # none, and llama.cpp's graph may sample the rows where they are (backend_chain)
    # the most tokens a step drafts, where a request sets its own (0: none); None: the controller's
    draft_max: int | None = None

    def random(self) -> np.random.Generator:
        if self.rng is None:
            self.rng = np.random.default_rng(self.seed)
        return self.rng


def never() -> bool:
    return False


def speculative_generate(g: GenerationConfig, prompt: Sequence[int], stats: Stats | None = None,
                         interrupted: Callable[[], bool] = never,
                         stop: Sequence[str] | None = None) -> Iterator[Step]:
    """The loop: a Step per target pass. `interrupted()` is asked between steps (true: a last step,
    finish reason "interrupted", with any text held back for a stop string) and between the
    prefill's batches (true: it raises KeyboardInterrupt there). `stop`: the steps carry their text,
    cut at the first of these strings (None: no text is made)."""
    t0 = time.perf_counter()  # prompt processing: everything before the first step
    freeze_startup_objects()
    x = list(prompt)
    # before the prefill: it may fail
    constraint = g.grammar.matcher(g.target) if g.grammar is not None else None
    n_prefilled = prefill(g.target, x, interrupted, g.on_prefill)
    # what llama.cpp samples inside its graph (ids, top-k or rows); a grammar's mask and logprobs
    # need whole rows
    on_graph = backend_chain(g.sampling) if constraint is None and g.logprobs is None else ROWS
    notice = None
    if g.drafter is not None:
        calibrate(g.target, x, g.controller, on_graph)
        # a draft model's prompt is prompt processing, not drafting
        notice = g.drafter.start(x, constraint)
    if stats is not None:
        stats.n_prompt_tokens, stats.n_prefilled = len(x), n_prefilled
        stats.prompt_seconds = time.perf_counter() - t0
    stream = None if stop is None else TextStream(g.target, stop)
    yield from Loop(g, x, on_graph, stats, stream, constraint, notice).steps(interrupted)


def generate_text(g: GenerationConfig, prompt: Sequence[int], stop: Sequence[str] = (),
                  stats: Stats | None = None,
                  interrupted: Callable[[], bool] = never) -> Iterator[tuple[str, Step]]:
    """Yield (text, step) pairs: the text that became final at each step (its first
    `step.draft_chars` characters came from accepted drafts), up to the first stop string; see
    speculative_generate."""
    for step in speculative_generate(g, prompt, stats, interrupted, stop):
        yield step.text, step


class Loop:
    """One generation's state between steps: the history x, the tokens made so far, what the user is
    to be told."""

    def __init__(self, g: GenerationConfig, x: list[int], on_graph: Output, stats: Stats | None,
                 stream: TextStream | None, constraint: Constraint | None, notice: str | None):
        self.g = g
        self.x = x
        self.target = g.target
        self.drafter = g.drafter
        self.ctl = g.controller
        self.sampling = g.sampling
        self.rng = g.random()
        self.on_graph = on_graph
        self.stats = stats
        self.stream = stream
        self.constraint = constraint
        self.notice = notice
        # acceptance is learnt per temperature
        self.temp = 0.0 if g.sampling.greedy else g.sampling.temp
        self.n_new = 0
        # the last verification's, when g.logprobs asks ...
        self.step_logprobs: list[TokenLogprob] | None = None
        self.logprob_seconds = 0.0  # ... and what reading them cost

    def worth(self, key: Evidence) -> float:
        """What the controller makes of a drafter's greedy key at this generation's temperature."""
        return self.ctl.worth(key, self.temp)

    def steps(self, interrupted: Callable[[], bool]) -> Iterator[Step]:
        x, target = self.x, self.target
        try:
            # the batch [x[-1], d_1..d_k] must fit: k <= room
            while (room := target.n_ctx - len(x)) >= 0:
                t0 = time.perf_counter()
                keys, d = self.draft(min(room, self.g.max_tokens - self.n_new - 1))
                t1 = time.perf_counter()
                try:
                    n_acc, t = self.verify(d)
                except NothingAllowed:
                    yield self.last("stop")
                    return
                t2 = time.perf_counter()
                # a batch's cost, by size
                self.observe(keys, d, n_acc, t1 - t0, t2 - t1 - self.logprob_seconds)
                step = self.emit([*d.tokens[:n_acc], t], d, n_acc, t1 - t0, t2 - t1)
                yield step
                if step.finish_reason:
                    return
                if interrupted():
                    yield from self.interrupt()
                    return
            yield self.last("context")
        finally:
            # whatever happened, the cache holds x[:-1] and nothing drafted
            target.rollback(len(x) - 1)
            if self.drafter is not None:
                self.drafter.finish(x)

    def interrupt(self) -> Iterator[Step]:
        """The end of an interrupted generation: a last step with the text held back for a stop
        string, if any."""
        held = self.stream.flush() if self.stream is not None else ""
        step = self.last("interrupted", held)
        if held:
            yield step

    def draft(self, k_max: int) -> tuple[list[Evidence], Draft]:
        """The keys the controller picked among the drafter's offer, and the draft of that many
        tokens."""
        if self.drafter is None:  # (a request that drafts nothing has none: requests.py)
            return [], EMPTY
        if self.g.draft_max is not None:
            k_max = min(k_max, self.g.draft_max)
        offer = self.drafter.peek(self.x, min(self.ctl.k_max, k_max), self.worth)
        keys = self.ctl.pick(offer, self.temp)
        if not keys:
            return keys, EMPTY
        d = self.drafter.propose(self.x, len(keys), self.sampling, self.rng)
        if d.notice:
            self.notice = d.notice
        return keys, d

    def verify(self, d: Draft) -> tuple[int, int]:
        """One target pass over [x[-1], d_1..d_k]: how many drafts are accepted, and the target's
        own next token. The cache then holds x and the accepted drafts."""
        x, target, s, tokens = self.x, self.target, self.sampling, d.tokens
        recent = x[-s.window:] if s.window else []  # p_i's penalties see x + d_1..d_i
        target.eval([x[-1], *tokens], logits="all", output=self.on_graph)
        n_acc, t = self.accept(target, d, recent)
        # read before the roll-back, which drops the decode's outputs
        if self.g.logprobs is not None:
            t0 = time.perf_counter()
            self.step_logprobs = self.logprobs([*tokens[:n_acc], t])
            self.logprob_seconds = time.perf_counter() - t0
        if n_acc < len(tokens):
            target.rollback(len(x) + n_acc)  # keep x and the accepted drafts; t is fed next step
        return n_acc, t

    def accept(self, rows, d: Draft, recent: list[int]) -> tuple[int, int]:
        """The acceptance rule on the verification's rows p_0..p_k, read from `rows` as verify.py
        reads a model's (the target, or one sequence's rows of a batch: generate/batch.py)."""
        s, tokens = self.sampling, d.tokens
        if self.constraint is not None:
            return self.accept_under(rows, d, recent, self.constraint)
        if s.greedy:
            return accept_greedy(greedy_rows(rows, s, recent, tokens), tokens)
        return accept_sampled(lambda i: dist_at(rows, i, s, recent + tokens[:i]), d.q, tokens,
                              self.rng)

    def accept_under(self, rows, d: Draft, recent: list[int], c: Constraint) -> tuple[int, int]:
        """The acceptance rule under a grammar: p_i is the target's row after x + d_1..d_i masked by
        the grammar in that state (the drafts were cut to what it accepts), so the grammar advances
        over each draft as its row is reached; it then holds x, the accepted drafts and the target's
        token."""
        s, tokens = self.sampling, d.tokens

        def row(i: int, under):
            if i:
                c.push(tokens[i - 1 : i])
            return under(rows, i, s, recent + tokens[:i], c)

        if s.greedy:
            n_acc, t = accept_greedy((row(i, token_under) for i in range(len(tokens) + 1)), tokens)
        else:
            n_acc, t = accept_sampled(lambda i: row(i, dist_under), d.q, tokens, self.rng)
        if not c.push([t]):
            raise NothingAllowed("the grammar admits no token here")
        return n_acc, t

    def logprobs(self, new: list[int], rows=None) -> list[TokenLogprob]:
        """Each new token's TokenLogprob from the verification's own rows (the target's, or
        `rows`, as in accept): token i of the step was chosen on row i (the target after
        x + d_1..d_i), accepted drafts and the target's token alike."""
        n, rows = self.g.logprobs or 0, self.target if rows is None else rows
        return [token_logprob(rows.logits(i), token, n) for i, token in enumerate(new)]

    def observe(self, keys: list[Evidence], d: Draft, n_acc: int, draft_seconds: float,
                verify_seconds: float | None) -> None:
        """What the controller learns from a step: the batch's cost (None: the decode was shared
        with other sequences, generate/batch.py, and says nothing of it), the draft's cost and how
        far it was accepted. Plain decoding (no drafter) has nothing to decide, so nothing to learn.
        Catching up is not per token."""
        if self.drafter is None:
            return
        if verify_seconds is not None:
            self.ctl.observe_verify(len(d.tokens) + 1, verify_seconds)
        if d.tokens:
            self.ctl.observe_draft(keys[: len(d.tokens)], draft_seconds - d.catch_up_seconds)
            self.ctl.observe_accept(keys, len(d.tokens), n_acc)

    def emit(self, new: list[int], d: Draft, n_acc: int, draft_seconds: float,
             verify_seconds: float) -> Step:
        """The step, its tokens cut at end-of-generation, the token budget or a stop string, then
        recorded."""
        new, finish = self.cut(new)
        text, draft_chars = "", 0
        if self.stream is not None:
            new, finish, text, draft_chars = self.text_of(new, finish, n_acc)
        self.x.extend(new)
        self.n_new += len(new)
        logprobs = None if self.g.logprobs is None else (self.step_logprobs or [])[: len(new)]
        step = Step(tokens=new, drafted=len(d.tokens), accepted=n_acc, source=d.source,
                    draft_seconds=draft_seconds,
                    verify_seconds=verify_seconds, text=text, draft_chars=draft_chars,
                    finish_reason=finish,
                    notice=self.notice, forced=d.forced, logprobs=logprobs)
        self.notice = None
        if self.stats is not None:
            self.stats.add_step(step)
            self.stats.finish_reason = finish
            self.stats.stop_string = self.stream.stopped if self.stream is not None else None
        return step

    def text_of(self, new: list[int], finish: str | None,
                n_acc: int) -> tuple[list[int], str | None, str, int]:
        """The step's text, the tokens and finish reason cut where a stop string appeared, and how
        many characters of the text came from accepted drafts."""
        assert self.stream is not None
        text, draft_chars = "", 0
        for i, token in enumerate(new):
            text += self.stream.feed([token])
            draft_chars = len(text) if i < n_acc else draft_chars
            if self.stream.stopped:
                new, finish = new[: i + 1], "stop"
                break
        if finish and not self.stream.stopped:
            text += self.stream.flush()
        return new, finish, text, draft_chars

    def cut(self, new: list[int]) -> tuple[list[int], str | None]:
        """`new` up to the first end-of-generation token ("stop") or the token budget ("length")."""
        end = self.target.first_eog(new)
        if end < len(new):
            return new[:end], "stop"
        if self.n_new + len(new) >= self.g.max_tokens:
            return new[: self.g.max_tokens - self.n_new], "length"
        # nothing but end-of-generation can follow
        if self.constraint is not None and self.constraint.complete:
            return new, "stop"
        return new, None

    def last(self, finish: str, text: str = "") -> Step:
        """A step with no pass behind it, that ends the generation."""
        if self.stats is not None:
            self.stats.finish_reason = finish
        return Step(tokens=[], text=text, finish_reason=finish)
