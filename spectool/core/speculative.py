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
from spectool.drafters.base import EMPTY, Drafter
from spectool.drafters.lookup import PromptLookup
from spectool.llama.engine import EngineError, Model
from spectool.core.keys import Key
from spectool.core.keys import Source
from spectool.core.stats import Stats
from spectool.core.verify import Sampling, accept_greedy, accept_sampled, backend_chain, dist_at, greedy_rows


@dataclass(slots=True)
class Step:
    tokens: list[int]  # the new final tokens: accepted drafts, then the target's own token
    drafted: int
    accepted: int
    source: Source  # none | lookup | draft | hybrid
    draft_seconds: float
    verify_seconds: float
    finish_reason: str | None = None  # set on the last step: "stop" | "length" | "context"
    notice: str | None = None  # a one-line message for the user (e.g. the draft model failed)
    draft_chars: int = 0  # set by generate_text: how much of the step's text came from accepted drafts


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

    def random(self) -> np.random.Generator:
        if self.rng is None:
            self.rng = np.random.default_rng(self.seed)
        return self.rng


def speculative_generate(g: Generation, prompt: Sequence[int], stats: Stats | None = None,
                         interrupted: Callable[[], bool] = lambda: False) -> Iterator[Step]:
    """The loop. `interrupted()` is also asked between the prefill's batches: true, it raises KeyboardInterrupt
    there (the cache holds whole batches), so a Ctrl-C during a long prompt does not wait for its end."""
    t0 = time.perf_counter()  # prompt processing: everything before the first step
    _freeze_startup_objects()
    target, ctl, s = g.target, g.controller, g.sampling
    temp = 0.0 if s.greedy else s.temp  # acceptance is learnt per temperature (keys.py)
    rng = g.random()
    drafter = g.drafter
    on_graph = backend_chain(s)  # what llama.cpp samples inside its graph: token ids or top-k, not whole rows
    greedy, window = s.greedy, s.window
    x = list(prompt)
    if not x:
        raise ValueError("empty prompt")
    if len(x) > target.n_ctx:
        raise EngineError(f"the prompt has {len(x)} tokens but the context holds only {target.n_ctx}")
    if len(x) > 1:
        def progress(done: int, total: int) -> None:
            if g.on_prefill is not None:
                g.on_prefill(done, total)
            if interrupted():
                raise KeyboardInterrupt

        n_prefilled = target.sync(x[:-1], logits="none", progress=progress)
    else:
        target.reset()
        n_prefilled = 0
    notice = None
    if drafter is not None:
        _calibrate(target, x, ctl, on_graph)
        try:
            drafter.prefill(x)  # the draft model's prompt is prompt processing, not drafting
        except EngineError as e:
            drafter, notice = _fallback(x, e)
    if stats is not None:
        stats.n_prompt_tokens = len(x)
        stats.n_prefilled = n_prefilled
        stats.prompt_seconds = time.perf_counter() - t0
    n_new = 0

    def worth(key: Key) -> float:
        return ctl.worth(key, temp)

    try:
        while True:
            room = target.n_ctx - len(x)  # the batch [x[-1], d_1..d_k] must fit: k <= room
            if room < 0:
                if stats is not None:
                    stats.finish_reason = "context"
                yield Step([], 0, 0, Source.none, 0.0, 0.0, finish_reason="context")
                return
            # 1. draft
            t0 = time.perf_counter()
            d = EMPTY
            keys: list[Key] = []
            if drafter is not None:
                offer = drafter.peek(x, min(ctl.k_max, room, g.max_tokens - n_new - 1), worth)
                keys = ctl.pick(offer, temp)
                if keys:
                    try:
                        d = drafter.propose(x, len(keys), s, rng)
                    except EngineError as e:
                        drafter, notice = _fallback(x, e)
            t1 = time.perf_counter()
            # 2. verify: one target pass over [x[-1], d_1..d_k]
            recent = x[-window:] if window else []  # p_i's penalties see x + d_1..d_i
            target.eval([x[-1], *d.tokens], logits="all", sample=on_graph)
            if greedy:
                n_acc, t = accept_greedy(greedy_rows(target, s, recent, d.tokens), d.tokens)
            else:
                n_acc, t = accept_sampled(lambda i: dist_at(target, i, s, recent + d.tokens[:i]), d.q, d.tokens,
                                          rng)
            if n_acc < len(d.tokens):
                target.rollback(len(x) + n_acc)  # keep x and the accepted drafts; t is fed next step
            t2 = time.perf_counter()
            if drafter is not None:  # plain decoding (no drafter) has nothing to decide, so nothing to learn
                ctl.observe_verify(len(d.tokens) + 1, t2 - t1)
                if d.tokens:  # catching up is not per token
                    ctl.observe_draft(keys[: len(d.tokens)], t1 - t0 - d.catch_up_seconds)
                    ctl.observe_accept(keys, len(d.tokens), n_acc)
            # 3. emit, stopping at end-of-generation or the token budget
            new = [*d.tokens[:n_acc], t]
            finish = None
            end = target.first_eog(new)
            if end < len(new):
                new, finish = new[:end], "stop"
            elif n_new + len(new) >= g.max_tokens:
                new, finish = new[: g.max_tokens - n_new], "length"
            x.extend(new)
            n_new += len(new)
            step = Step(new, len(d.tokens), n_acc, d.source, t1 - t0, t2 - t1, finish, notice)
            notice = None
            if stats is not None:
                stats.add_step(step)
                stats.finish_reason = finish
            yield step
            if finish:
                return
    finally:
        target.rollback(len(x) - 1)  # whatever happened, the cache holds x[:-1] and nothing drafted


def _freeze_startup_objects() -> None:
    """Once per process, at its first generation: collect, then move every object alive (modules, vocabularies,
    models) out of the garbage collector's sight (gc.freeze). Its full passes then scan only what generation
    creates: over all of a process's objects, one took 12-15 ms, landing inside a decoding step."""
    if not _FROZE:
        _FROZE.append(True)
        gc.collect()
        gc.freeze()


_FROZE: list[bool] = []


CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64)
FLAT = 2.0  # past 8 tokens, calibration goes on doubling while a batch costs less than this many single tokens


def _calibrate(target: Model, x: list[int], ctl: Controller, sample: int | None) -> None:
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
            target.eval([x[-1]] * b, logits="all", sample=sample)
            ctl.observe_verify(b, time.perf_counter() - t0)
            target.rollback(len(x) - 1)


def _fallback(x: list[int], error: Exception) -> tuple[Drafter, str]:
    """A failing draft model: go on with prompt lookup alone (the output stays the target's)."""
    lookup = PromptLookup()
    lookup.prefill(x)
    return lookup, f"draft model failed ({error}); continuing with prompt lookup"


class TextStream:
    """Detokenizes steps into text, holding back what could still become a stop string."""

    def __init__(self, model: Model, stop: Sequence[str] = ()):
        self.detok = model.detokenizer()
        self.stop = [s for s in stop if s]
        self.pending = ""
        self.stopped = False

    def feed(self, tokens: Sequence[int]) -> str:
        """The text that is final after `tokens`; sets `stopped` when a stop string appeared."""
        self.pending += self.detok.feed(tokens)
        if not self.stop:
            out, self.pending = self.pending, ""
            return out
        hits = [i for i in (self.pending.find(s) for s in self.stop) if i >= 0]
        if hits:
            out, self.pending, self.stopped = self.pending[: min(hits)], "", True
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
                  interrupted: Callable[[], bool] = lambda: False):
    """Yield (text, step) pairs; text is what became final at that step, and its first `step.draft_chars`
    characters came from accepted drafts. Stops at stop strings too (the tokens past one are dropped from the step
    and from `stats`), and when `interrupted()` turns true between steps, after a last piece with the text that
    was held back while a stop string might still match."""
    stream = TextStream(g.target, stop)
    gen = speculative_generate(g, prompt, stats, interrupted)
    try:
        for step in gen:
            drafted, own = "", ""
            for i, tok in enumerate(step.tokens):
                piece = stream.feed([tok])
                if i < step.accepted:
                    drafted += piece
                else:
                    own += piece
                if stream.stopped:
                    if stats is not None:
                        stats.n_generated -= len(step.tokens) - i - 1
                        stats.finish_reason = "stop"
                    step.tokens, step.finish_reason = step.tokens[: i + 1], "stop"
                    break
            else:
                if step.finish_reason:
                    own += stream.flush()
            step.draft_chars = len(drafted)
            yield drafted + own, step
            if stream.stopped:
                return
            if interrupted():
                if stats is not None:
                    stats.finish_reason = "interrupted"
                held = stream.flush()
                if held:
                    yield held, Step([], 0, 0, Source.none, 0.0, 0.0, finish_reason="interrupted")
                return
    finally:
        gen.close()
