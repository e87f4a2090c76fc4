"""Text out of the loop's steps: detokenized incrementally, held back where it could still become a
stop string."""

from __future__ import annotations

from typing import Sequence

from spectool.llama.engine import Model


class TextStream:
    """Detokenizes steps into text, holding back what could still become a stop string."""

    def __init__(self, model: Model, stop: Sequence[str] = ()):
        self.detok = model.detokenizer()
        self.stop = [s for s in stop if s]
        self.pending = ""
        self.stopped: str | None = None  # the stop string that ended the text, once one has

    def feed(self, tokens: Sequence[int]) -> str:
        """The text that is final after `tokens`; sets `stopped` to the stop string that appeared,
        if one did."""
        self.pending += self.detok.feed(tokens)
        if not self.stop:
            out, self.pending = self.pending, ""
            return out
        hits = [(i, s) for i, s in ((self.pending.find(s), s) for s in self.stop) if i >= 0]
        if hits:
            first, self.stopped = min(hits, key=lambda hit: hit[0])
            out, self.pending = self.pending[:first], ""
            return out
        hold = max((n for s in self.stop for n in range(1, len(s)) if self.pending.endswith(s[:n])),
                   default=0)
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        out = "" if self.stopped else self.pending + self.detok.flush()
        self.pending = ""
        return out

    def ending(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, were they to come next, reach the end of the first stop string they
        complete (all of them where none does); the stream is left as it was."""
        if not self.stop:
            return len(tokens)
        text = self.pending
        for i, piece in enumerate(self.detok.ahead(tokens)):
            text += piece
            if any(s in text for s in self.stop):
                return i + 1
        return len(tokens)

    def step(self, new: list[int], finish: str | None,
             n_acc: int) -> tuple[list[int], str | None, str, int]:
        """A step's text: its `new` tokens and finish reason cut where a stop string appeared, the
        text, and how many of its characters came from the step's first `n_acc` tokens (accepted
        drafts); the text held back comes out where the step ends the generation."""
        text, draft_chars = "", 0
        for i, token in enumerate(new):
            text += self.feed([token])
            draft_chars = len(text) if i < n_acc else draft_chars
            if self.stopped:
                new, finish = new[: i + 1], "stop"
                break
        if finish and not self.stopped:
            text += self.flush()
        return new, finish, text, draft_chars
