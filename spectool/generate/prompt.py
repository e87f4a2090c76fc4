"""Prompt processing: everything a generation does before its first step. The prompt into the
target's cache (the loop's invariant: the cache holds x[:-1]), and, on a first run with these
settings, what batches cost here."""

from __future__ import annotations

import gc
import math
import time
from typing import Callable, Sequence

from spectool.core.controller import Controller
from spectool.llama.engine import EngineError, Model
from spectool.llama.outputs import Output

CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64)
# past 8 tokens, calibration goes on doubling while a batch costs less than this many single tokens
FLAT = 2.0


def prefill(target: Model, x: Sequence[int], interrupted: Callable[[], bool],
            on_prefill: Callable[[int, int], None] | None = None) -> int:
    """The prompt `x` but its last token into the target's cache; how many tokens that decoded (the
    rest was cached). `on_prefill` hears (done, total) between batches; `interrupted()` true there
    raises KeyboardInterrupt, so a Ctrl-C during a long prompt does not wait for its end."""
    if not x:
        raise ValueError("empty prompt")
    if len(x) > target.n_ctx:
        raise EngineError(f"the prompt has {len(x)} tokens but the context holds only "
                          f"{target.n_ctx}")
    if len(x) == 1:
        target.reset()
        return 0

    def progress(done: int, total: int) -> None:
        if on_prefill is not None:
            on_prefill(done, total)
        if interrupted():
            raise KeyboardInterrupt

    return target.sync(x[:-1], logits="none", progress=progress)


def calibrate(target: Model, x: Sequence[int], ctl: Controller, output: Output) -> None:
    """A cost table that has measured no batch yet (a first run on this machine, with these
    settings) learns what batches cost before the first step, instead of trusting priors that may
    not fit this CPU or GPU: batches of 1, 2, 4 and 8 tokens after the prompt, each twice (the first
    of a size is a warm-up), then rolled back; and 16, 32, 64 while costs stay nearly flat (a GPU,
    where verifying 32 tokens costs about what one does), up to the longest batch a step may verify.
    The cache holds x[:-1] before and after. A few target steps, once; part of prompt processing."""
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


def freeze_startup_objects() -> None:
    """Once per process, at its first generation: collect, then move every object alive (modules,
    vocabularies, models) out of the garbage collector's sight (gc.freeze), so that its full passes
    scan only what generation creates and do not land inside a step
    (research/notes/2026-12-02-lab.md)."""
    if not _FROZE:
        _FROZE.append(True)
        gc.collect()
        gc.freeze()


_FROZE: list[bool] = []
