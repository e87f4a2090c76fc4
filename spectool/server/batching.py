"""`--parallel N`: the generations under way decoded together, one step at a time for all of them
(generate/batch.py), by one thread of their own. A request's worker thread hands its generation to
that thread and reads the steps back, as it would read them from the one-sequence loop; a
generation joins at the next step boundary, and one whose client left or whose server stops ends
there. Each generation drafts with a prompt lookup of its own (drafters/builder.py's Policy builds
it so); the corpus, the controller and its cost table stay the session's, shared by all: the
controller prices every sequence's drafts together (generate/batch.py).

A sequence keeps its cache when its generation ends: the server puts a request on the free slot
whose cache shares the longest prefix with its prompt (Batch.pick), and that sequence prefills only
the rest.

Not yet (issue 48): a long prompt is prefilled whole when its generation joins, holding up the
others' steps for that long.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

from spectool.core.stats import Stats
from spectool.generate.batch import Batch
from spectool.generate.loop import GenerationConfig, Step
from spectool.llama.engine import Model
from spectool.llama.parallel import ParallelModel

BATCH_THREAD = "spectool-batch"


@dataclass
class Member:
    """A generation handed to the batch: what it needs, and where its steps go (a Step, then None;
    or an exception)."""

    gen: GenerationConfig
    tokens: list[int]
    stop: list[str]
    stats: Stats
    interrupted: Callable[[], bool]
    seq: int  # the sequence (the server's slot) it joins
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)


class Batcher:
    """The thread that steps the batch for every generation under way."""

    def __init__(self, target: Model, slots: int | None = None):
        if not isinstance(target, ParallelModel):
            raise ValueError("decoding sequences together needs a ParallelModel")
        self.batch = Batch(target, slots)  # (the rest of its sequences: trees' leaves)
        self.joining: queue.SimpleQueue[Member | None] = queue.SimpleQueue()  # None: close
        self.members: dict[int, Member] = {}
        self.thread = threading.Thread(target=self.drive, daemon=True, name=BATCH_THREAD)
        self.thread.start()

    def close(self) -> None:
        """End the batch thread once it has nothing under way. Its decodes ran on OpenMP threads of
        its own (llama.cpp's CPU backend keeps a team per calling thread); while they live, libgomp
        counts more threads than cores and every other team's threads sleep between decodes instead
        of waiting awake, which made a tiny model's decodes on the main thread about 10x slower
        (research/notes/2026-12-06-run-to-run.md). The thread's end frees them."""
        self.joining.put(None)
        self.thread.join()

    def generate(self, gen: GenerationConfig, tokens: list[int], stop: list[str], stats: Stats,
                 interrupted: Callable[[], bool], seq: int) -> Iterator[tuple[str, Step]]:
        """In a worker thread: the generation's (text, step) pairs as the batch makes them, as
        generate_text hands them over; it joins sequence `seq` (the server's slot: Batch.pick's
        choice), free once the generation before it there has ended."""
        member = Member(gen, tokens, stop, stats, interrupted, seq)
        self.joining.put(member)
        while (item := member.out.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item.text, item

    def warm(self, gen: GenerationConfig, tokens: list[int], stats: Stats, seq: int) -> None:
        """In a worker thread: the prompt into sequence `seq`'s cache, nothing generated
        (Batch.warm), once the batch's thread comes to it."""
        member = Member(gen, tokens, [], stats, lambda: False, seq)
        self.joining.put(member)
        if isinstance(item := member.out.get(), BaseException):
            raise item

    def drive(self) -> None:
        """Until closed with nothing under way: let in the generations that came, step them all,
        hand each its step."""
        waiting: list[Member] = []
        closing = False
        while not (closing and not self.members and not waiting):
            # nothing under way: wait for a generation
            came = [self.joining.get()] if not self.members and not waiting else []
            while not self.joining.empty():
                came.append(self.joining.get())
            closing = closing or None in came
            waiting += [m for m in came if m is not None]
            for m in [m for m in waiting if m.seq in self.batch.free]:
                waiting.remove(m)
                self.join(m)
            try:
                steps = self.batch.step() if self.members else {}
            except Exception as e:  # noqa: BLE001 - each generation's worker answers a 500
                for seq in list(self.members):
                    self.end(seq, e)
                self.batch.close()
                continue
            for seq, step in steps.items():
                self.hand(seq, [step])
            for seq, member in list(self.members.items()):
                if member.interrupted():
                    self.hand(seq, self.batch.interrupt(seq), ended=True)

    def join(self, m: Member) -> None:
        try:
            if m.gen.max_tokens == 0:  # warm (an /infill with n_predict 0)
                self.batch.warm(m.tokens, m.seq, m.stats)
                m.out.put(None)
                return
            self.members[self.batch.join(m.gen, m.tokens, m.stats, m.stop, m.seq,
                                         m.interrupted)] = m
        # its worker answers it; a KeyboardInterrupt: the client left during the prefill
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001
            m.out.put(e)

    def hand(self, seq: int, steps: list[Step], ended: bool = False) -> None:
        """A sequence's steps to its worker; the end too where the last ended it."""
        for step in steps:
            self.members[seq].out.put(step)
        if ended or (steps and steps[-1].finish_reason):
            self.end(seq, None)

    def end(self, seq: int, error: Exception | None) -> None:
        self.members.pop(seq).out.put(error)
