"""A draft model with another vocabulary than the target's, drafting through text (Hugging Face's
Universal Assisted Generation): the history's text is kept in the draft's vocabulary, the draft's
greedy tokens become text, and that text becomes the target's tokens.

- The draft reads the history as text: the target's tokens' bytes (control tokens render as
  nothing), encoded in its own vocabulary. Only the text past what both still share is encoded
  again at each step, from a token boundary a little before it, so the draft's KV cache rolls back
  to the text the target accepted and decodes the rest.
- Its drafts are its greedy choices, decoded to bytes. A character whose bytes are not all there
  yet, and the last target token of the text (more draft text may extend it), are held back until
  the text is whole; the draft decodes on until the text makes one target token more than the step
  asked for (or it ends, or has drafted twice that many tokens and two more).
- A text becomes the target's tokens as the target's tokenizer encodes it after the history's last
  few tokens' text (`following`): where the history's last token would merge with the draft's text
  (a word split across the two), it is encoded after a newline instead, as a continuation of the
  token the target already has.

The proposals are deterministic (q one-hot): the loop verifies them as it verifies prompt
lookup's, sampling the target's row and following the proposal while it matches, which keeps the
target's distribution exactly. Their tokens are counted under the draft model's key (DRAFT), so
the controller prices them from their measured cost and acceptance like any draft model's.
"""

from __future__ import annotations

import bisect
import time
from typing import Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.evidence import DRAFT, Evidence, Source
from spectool.core.grammar import Constraint
from spectool.core.protocol import EMPTY, Draft, Drafter, Estimate, no_grammar
from spectool.core.verify import Random, Sampling
from spectool.llama.engine import Model, shared_prefix
from spectool.llama.outputs import Logits
from spectool.llama.vocab import Facts

ANCHOR = 4  # tokens of text before a re-encoded text, that it is encoded after
MARGIN = 2  # the draft's last tokens of the shared text encoded again (a merge may change them)


def whole(data: bytes) -> str:
    """The longest prefix of `data` that is whole UTF-8 characters, as text."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="ignore")


def following(vocab: Facts, anchor: str, text: str) -> list[int]:
    """`text`'s tokens in `vocab` as its tokenizer encodes them after `anchor`: those of anchor +
    text past the anchor's own, where the anchor's come first unchanged; else (the two merge at
    the boundary) those after a newline."""
    for before in (anchor, "\n"):
        a = vocab.tokenize(before, add_special=False)
        both = vocab.tokenize(before + text, add_special=False)
        if both[: len(a)] == a:
            return both[len(a) :]
    return vocab.tokenize(text, add_special=False)


class TextDraft(Drafter):
    """A draft model whose vocabulary is not the target's, drafting through text (see the
    module)."""

    def __init__(self, model: Model, target: Facts):
        self.model, self.target = model, target
        self._seen: list[int] = []  # the target's tokens whose text ...
        self._text = b""  # ... this is
        self._tokens: list[int] = []  # that text in the draft's tokens, after its BOS (if any) ...
        self._ends: list[int] = []  # ... each one's end in it (bytes)

    def start(self, history: Sequence[int], constraint: Constraint | None = None) -> None:
        no_grammar(constraint)
        self._sync(history, logits="none")  # the prompt is prompt processing, not drafting

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> list[Evidence]:
        return [DRAFT] * max(0, min(k_max, self.model.n_ctx - len(self._tokens) - 1))

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: Random,
                constraint: Constraint | None = None) -> Draft:
        no_grammar(constraint)
        t0 = time.perf_counter()
        caught_up = self._sync(history)
        if k <= 0 or not self.model.tokens:  # nothing asked, or no text yet
            return EMPTY
        catch_up = time.perf_counter() - t0 if caught_up > 2 else 0.0
        tokens = self._draft(k, self._anchor())
        return Draft(tokens, None, Source.draft, catch_up) if tokens else EMPTY

    # -- the history as the draft's text
    # --------------------------------------------------------------------------------------
    def _history_text(self, history: Sequence[int]) -> None:
        """`_text` the bytes of `history` (the target's tokens), extended where the history
        extends what was seen, else made anew."""
        n = len(self._seen)
        if n > len(history) or self._seen != list(history[:n]):
            self._seen, self._text, n = [], b"", 0
        new = list(history[n:])
        self._seen += new
        self._text += b"".join(self.target.piece(t) for t in new)

    def _sync(self, history: Sequence[int], logits: Logits = "last") -> int:
        """The draft's cache holds the history's text (its BOS first, where it adds one); how many
        tokens it decoded."""
        old = self._text
        self._history_text(history)
        shared = len(old) if self._text.startswith(old) else shared_prefix(old, self._text)
        keep = max(0, bisect.bisect_right(self._ends, shared) - MARGIN)  # (ends ascend)
        start = self._ends[keep - 1] if keep else 0
        rest = whole(self._text[start:])  # (a character not yet whole waits for its bytes)
        anchor = whole(self._text[max(0, start - 16 * ANCHOR) : start]) if keep else ""
        new = following(self.model, anchor, rest) if keep else \
            self.model.tokenize(rest, add_special=False)
        self._tokens = self._tokens[:keep] + new
        self._ends = self._ends[:keep]
        for t in new:
            self._ends.append((self._ends[-1] if self._ends else 0) + len(self.model.piece(t)))
        return self.model.sync(self._held(), logits=logits)

    def _held(self) -> list[int]:
        """What the draft's cache is to hold: its BOS, where it adds one, and the history's text."""
        return self.model.tokenize("", add_special=True) + self._tokens

    def _anchor(self) -> str:
        """The text of the history's last ANCHOR tokens, whole characters from a clean start."""
        tail = b"".join(self.target.piece(t) for t in self._seen[-ANCHOR:])
        while tail and tail[0] & 0xC0 == 0x80:  # a character begun in an earlier token
            tail = tail[1:]
        return whole(tail)

    # -- drafting
    # -------------------------------------------------------------------------------------------
    def _draft(self, k: int, anchor: str) -> list[int]:
        """Up to k target tokens of the draft's greedy text (see the module)."""
        m, data = self.model, b""
        out: list[int] = []
        for _ in range(2 * k + 2):
            if len(m.tokens) >= m.n_ctx:
                break
            t = int(np.argmax(m.logits(-1)))
            if m.is_eog(t):
                return out[:k]  # the draft's text is whole: nothing held back
            m.eval([t])
            data += m.piece(t)
            out = following(self.target, anchor, whole(data))
            if len(out) > k:
                break
        return out[: min(k, len(out) - 1)]

