"""What `/metrics` reports, in Prometheus's text format: the server's totals, the request fields
that were ignored (by API and name), the slots' figures and the batch's, and the corpus's
gauges."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, fields

from spectool.server.fields import label


@dataclass
class Totals:
    """The server's counters since it started (each reported as `spectool_NAME_total`)."""

    requests: int = 0
    requests_rejected: int = 0  # 503: the queue was full
    requests_cancelled: int = 0  # the client went away mid-generation
    prompt_tokens: int = 0
    completion_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    # draft trees (--draft-tree): steps that verified one, siblings verified, paths that took one
    tree_steps: int = 0
    tree_branches: int = 0
    tree_taken: int = 0
    decode_seconds: float = 0.0

    def add(self, n_prompt: int, stats, cancelled: bool) -> None:
        """One generation's counters (its Stats), and whether its client left before it ended."""
        self.prompt_tokens += n_prompt
        self.completion_tokens += stats.n_generated
        self.drafted_tokens += stats.n_drafted
        self.accepted_tokens += stats.n_accepted
        self.decode_seconds += stats.decode_seconds
        for name in ("tree_steps", "tree_branches", "tree_taken"):
            setattr(self, name, getattr(self, name) + getattr(stats, name))
        self.requests_cancelled += cancelled

    def prometheus(self) -> str:
        lines = []
        for f in fields(self):
            value = getattr(self, f.name)
            value = round(value, 6) if isinstance(value, float) else value
            lines += [f"# TYPE spectool_{f.name}_total counter", f"spectool_{f.name}_total {value}"]
        return "\n".join(lines) + "\n"


class Ignored:
    """The request fields that asked nothing of the output (fields.py), counted by API and name:
    the names fields.py declares; any other (a client names fields at will) as `other`."""

    def __init__(self):
        self.counts: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()  # (requests are parsed in threads of their own)

    def add(self, api: str, names: list[str]) -> None:
        with self.lock:
            for name in names:
                self.counts[(api, label(api, name))] += 1

    def prometheus(self) -> str:
        with self.lock:
            counts = sorted(self.counts.items())
        return "# TYPE spectool_ignored_fields_total counter\n" + "".join(
            f'spectool_ignored_fields_total{{api="{api}",field="{name}"}} {n}\n'
            for (api, name), n in counts)


class Slots:
    """Each slot's counters since the server started (its tasks' generated, drafted and accepted
    tokens: those that ended, and the one under way), and how many slots are busy."""

    NAMES = ("completion_tokens", "drafted_tokens", "accepted_tokens")

    def __init__(self, n: int):
        self.done = [[0, 0, 0] for _ in range(n)]
        self.lock = threading.Lock()

    @staticmethod
    def counts(stats) -> tuple[int, int, int]:
        return stats.n_generated, stats.n_drafted, stats.n_accepted

    def finish(self, slot: int, task) -> None:
        """A slot's task ended: its counts join the slot's, and the slot is free."""
        with self.lock:
            task.processing = False
            self.done[slot] = [a + b for a, b in zip(self.done[slot], self.counts(task.stats))]

    def prometheus(self, tasks: list, batch=None) -> str:
        """The slots' gauges and counters (`tasks`: what each slot runs, or ran last), and the
        batch's decodes where sequences are decoded together (generate/batch.py's Batch)."""
        with self.lock:
            busy = [t is not None and t.processing for t in tasks]
            now = [[a + b for a, b in zip(done, self.counts(t.stats))] if on else done
                   for done, t, on in zip(self.done, tasks, busy)]
        lines = ["# TYPE spectool_slots gauge", f"spectool_slots {len(tasks)}",
                 "# TYPE spectool_slots_busy gauge", f"spectool_slots_busy {sum(busy)}",
                 "# TYPE spectool_slot_busy gauge",
                 *(f'spectool_slot_busy{{slot="{i}"}} {int(on)}' for i, on in enumerate(busy))]
        for j, name in enumerate(self.NAMES):
            lines += [f"# TYPE spectool_slot_{name}_total counter",
                      *(f'spectool_slot_{name}_total{{slot="{i}"}} {c[j]}'
                        for i, c in enumerate(now))]
        if batch is not None:  # (ints the batch's thread writes: each read whole)
            for name, value in (("steps", batch.n_steps), ("rows", batch.n_rows),
                                ("sequences", batch.n_seq_steps)):
                lines += [f"# TYPE spectool_batch_{name}_total counter",
                          f"spectool_batch_{name}_total {value}"]
        return "\n".join(lines) + "\n"


def corpus_metrics(corpus) -> str:
    """The corpus's gauges: its size, and its recent disputes with the requests' own text
    (drafters/corpus.py: decayed counts of those it won and lost, and whether it outranks the
    requests' own text now)."""
    won, lost = corpus.won
    return ("# TYPE spectool_lookup_corpus_tokens gauge\n"
            f"spectool_lookup_corpus_tokens {len(corpus)}\n"
            "# TYPE spectool_lookup_corpus_disputes gauge\n"
            f'spectool_lookup_corpus_disputes{{result="won"}} {won:.3f}\n'
            f'spectool_lookup_corpus_disputes{{result="lost"}} {lost:.3f}\n'
            "# TYPE spectool_lookup_corpus_outranks gauge\n"
            f"spectool_lookup_corpus_outranks {int(corpus.outranks())}\n")
