"""Many sequences in one context (continuous batching): each step decodes every active sequence's
last token and its drafts in one llama_decode (ParallelModel.eval_seqs), accepts each sequence's
drafts on its own rows, and rolls each back on its own (llama_memory_seq_rm). Sequences join (their
prompt prefilled into a free sequence of the context) and leave at step boundaries. A sequence that
left keeps its cache: the next prompt joins the free sequence whose cache shares the longest prefix
with it (llama-server's slot choice, `pick`) and prefills only what follows that prefix.

Each sequence is a Loop (loop.py) of its own, with its drafter, controller, sampling and random
generator: a seeded sequence draws what it would draw alone, whatever runs beside it. The sequences
that share a controller (a server's, but for seeded ones) have their drafts priced together: a row
costs what it adds to the batch's decode, priced by a table of decodes of that many sequences, by
rows (`Batch.table`), so the next row goes to the likeliest draft token of any sequence, and where
the batch's own rows fill the machine none is drafted (Controller.pick_together). Not in a batch
yet: drafters that listen to the target's decodes (MTP heads), sampling inside llama.cpp's graph (a
batch reads whole rows). A drafter with a state of its own (lookup's index, a draft model's cache)
must be each sequence's own (drafters/builder.py's Policy.drafting).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

from spectool.core.stats import Stats
from spectool.core.controller import Beside, Controller
from spectool.core.costs import Costs
from spectool.generate.loop import GenerationConfig, Loop, Step, never
from spectool.generate.plan import Offered, Plan
from spectool.generate.prompt import freeze_startup_objects
from spectool.generate.stream import TextStream
from spectool.llama.engine import EngineError, shared_prefix
from spectool.llama.outputs import ROWS
from spectool.llama.parallel import ParallelModel

# llama-server's slot prompt similarity (its default): a free sequence is picked for its cache
# where the prefix it shares is more than this share of the prompt; else the least recently used
SLOT_PROMPT_SIMILARITY = 0.1


class Rows:
    """One sequence's rows of the batch's last decode, read as verify.py reads a Model's: row i is
    the target after that sequence's x + d_1..d_i; and its roll-back, as a Model's."""

    output = ROWS

    def __init__(self, target: ParallelModel, seq: int, start: int):
        self.target, self.seq, self.start, self.n_vocab = target, seq, start, target.n_vocab

    def logits(self, i: int):
        return self.target.logits(self.start + i)

    def draw(self, chain, i: int) -> int:
        return self.target.draw(chain, self.start + i)

    def rollback(self, n: int) -> bool:
        return self.target.rollback(n, self.seq)

    def keep_path(self, path: Sequence[int]) -> None:
        self.target.keep_path(path, self.seq)


class Batch:
    """The sequences that share `target`'s context, each under its seq id."""

    def __init__(self, target: ParallelModel, slots: int | None = None):
        """`slots`: the sequences that generate (None: every one the context holds); the rest are
        spare, the same number for each slot, for the leaves of its draft trees (none: chains)."""
        self.target, self.slots = target, slots or target.n_seq_max
        self.free = list(range(self.slots))
        per = (target.n_seq_max - self.slots) // self.slots
        self.spares = {s: range(self.slots + s * per, self.slots + (s + 1) * per)
                       for s in range(self.slots)}
        self.active: dict[int, Loop] = {}
        # how many sequences left so far, and each one's number when it last left (-1: never)
        self.n_left, self.left = 0, [-1] * self.slots
        # the steps' decodes so far: how many, their rows, and the sequences in them (summed)
        self.n_steps = self.n_rows = self.n_seq_steps = 0

    def pick(self, prompt: Sequence[int], among: Sequence[int] | None = None) -> int:
        """The free sequence (of `among`, or of all) a prompt is to join, as llama-server's
        get_available_slot picks one: the one whose cache shares the longest prefix with the prompt,
        where that is more than SLOT_PROMPT_SIMILARITY of it (ties: the least recently used); else
        the least recently used (one never used first, then the lowest id)."""
        lru = sorted(self.free if among is None else among, key=lambda s: (self.left[s], s))
        if not lru:
            raise EngineError(f"all {self.slots} sequences are busy")
        shared = [shared_prefix(self.target.seqs[s], prompt[:-1]) for s in lru]
        best = max(range(len(lru)), key=shared.__getitem__)  # the first of the longest
        return lru[best] if shared[best] > SLOT_PROMPT_SIMILARITY * len(prompt) else lru[0]

    def join(self, g: GenerationConfig, prompt: Sequence[int], stats: Stats | None = None,
             stop: Sequence[str] | None = None, seq: int | None = None,
             interrupted: Callable[[], bool] = never) -> int:
        """A sequence's prompt into free sequence `seq` of the context (None: the one `pick`
        picks), as `prefill` puts it there (`interrupted()` true between its batches raises
        KeyboardInterrupt: the client left); its seq id, which the steps' results are keyed by.
        `stop`: its steps carry their text, cut at the first of these. Whatever fails on the way
        (the grammar, the prefill, the drafter's start) leaves the sequence free."""
        target = self.target
        if g.target is not target:
            raise ValueError("the generation is not for this batch's model")
        t0 = time.perf_counter()
        # before the prefill: it may fail
        constraint = g.grammar.matcher(target) if g.grammar is not None else None
        seq = self.prefill(prompt, seq, stats, interrupted)
        x = list(prompt)
        notice = g.drafter.start(x, constraint) if g.drafter is not None else None
        self.free.remove(seq)  # taken once nothing more can fail
        if stats is not None:
            stats.prompt_seconds = time.perf_counter() - t0
        stream = None if stop is None else TextStream(target, stop)
        self.active[seq] = loop = Loop(g, x, ROWS, stats, stream, constraint, notice)
        # (a spare sequence for each leaf of its trees: the siblings' and the chain's end)
        loop.tree_cap = min(loop.tree_cap, max(0, len(self.spares[seq]) - 1))
        return seq

    def warm(self, prompt: Sequence[int], seq: int | None = None,
             stats: Stats | None = None) -> int:
        """The prompt into a free sequence's cache (`prefill`), nothing generated (an /infill with
        n_predict 0: an editor warming it); the sequence stays free, the last used. Its seq id."""
        seq = self.prefill(prompt, seq, stats)
        self.left[seq], self.n_left = self.n_left, self.n_left + 1
        return seq

    def prefill(self, prompt: Sequence[int], seq: int | None, stats: Stats | None,
                interrupted: Callable[[], bool] = never) -> int:
        """The prompt but its last token into free sequence `seq` (None: the one `pick` picks),
        which keeps the longest prefix its cache shares with the prompt and decodes the rest, a
        batch at a time (`interrupted()` true between them raises KeyboardInterrupt); its seq id.
        `stats` counts the prompt's tokens and those decoded."""
        target = self.target
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) > target.n_ctx_seq:
            raise EngineError(f"the prompt has {len(prompt)} tokens but a sequence holds only "
                              f"{target.n_ctx_seq}")
        seq = self.pick(prompt) if seq is None else seq
        if seq not in self.free:
            raise EngineError(f"sequence {seq} is busy")
        freeze_startup_objects()
        x = list(prompt)
        kept = shared_prefix(target.seqs[seq], x[:-1])
        if not target.rollback(kept, seq):  # a cache that cannot drop a part: emptied
            target.rollback(0, seq)
            kept = 0
        for start in range(kept, len(x) - 1, target.n_batch):
            if interrupted():
                raise KeyboardInterrupt
            target.eval_seqs([(seq, x[start : min(len(x) - 1, start + target.n_batch)])],
                             logits=False)
        if stats is not None:
            stats.n_prompt_tokens, stats.n_prefilled = len(x), len(x) - 1 - kept
        return seq

    def leave(self, seq: int) -> None:
        """Sequence `seq` out of the batch, its seq id free again; its cache stays for the next
        prompt that shares a prefix with it."""
        self.active.pop(seq).finish()
        self.free.append(seq)
        self.left[seq], self.n_left = self.n_left, self.n_left + 1

    def interrupt(self, seq: int) -> list[Step]:
        """Sequence `seq` ended between steps (its client left, the server stops): its last step,
        with any text held back for a stop string, and it leaves the batch."""
        steps = list(self.active[seq].interrupt())
        self.leave(seq)
        return steps

    def close(self) -> None:
        """Every sequence out of the batch, its cache emptied."""
        for seq in list(self.active):
            self.leave(seq)
        self.target.drop_tree()
        for seq in range(self.target.n_seq_max):
            self.target.rollback(0, seq)

    def step(self) -> dict[int, Step]:
        """One decode for every active sequence, each one's step as Loop.steps makes it (plan, the
        pass, accept, settle), its room bounded by its share of the batch too; each one's Step by
        seq id. A sequence whose step finished it (finish_reason set) has left the batch."""
        target, out = self.target, dict[int, Step]()
        plans = self.plan(out)
        if plans:
            t0 = time.perf_counter()
            starts = target.eval_seqs([(seq, self.active[seq].batch(p))
                                       for seq, p in plans.items()], spares=self.spares)
            n_rows = sum(p.rows for p in plans.values())
            self.n_steps, self.n_rows = self.n_steps + 1, self.n_rows + n_rows
            self.n_seq_steps += len(plans)
            rows = {seq: Rows(target, seq, start) for seq, start in zip(plans, starts)}
            for seq, p in plans.items():  # every sequence's rows read before any roll-back
                self.active[seq].accept(rows[seq], p)
            # a decode of one sequence is a one-sequence verification: its cost is one's
            for seq, p in plans.items():
                out[seq] = self.active[seq].settle(p, rows[seq], t0, alone=len(plans) == 1)
            # (a tree's decode does more than rows: Loop.observe)
            if len(plans) > 1 and all(p.tree is None for p in plans.values()):
                self.observe(plans, n_rows, time.perf_counter() - t0)
        for seq, step in out.items():
            if step.finish_reason:
                self.leave(seq)
        return out

    def plan(self, out: dict[int, Step]) -> dict[int, Plan]:
        """Every active sequence's drafts, priced together: the sequences that share a controller
        have their lengths chosen by it at once (Controller.pick_together), each sequence's row
        priced at what it adds to the batch's decode; a sequence whose context is full gets its
        last step in `out` instead."""
        share = self.target.n_batch // max(1, len(self.active)) - 1  # drafts a sequence may add
        offers: dict[int, Offered] = {}
        for seq, loop in self.active.items():
            o = loop.offer(self.target.n_ctx_seq, share)
            if o is None:
                out[seq] = loop.last("context")
            else:
                offers[seq] = o
        plans = {}
        for ctl, seqs in self.by_controller(offers):
            loops = [self.active[seq] for seq in seqs]
            picks = ctl.pick_together([(offers[seq].keys, loop.temp, offers[seq].limit)
                                       for seq, loop in zip(seqs, loops)],
                                      others=len(offers) - len(seqs),
                                      costs=self.table(len(offers), ctl))
            for seq, loop, keys in zip(seqs, loops, picks):
                plans[seq] = loop.draft(offers[seq], keys, audited=len(offers) == 1, tree=False)
        self.grow(plans)
        return plans

    def grow(self, plans: dict[int, Plan]) -> None:
        """Each sequence's chain made a draft tree where its controller prices siblings worth their
        rows in the batch's decode (Loop.grow, beside the other sequences' rows), within the
        batch's n_batch and the cells the one KV buffer has left."""
        target = self.target
        rows = sum(p.rows for p in plans.values())
        cells = target.n_ctx_total - sum(len(target.seqs[s]) for s in range(self.slots)) - rows
        expected: dict[int, dict[int, float]] = {}  # by controller: each plan's tokens as expected
        for seq, p in plans.items():
            loop = self.active[seq]
            if not loop.tree_cap:
                continue
            if id(loop.ctl) not in expected:
                expected[id(loop.ctl)] = {s: loop.ctl.expected(q.chain_keys)
                                          for s, q in plans.items()}
            mine = expected[id(loop.ctl)]
            beside = Beside(rows - p.rows, sum(mine.values()) - mine[seq],
                            self.table(len(plans), loop.ctl))
            loop.grow(p, min(target.n_batch - rows, cells), beside)
            rows, cells = rows + p.siblings, cells - p.siblings

    def by_controller(self, seqs: Iterable[int]) -> list[tuple[Controller, list[int]]]:
        """The sequences `seqs` by the controller that picks their drafts."""
        groups: dict[int, tuple[Controller, list[int]]] = {}
        for seq in seqs:
            ctl = self.active[seq].ctl
            groups.setdefault(id(ctl), (ctl, []))[1].append(seq)
        return list(groups.values())

    def observe(self, plans: dict[int, Plan], n_rows: int, seconds: float) -> None:
        """A decode of several sequences' `n_rows` rows took `seconds` (logprobs aside): the
        price of that many rows, for the controllers they share (a seeded sequence's own untimed
        one learns nothing of it)."""
        seconds -= sum(p.logprob_seconds for p in plans.values())
        for ctl, _ in self.by_controller(plans):
            self.table(len(plans), ctl).observe_verify(n_rows, seconds)

    def table(self, n_seqs: int, ctl: Controller) -> Costs:
        """What a decode of `n_seqs` sequences' rows costs, by rows: the controller's table of
        decodes of that many (Costs.shape: its own for one), measured as the batch goes and saved
        with it. An untimed controller's table stays its own."""
        return ctl.costs.shape(n_seqs) if ctl.timed else ctl.costs
