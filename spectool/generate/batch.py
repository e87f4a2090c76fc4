"""Many sequences in one context (continuous batching): each step decodes every active sequence's
last token and its drafts in one llama_decode (ParallelModel.eval_seqs), accepts each sequence's
drafts on its own rows, and rolls each back on its own (llama_memory_seq_rm). Sequences join (their
prompt prefilled into a free sequence of the context) and leave at step boundaries.

Each sequence is a Loop (loop.py) of its own, with its drafter, controller, sampling and random
generator: a seeded sequence draws what it would draw alone, whatever runs beside it. Its
controller prices drafts from the one-sequence cost table: a decode shared with other sequences
teaches it nothing of costs (the batch's own pricing is issue 48 item 2). Not in a batch yet:
drafters that listen to the target's decodes (MTP heads), sampling inside llama.cpp's graph (a
batch reads whole rows). A drafter with a state of its own (lookup's index, a draft model's cache)
must be each sequence's own (drafters/builder.py's for_sequence).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from spectool.core.evidence import Evidence
from spectool.core.grammar import NothingAllowed
from spectool.core.protocol import Draft
from spectool.core.stats import Stats
from spectool.generate.loop import GenerationConfig, Loop, Step
from spectool.generate.prompt import freeze_startup_objects
from spectool.generate.stream import TextStream
from spectool.llama.engine import EngineError
from spectool.llama.outputs import ROWS
from spectool.llama.parallel import ParallelModel


class Rows:
    """One sequence's rows of the batch's last decode, read as verify.py reads a Model's: row i is
    the target after that sequence's x + d_1..d_i."""

    output = ROWS

    def __init__(self, target: ParallelModel, start: int):
        self.target, self.start, self.n_vocab = target, start, target.n_vocab

    def logits(self, i: int):
        return self.target.logits(self.start + i)


@dataclass(slots=True)
class Planned:
    """What a sequence brings to a step: its drafts and what choosing them cost."""

    seq: int
    loop: Loop
    keys: list[Evidence]
    draft: Draft
    draft_seconds: float


class Batch:
    """The sequences that share `target`'s context, each under its seq id."""

    def __init__(self, target: ParallelModel):
        self.target = target
        self.free = list(range(target.n_seq_max))
        self.active: dict[int, Loop] = {}
        # the steps' decodes so far: how many, their rows, and the sequences in them (summed)
        self.n_steps = self.n_rows = self.n_seq_steps = 0

    def join(self, g: GenerationConfig, prompt: Sequence[int], stats: Stats | None = None,
             stop: Sequence[str] | None = None) -> int:
        """A sequence's prompt into a free sequence of the context; its seq id, which the steps'
        results are keyed by. `stop`: its steps carry their text, cut at the first of these."""
        target = self.target
        if g.target is not target:
            raise ValueError("the generation is not for this batch's model")
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) > target.n_ctx_seq:
            raise EngineError(f"the prompt has {len(prompt)} tokens but a sequence holds only "
                              f"{target.n_ctx_seq}")
        if not self.free:
            raise EngineError(f"all {target.n_seq_max} sequences are busy")
        t0 = time.perf_counter()
        freeze_startup_objects()
        seq, x = self.free.pop(0), list(prompt)
        target.rollback(0, seq)
        for start in range(0, len(x) - 1, target.n_batch):
            target.eval_seqs([(seq, x[start : min(len(x) - 1, start + target.n_batch)])],
                             logits=False)
        constraint = g.grammar.matcher(target) if g.grammar is not None else None
        notice = g.drafter.start(x, constraint) if g.drafter is not None else None
        if stats is not None:
            stats.n_prompt_tokens, stats.n_prefilled = len(x), len(x) - 1
            stats.prompt_seconds = time.perf_counter() - t0
        stream = None if stop is None else TextStream(target, stop)
        self.active[seq] = Loop(g, x, ROWS, stats, stream, constraint, notice)
        return seq

    def leave(self, seq: int) -> None:
        """Sequence `seq` out of the batch, its cache emptied and its seq id free again."""
        loop = self.active.pop(seq)
        self.target.rollback(0, seq)
        if loop.drafter is not None:
            loop.drafter.finish(loop.x)
        self.free.append(seq)

    def interrupt(self, seq: int) -> list[Step]:
        """Sequence `seq` ended between steps (its client left, the server stops): its last step,
        with any text held back for a stop string, and it leaves the batch."""
        steps = list(self.active[seq].interrupt())
        self.leave(seq)
        return steps

    def close(self) -> None:
        for seq in list(self.active):
            self.leave(seq)

    def step(self) -> dict[int, Step]:
        """One decode for every active sequence; each one's Step by seq id. A sequence whose step
        finished it (finish_reason set) has left the batch."""
        out = {}
        plan = []
        budget = self.target.n_batch // max(1, len(self.active)) - 1  # drafts a sequence may add
        for seq, loop in self.active.items():
            room = self.target.n_ctx_seq - len(loop.x)
            if room < 0:
                out[seq] = loop.last("context")
                continue
            t0 = time.perf_counter()
            keys, d = loop.draft(min(room, budget, loop.g.max_tokens - loop.n_new - 1))
            plan.append(Planned(seq, loop, keys, d, time.perf_counter() - t0))
        if plan:
            out.update(self.verify(plan))
        for seq, step in out.items():
            if step.finish_reason:
                self.leave(seq)
        return out

    def verify(self, plan: list[Planned]) -> dict[int, Step]:
        """One decode of every planned sequence's [x[-1], d_1..d_k]; each accepted on its own rows
        (all read before any roll-back, which drops the decode's outputs), then rolled back to x
        and its accepted drafts."""
        target = self.target
        t0 = time.perf_counter()
        starts = target.eval_seqs([(p.seq, [p.loop.x[-1], *p.draft.tokens]) for p in plan])
        seconds = time.perf_counter() - t0
        self.n_steps += 1
        self.n_rows += sum(len(p.draft.tokens) + 1 for p in plan)
        self.n_seq_steps += len(plan)
        chosen = [accepted(p.loop, Rows(target, start), p.draft) for p, start in zip(plan, starts)]
        out = {}
        alone = len(plan) == 1  # the decode was a one-sequence verification: its cost is one's
        for p, (n_acc, t) in zip(plan, chosen):
            if t < 0:  # the grammar admits nothing here
                out[p.seq] = p.loop.last("stop")
                continue
            target.rollback(len(p.loop.x) + n_acc, p.seq)
            p.loop.observe(p.keys, p.draft, n_acc, p.draft_seconds, seconds if alone else None)
            new = [*p.draft.tokens[:n_acc], t]
            out[p.seq] = p.loop.emit(new, p.draft, n_acc, p.draft_seconds, seconds)
        return out


def accepted(loop: Loop, rows: Rows, d: Draft) -> tuple[int, int]:
    """How many of a sequence's drafts its rows accept, and its own next token (-1: its grammar
    admits none); the new tokens' logprobs read too where it asks for them."""
    window = loop.sampling.window
    try:  # the penalties see x + d_1..d_i
        n_acc, t = loop.accept(rows, d, loop.x[-window:] if window else [])
    except NothingAllowed:
        return 0, -1
    if loop.g.logprobs is not None:
        loop.step_logprobs = loop.logprobs([*d.tokens[:n_acc], t], rows)
    return n_acc, t
