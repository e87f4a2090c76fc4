"""The lookup corpus: one n-gram index over earlier requests' prompts and outputs, beside each
request's own (SuffixDecoding's global index, arXiv 2411.04975, kept as n-grams), and its file for
`run --lookup-cache`.

Each finished generation is one document (its prompt and output): n-grams never span two documents.
The corpus is bounded in tokens; the oldest documents go first, each n-gram they added counted once
less. A document that extends the last one (a chat's next turn, an agent that resends its
conversation with one more message) replaces it, and only its new tokens are indexed. Followers keep
their counts across documents, so where the corpus has seen a context continue several ways it
drafts the most frequent continuation, and the keys say how far the followers agreed
(PromptLookup.key).

Where the corpus's match is longer than the request's own, the corpus's token is drafted, but only
while the corpus has earned that rank: PromptLookup tells it, each time the two predicted different
tokens and the target then wrote one of them, which one was right (`judge`), and a longer match in
the corpus outranks the request's own text while the corpus was right at least as often as the
request's own text in those disputes, the recent ones weighing more (`outranks`). Requests that
repeat each other's text keep it outranking (on agentic.py's workloads the corpus won about 9
disputes in 10); unrelated ones (run.py's single sets: 1 in 6) soon hand the rank back to each
request's own text.

The file is JSON, versioned and tagged with the vocabulary it was made with, and keeps the disputes'
tally beside the documents, so that `run --lookup-cache` learns it across runs; it is written whole
and renamed (models/store.py), so a crash leaves the old file or the new one. Reading it never
fails: a file that is not a lookup cache, is broken, or was made with another vocabulary is a
one-line warning and an empty corpus (a file that is not one of ours is then never overwritten).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from pathlib import Path
from typing import Sequence

from spectool.drafters.lookup import NGramIndex, vote

# the longest n-gram the corpus keeps: lookup's longest match bucket (evidence.BUCKETS)
CORPUS_N_MAX = 8
# an older dispute weighs this much less with each new one (`judge`): about the last 50 count
DISPUTE_DECAY = 0.98
FORMAT, VERSION = "spectool-lookup-cache", 1


class Corpus:
    """Documents (token lists) in one NGramIndex, at most `max_tokens` tokens of them, oldest out
    first."""

    def __init__(self, max_tokens: int, n_min: int = 1, n_max: int = CORPUS_N_MAX, pick=vote):
        if max_tokens < 1:
            raise ValueError("a corpus holds at least one token")
        self.max_tokens = max_tokens
        # which follower of a match it drafts: lookup.vote (the most frequent) or lookup.latest
        self.vote = pick
        self.index = NGramIndex(n_min, n_max)
        self.docs: deque[list[int]] = deque()
        self.n_tokens = 0
        # False: the file it came from is not a lookup cache, and is left as it is
        self.writable = True
        # disputes with the request's own text that the corpus won, that it lost (decayed)
        self.won = [0.0, 0.0]

    def add(self, tokens: Sequence[int]) -> None:
        """One more document: a finished generation's prompt and output (its last `max_tokens`
        tokens)."""
        doc = list(tokens[-self.max_tokens :])
        if not doc:
            return
        last = self.docs[-1] if self.docs else None
        if last is not None and len(doc) > len(last) and doc[: len(last)] == last:
            # it extends the last document: only its new n-grams
            self.index.add(doc, start=len(last))
            self.n_tokens += len(doc) - len(last)
            self.docs[-1] = doc
        else:
            self.index.add(doc)
            self.docs.append(doc)
            self.n_tokens += len(doc)
        while self.n_tokens > self.max_tokens:
            old = self.docs.popleft()
            self.index.remove(old)
            self.n_tokens -= len(old)

    def __len__(self) -> int:
        return self.n_tokens

    def judge(self, corpus_right: bool) -> None:
        """One dispute settled: where a longer match in the corpus and the request's own text
        predicted different tokens, the target wrote the corpus's (`corpus_right`) or the request's
        own."""
        won = self.won
        won[0], won[1] = won[0] * DISPUTE_DECAY, won[1] * DISPUTE_DECAY
        won[0 if corpus_right else 1] += 1.0

    def outranks(self) -> bool:
        """Whether a longer match in the corpus outranks the request's own: while the corpus has won
        at least as many of their recent disputes as it lost (so it does at first)."""
        return self.won[0] >= self.won[1]

    # -- the file (run --lookup-cache)
    # --------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike, vocab: str,
             max_tokens: int) -> tuple[Corpus, str | None]:
        """The corpus in `path` for the vocabulary `vocab` (vocab_tag), and a one-line warning where
        the file could not be used (an empty corpus then). A missing file is a first run: an empty
        corpus, no warning."""
        corpus, where = cls(max_tokens), f"--lookup-cache {path}"
        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError:
            return corpus, None
        except OSError as e:
            corpus.writable = False
            return (
                corpus,
                f"{where}: cannot read it ({e.strerror}); not using or writing a lookup cache",
            )
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            obj = None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            corpus.writable = False
            return (
                corpus,
                f"{where}: not a spectool lookup cache; left as it is "
                "(delete it, or name another file)",
            )
        if obj.get("version") != VERSION:
            return (
                corpus,
                f"{where}: a lookup cache of another version ({obj.get('version')!r}); "
                "starting anew",
            )
        if obj.get("vocab") != vocab:
            return corpus, f"{where}: made with another model's vocabulary; starting anew"
        docs = obj.get("documents")
        if not isinstance(docs, list) or not all(
                isinstance(d, list) and all(type(t) is int and 0 <= t < 0x110000 for t in d)
                for d in docs):
            return corpus, f"{where}: its documents are broken; starting anew"
        for doc in docs:
            corpus.add(doc)
        won = obj.get("won")  # the disputes' tally (`judge`); a file without one starts it anew
        if isinstance(won, list) and len(won) == 2 and all(type(w) in (int, float) and 0 <= w < 1e9
                                                           for w in won):
            corpus.won = [float(w) for w in won]
        return corpus, None

    def save(self, path: str | os.PathLike, vocab: str) -> str | None:
        """Write the corpus to `path` atomically; a one-line warning where it could not be
        written."""
        from spectool.models.store import write_json_atomic

        if not self.writable:  # the file was not ours
            return None
        try:
            write_json_atomic(path, {"format": FORMAT, "version": VERSION, "vocab": vocab,
                                     "documents": list(self.docs), "won": self.won}, indent=None)
        except OSError as e:
            return f"--lookup-cache {path}: could not write it ({e.strerror})"
        return None


def vocab_tag(texts: Sequence[bytes], kind: int = 0) -> str:
    """A short fingerprint of a vocabulary (VocabInfo's type and token texts): a cache's ids mean
    the same text only under the vocabulary it was made with."""
    h = hashlib.sha256(f"{kind}:{len(texts)}:".encode())
    for t in texts:
        h.update(len(t).to_bytes(4, "little"))
        h.update(t)
    return h.hexdigest()[:32]
