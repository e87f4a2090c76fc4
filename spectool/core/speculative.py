"""The speculative loop: a generator of Step events.

Notation: x is the token history (prompt + accepted output); the target's KV cache always holds x[:-1], so
each step feeds [x[-1], d_1..d_k] in one batch and reads k+1 rows of target logits p_0..p_k, where p_i is the
target's distribution after x + d_1..d_i. q are the drafter's distributions (see verify.py).
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.controller import Controller
from spectool.drafters.base import EMPTY, Draft, Drafter
from spectool.drafters.grammar import Constrained
from spectool.drafters.corpus import Corpus
from spectool.drafters.lookup import PromptLookup, lookup_of
from spectool.llama.engine import EngineError, Model
from spectool.llama.outputs import ROWS, Output
from spectool.core.grammar import Constraint, Grammar, NothingAllowed, dist_under, token_under
from spectool.core.keys import Key, Source
from spectool.core.stats import Stats
from spectool.core.verify import (Sampling, TokenLogprob, accept_greedy, accept_sampled, backend_chain, dist_at,
                                  greedy_rows, token_logprob)


@dataclass(slots=True, kw_only=True)
class Step:
    """One target pass: the tokens it made final, where its drafts came from, and what it cost."""

    tokens: list[int]  # the new final tokens: accepted drafts, then the target's own token
    drafted: int = 0
    accepted: int = 0  # of the drafted tokens, before any cut at end-of-generation, the budget or a stop string
    source: Source = Source.none
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    text: str = ""  # what became final as text, when the generation makes text (generate_text)
    draft_chars: int = 0  # how much of `text` came from accepted drafts
    forced: int = 0  # of the drafted tokens, how many a grammar forced (Source.grammar; the rest are `source`'s)
    finish_reason: str | None = None  # on the last step: "stop" | "length" | "context" | "interrupted"
    notice: str | None = None  # a one-line message for the user (e.g. the draft model failed)
    logprobs: list[TokenLogprob] | None = None  # one per token of `tokens`, when Generation.logprobs asks


@dataclass
class Generation:
    """Everything one generation needs besides the prompt."""

    target: Model
    drafter: Drafter | None = None
    sampling: Sampling = field(default_factory=Sampling)
    controller: Controller = field(default_factory=Controller)
    max_tokens: int = 256
    seed: int | None = None
    rng: np.random.Generator | None = None  # made from `seed` on first use and kept: a chat's turns go on drawing
    on_prefill: Callable[[int, int], None] | None = None  # hears (done, total) while the prompt is processed
    grammar: Grammar | None = None  # every token follows it (core/grammar.py) ...
    forced_drafts: bool = True  # ... and the tokens it forces are drafted, with or without a drafter
    logprobs: int | None = None  # each token's log-probability and this many alternatives (Step.logprobs); None:
    # none, and llama.cpp's graph may sample the rows where they are (backend_chain)
    corpus: Corpus | None = None  # earlier generations' text, which prompt lookup drafts from too; this one's
    # prompt and output join it when it ends (drafters/corpus.py)

    def random(self) -> np.random.Generator:
        if self.rng is None:
            self.rng = np.random.default_rng(self.seed)
        return self.rng


def _never() -> bool:
    return False


def speculative_generate(g: Generation, prompt: Sequence[int], stats: Stats | None = None,
                         interrupted: Callable[[], bool] = _never, stop: Sequence[str] | None = None) -> Iterator[Step]:
    """The loop: a Step per target pass. `interrupted()` is asked between steps (true: a last step, finish reason
    "interrupted", with any text held back for a stop string) and between the prefill's batches (true: it raises
    KeyboardInterrupt there, so a Ctrl-C during a long prompt does not wait for its end). `stop`: the steps carry
    their text, cut at the first of these strings (None: no text is made)."""
    t0 = time.perf_counter()  # prompt processing: everything before the first step
    _freeze_startup_objects()
    x = list(prompt)
    constraint = g.grammar.matcher(g.target) if g.grammar is not None else None  # before the prefill: it may fail
    n_prefilled = _prefill(g, x, interrupted)
    # what llama.cpp samples inside its graph (ids, top-k or rows); a grammar's mask and logprobs need whole rows
    on_graph = backend_chain(g.sampling) if constraint is None and g.logprobs is None else ROWS
    drafter = g.drafter
    if (lookup := lookup_of(drafter)) is not None:
        lookup.corpus = g.corpus
    if constraint is not None and (drafter is not None or g.forced_drafts):
        drafter = Constrained(drafter, constraint, g.forced_drafts)
    drafter, notice = _start_drafter(g, drafter, x, on_graph, constraint)
    if stats is not None:
        stats.n_prompt_tokens, stats.n_prefilled = len(x), n_prefilled
        stats.prompt_seconds = time.perf_counter() - t0
    loop = _Loop(g, x, drafter, notice, on_graph, stats, None if stop is None else TextStream(g.target, stop),
                 constraint)
    yield from loop.steps(interrupted)


class _Loop:
    """One generation's state between steps: the history x, the drafter, the tokens made so far."""

    def __init__(self, g: Generation, x: list[int], drafter: Drafter | None, notice: str | None, on_graph: Output,
                 stats: Stats | None, stream: TextStream | None, constraint: Constraint | None = None):
        self.g, self.x, self.drafter, self.notice, self.stats, self.stream = g, x, drafter, notice, stats, stream
        self.on_graph, self.constraint = on_graph, constraint
        self.target, self.ctl, self.sampling, self.rng = g.target, g.controller, g.sampling, g.random()
        self.temp = temp = 0.0 if g.sampling.greedy else g.sampling.temp  # acceptance is learnt per temperature
        self.worth = lambda key: self.ctl.worth(key, temp)  # what the controller makes of a drafter's greedy key
        self.n_new = 0
        self.step_logprobs: list[TokenLogprob] | None = None  # the last verification's, when Generation.logprobs
        self.logprob_seconds = 0.0  # asks, and what reading them cost

    def steps(self, interrupted: Callable[[], bool]) -> Iterator[Step]:
        x, target = self.x, self.target
        try:
            while (room := target.n_ctx - len(x)) >= 0:  # the batch [x[-1], d_1..d_k] must fit: k <= room
                t0 = time.perf_counter()
                keys, d = self.draft(min(room, self.g.max_tokens - self.n_new - 1))
                t1 = time.perf_counter()
                try:
                    n_acc, t = self.verify(d)
                except NothingAllowed:
                    yield self.last("stop")
                    return
                t2 = time.perf_counter()
                self.observe(keys, d, n_acc, t1 - t0, t2 - t1 - self.logprob_seconds)  # a batch's cost, by size
                step = self.emit([*d.tokens[:n_acc], t], d, n_acc, t1 - t0, t2 - t1, self.step_logprobs)
                yield step
                if step.finish_reason:
                    return
                if interrupted():
                    held = self.stream.flush() if self.stream is not None else ""
                    if held:
                        yield self.last("interrupted", held)
                    else:
                        self.last("interrupted")
                    return
            yield self.last("context")
        finally:
            target.rollback(len(x) - 1)  # whatever happened, the cache holds x[:-1] and nothing drafted
            if self.g.corpus is not None:
                self.g.corpus.add(x)

    def draft(self, k_max: int) -> tuple[list[Key], Draft]:
        """The keys the controller picked among the drafter's offer, and the draft of that many tokens."""
        if self.drafter is None:
            return [], EMPTY
        offer = self.drafter.peek(self.x, min(self.ctl.k_max, k_max), self.worth)
        keys = self.ctl.pick(offer, self.temp)
        if not keys:
            return keys, EMPTY
        try:
            return keys, self.drafter.propose(self.x, len(keys), self.sampling, self.rng)
        except EngineError as e:
            self.drafter, self.notice = _fallback(self.x, e, self.constraint, self.g.forced_drafts)
            return keys, EMPTY

    def verify(self, d: Draft) -> tuple[int, int]:
        """One target pass over [x[-1], d_1..d_k]: how many drafts are accepted, and the target's own next token.
        The cache then holds x and the accepted drafts."""
        x, target, s, tokens = self.x, self.target, self.sampling, d.tokens
        recent = x[-s.window:] if s.window else []  # p_i's penalties see x + d_1..d_i
        target.eval([x[-1], *tokens], logits="all", output=self.on_graph)
        if self.constraint is not None:
            n_acc, t = self.accept_under(d, recent, self.constraint)
        elif s.greedy:
            n_acc, t = accept_greedy(greedy_rows(target, s, recent, tokens), tokens)
        else:
            n_acc, t = accept_sampled(lambda i: dist_at(target, i, s, recent + tokens[:i]), d.q, tokens, self.rng)
        if self.g.logprobs is not None:  # read before the roll-back, which drops the decode's outputs
            t0 = time.perf_counter()
            self.step_logprobs = self.logprobs([*tokens[:n_acc], t])
            self.logprob_seconds = time.perf_counter() - t0
        if n_acc < len(tokens):
            target.rollback(len(x) + n_acc)  # keep x and the accepted drafts; t is fed next step
        return n_acc, t

    def accept_under(self, d: Draft, recent: list[int], c: Constraint) -> tuple[int, int]:
        """The acceptance rule under a grammar: p_i is the target's row after x + d_1..d_i masked by the grammar in
        that state (the drafts were cut to what it accepts), so the grammar advances over each draft as its row is
        reached; it then holds x, the accepted drafts and the target's token."""
        target, s, tokens = self.target, self.sampling, d.tokens

        def row(i: int, under):
            if i:
                c.push(tokens[i - 1 : i])
            return under(target, i, s, recent + tokens[:i], c)

        if s.greedy:
            n_acc, t = accept_greedy((row(i, token_under) for i in range(len(tokens) + 1)), tokens)
        else:
            n_acc, t = accept_sampled(lambda i: row(i, dist_under), d.q, tokens, self.rng)
        if not c.push([t]):
            raise NothingAllowed("the grammar admits no token here")
        return n_acc, t

    def logprobs(self, new: list[int]) -> list[TokenLogprob]:
        """Each new token's TokenLogprob from the verification's own rows: token i of the step was chosen on row i
        (the target after x + d_1..d_i), accepted drafts and the target's token alike."""
        n = self.g.logprobs
        return [token_logprob(self.target.logits(i), token, n) for i, token in enumerate(new)]

    def observe(self, keys: list[Key], d: Draft, n_acc: int, draft_seconds: float, verify_seconds: float) -> None:
        """What the controller learns from a step: the batch's cost, the draft's cost and how far it was accepted.
        Plain decoding (no drafter) has nothing to decide, so nothing to learn."""
        if self.drafter is None:
            return
        self.ctl.observe_verify(len(d.tokens) + 1, verify_seconds)
        if d.tokens:
            self.ctl.observe_draft(keys[: len(d.tokens)], draft_seconds - d.catch_up_seconds)  # catching up is
            self.ctl.observe_accept(keys, len(d.tokens), n_acc)  # not per token

    def emit(self, new: list[int], d: Draft, n_acc: int, draft_seconds: float, verify_seconds: float,
             logprobs: list[TokenLogprob] | None = None) -> Step:
        """The step, its tokens cut at end-of-generation, the token budget or a stop string, then recorded."""
        new, finish = self.cut(new)
        text, draft_chars = "", 0
        if self.stream is not None:
            for i, token in enumerate(new):
                text += self.stream.feed([token])
                draft_chars = len(text) if i < n_acc else draft_chars
                if self.stream.stopped:
                    new, finish = new[: i + 1], "stop"
                    break
            if finish and not self.stream.stopped:
                text += self.stream.flush()
        self.x.extend(new)
        self.n_new += len(new)
        step = Step(tokens=new, drafted=len(d.tokens), accepted=n_acc, source=d.source, draft_seconds=draft_seconds,
                    verify_seconds=verify_seconds, text=text, draft_chars=draft_chars, finish_reason=finish,
                    notice=self.notice, forced=d.forced, logprobs=None if logprobs is None else logprobs[: len(new)])
        self.notice = None
        if self.stats is not None:
            self.stats.add_step(step)
            self.stats.finish_reason = finish
            self.stats.stop_string = self.stream.stopped if self.stream is not None else None
        return step

    def cut(self, new: list[int]) -> tuple[list[int], str | None]:
        """`new` up to the first end-of-generation token ("stop") or the token budget ("length")."""
        end = self.target.first_eog(new)
        if end < len(new):
            return new[:end], "stop"
        if self.n_new + len(new) >= self.g.max_tokens:
            return new[: self.g.max_tokens - self.n_new], "length"
        if self.constraint is not None and self.constraint.complete:  # nothing but end-of-generation can follow
            return new, "stop"
        return new, None

    def last(self, finish: str, text: str = "") -> Step:
        """A step with no pass behind it, that ends the generation."""
        if self.stats is not None:
            self.stats.finish_reason = finish
        return Step(tokens=[], text=text, finish_reason=finish)


def _prefill(g: Generation, x: list[int], interrupted: Callable[[], bool]) -> int:
    """The prompt but its last token into the target's cache (the loop's invariant: the cache holds x[:-1]); how
    many tokens that decoded (the rest was cached)."""
    target = g.target
    if not x:
        raise ValueError("empty prompt")
    if len(x) > target.n_ctx:
        raise EngineError(f"the prompt has {len(x)} tokens but the context holds only {target.n_ctx}")
    if len(x) == 1:
        target.reset()
        return 0

    def progress(done: int, total: int) -> None:
        if g.on_prefill is not None:
            g.on_prefill(done, total)
        if interrupted():
            raise KeyboardInterrupt

    return target.sync(x[:-1], logits="none", progress=progress)


def _start_drafter(g: Generation, drafter: Drafter | None, x: list[int], on_graph: Output,
                   constraint: Constraint | None) -> tuple[Drafter | None, str | None]:
    """The drafter, given the prompt (a draft model's prompt is prompt processing, not drafting), after a first
    run's calibration; prompt lookup instead (under the grammar, where there is one), with a notice, where the
    draft model fails."""
    if drafter is None:
        return None, None
    calibrate(g.target, x, g.controller, on_graph)
    try:
        drafter.prefill(x)
        return drafter, None
    except EngineError as e:
        return _fallback(x, e, constraint, g.forced_drafts)


def _freeze_startup_objects() -> None:
    """Once per process, at its first generation: collect, then move every object alive (modules, vocabularies,
    models) out of the garbage collector's sight (gc.freeze), so that its full passes scan only what generation
    creates and do not land inside a step (docs/performance.md)."""
    if not _FROZE:
        _FROZE.append(True)
        gc.collect()
        gc.freeze()


_FROZE: list[bool] = []


CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64)
FLAT = 2.0  # past 8 tokens, calibration goes on doubling while a batch costs less than this many single tokens


def calibrate(target: Model, x: list[int], ctl: Controller, output: Output) -> None:
    """A cost table that has measured no batch yet (a first run on this machine, with these settings) learns what
    batches cost before the first step, instead of trusting priors that may not fit this CPU or GPU: batches of
    1, 2, 4 and 8 tokens after the prompt, each twice (the first of a size is a warm-up), then rolled back; and
    16, 32, 64 while costs stay nearly flat (a GPU, where verifying 32 tokens costs about what one does), up to
    the longest batch a step may verify. The cache holds x[:-1] before and after. A few target steps, once; part
    of prompt processing."""
    costs = ctl.costs
    if not costs.timed or any(b >= 2 for b in costs.verify):
        return
    for b in CALIBRATION_SIZES:
        if b > ctl.k_max + 1 or len(x) - 1 + b > target.n_ctx:
            break
        if b > 8 and not costs.verify.get(b // 2, math.inf) < FLAT * costs.verify.get(1, 0.0):
            break
        for _ in range(2):
            t0 = time.perf_counter()
            target.eval([x[-1]] * b, logits="all", output=output)
            ctl.observe_verify(b, time.perf_counter() - t0)
            target.rollback(len(x) - 1)


def _fallback(x: list[int], error: Exception, constraint: Constraint | None = None,
              forced: bool = True) -> tuple[Drafter, str]:
    """A failing draft model: go on with prompt lookup alone (the output stays the target's), under the grammar
    where there is one."""
    lookup = PromptLookup()
    lookup.prefill(x)
    drafter = lookup if constraint is None else Constrained(lookup, constraint, forced)
    return drafter, f"draft model failed ({error}); continuing with prompt lookup"


class TextStream:
    """Detokenizes steps into text, holding back what could still become a stop string."""

    def __init__(self, model: Model, stop: Sequence[str] = ()):
        self.detok = model.detokenizer()
        self.stop = [s for s in stop if s]
        self.pending = ""
        self.stopped: str | None = None  # the stop string that ended the text, once one has

    def feed(self, tokens: Sequence[int]) -> str:
        """The text that is final after `tokens`; sets `stopped` to the stop string that appeared, if one did."""
        self.pending += self.detok.feed(tokens)
        if not self.stop:
            out, self.pending = self.pending, ""
            return out
        hits = [(i, s) for i, s in ((self.pending.find(s), s) for s in self.stop) if i >= 0]
        if hits:
            first, self.stopped = min(hits, key=lambda hit: hit[0])
            out, self.pending = self.pending[:first], ""
            return out
        hold = max((n for s in self.stop for n in range(1, len(s)) if self.pending.endswith(s[:n])), default=0)
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        out = "" if self.stopped else self.pending + self.detok.flush()
        self.pending = ""
        return out


def generate_text(g: Generation, prompt: Sequence[int], stop: Sequence[str] = (), stats: Stats | None = None,
                  interrupted: Callable[[], bool] = _never) -> Iterator[tuple[str, Step]]:
    """Yield (text, step) pairs: the text that became final at each step (its first `step.draft_chars` characters
    came from accepted drafts), up to the first stop string; see speculative_generate."""
    for step in speculative_generate(g, prompt, stats, interrupted, stop):
        yield step.text, step
