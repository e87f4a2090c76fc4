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
and renamed (models/store.py), so a crash leaves the old file or the new one, and two processes that
share it merge their documents into it, one save at a time (a lock file beside it). Reading it never
fails: a file that is not a lookup cache is a one-line warning and an empty corpus, and is never
overwritten; one of ours that is cut short, damaged, too large for its bound, or made with another
vocabulary is a one-line warning and a fresh start.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
from collections import deque
from dataclasses import dataclass
from typing import Iterator, Sequence

from spectool.drafters.lookup import NGramIndex, vote

# the longest n-gram the corpus keeps: lookup's longest match bucket (evidence.BUCKETS)
CORPUS_N_MAX = 8
# an older dispute weighs this much less with each new one (`judge`): about the last 50 count
DISPUTE_DECAY = 0.98
FORMAT, VERSION = "spectool-lookup-cache", 1
# how a cache file of ours begins (`save` writes its format first): one that does not is left
# alone, unless it is empty or cut short inside these first bytes (HEADER, as `save` writes them)
OURS = re.compile(rb'\s*\{\s*"format"\s*:\s*"spectool-lookup-cache"')
HEADER = b'{"format":"spectool-lookup-cache"'
# a token's id takes at most 8 bytes of the file (below 0x110000, and a comma): a file over twice
# that for the corpus's bound, and over 16 MiB, is not read
FILE_BYTES_PER_TOKEN, FILE_BYTES_MIN = 16, 1 << 24


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
        self.n_read = 0  # how many of `docs` (the first) were read from its file and not saved

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
            self.n_read = min(self.n_read, len(self.docs) - 1)  # a new document now
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
            self.n_read = max(0, self.n_read - 1)

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
        the file could not be used (an empty corpus then: `read_cache`). A missing file is a first
        run: an empty corpus, no warning."""
        corpus, cached = cls(max_tokens), read_cache(path, vocab, max_tokens)
        corpus.writable = cached.ours
        for doc in cached.docs:
            corpus.add(doc)
        corpus.n_read = len(corpus.docs)
        if cached.won is not None:
            corpus.won = cached.won
        return corpus, cached.warning

    def save(self, path: str | os.PathLike, vocab: str) -> str | None:
        """Write the corpus to `path`, merged with what the file holds now (another process may
        have saved to it since this one read it): under a lock (`locked`), the file's documents,
        then this corpus's new ones (those not read from the file), as many as the corpus keeps
        (`kept`), written whole and renamed, with this corpus's tally of disputes. A one-line
        warning where it could not be written."""
        from spectool.models.store import write_json_atomic

        if not self.writable:  # the file was not ours
            return None
        try:
            with locked(path):
                cached = read_cache(path, vocab, self.max_tokens)
                if not cached.ours:  # it is not ours any more
                    return cached.warning
                mine = list(itertools.islice(self.docs, self.n_read, None))
                write_json_atomic(path, {"format": FORMAT, "version": VERSION, "vocab": vocab,
                                         "documents": kept(cached.docs + mine, self.max_tokens),
                                         "won": self.won}, indent=None)
        except OSError as e:
            return f"--lookup-cache {path}: could not write it ({e.strerror})"
        self.n_read = len(self.docs)  # all in the file now: a second save adds none of them again
        return None


@dataclass
class Cached:
    """What a cache file holds for one vocabulary: its documents, the disputes' tally (None where
    it has no valid one), a one-line warning where the file could not all be used, and whether it
    may be replaced (False: it is not a lookup cache of ours, or cannot be read)."""
    docs: list[list[int]]
    won: list[float] | None = None
    warning: str | None = None
    ours: bool = True


def read_cache(path: str | os.PathLike, vocab: str, max_tokens: int) -> Cached:
    """The cache file at `path` as far as it can be used. Never fails: a file that is not one of
    ours is a warning and left alone; one of ours (it begins as `save` writes it, or is empty or
    cut short within that beginning) that is cut short, damaged, over the size a corpus of
    `max_tokens` tokens takes (FILE_BYTES_PER_TOKEN: only that much is read), of another version
    or vocabulary is a warning and a fresh start, and replaced."""
    where = f"--lookup-cache {path}"
    limit = max(FILE_BYTES_MIN, FILE_BYTES_PER_TOKEN * max_tokens)
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except FileNotFoundError:
        return Cached([])
    except OSError as e:
        return Cached([], warning=f"{where}: cannot read it ({e.strerror}); not using or writing "
                                  "a lookup cache", ours=False)
    if not OURS.match(raw) and not HEADER.startswith(raw.strip()):
        return Cached([], warning=f"{where}: not a spectool lookup cache; left as it is (delete "
                                  "it, or name another file)", ours=False)
    if len(raw) > limit:
        return Cached([], warning=f"{where}: over {limit} bytes, more than a corpus of "
                                  f"{max_tokens} tokens takes (--lookup-corpus-size); "
                                  "starting anew")
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        obj = None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        return Cached([], warning=f"{where}: empty or damaged (cut short?); starting anew")
    if obj.get("version") != VERSION:
        return Cached([], warning=f"{where}: a lookup cache of another version "
                                  f"({obj.get('version')!r}); starting anew")
    if obj.get("vocab") != vocab:
        return Cached([], warning=f"{where}: made with another model's vocabulary; starting anew")
    docs = obj.get("documents")
    if not isinstance(docs, list) or not all(
            isinstance(d, list) and all(type(t) is int and 0 <= t < 0x110000 for t in d)
            for d in docs):
        return Cached([], warning=f"{where}: its documents are broken; starting anew")
    won = obj.get("won")  # the disputes' tally (`judge`); a file without one starts it anew
    if not (isinstance(won, list) and len(won) == 2
            and all(type(w) in (int, float) and 0 <= w < 1e9 for w in won)):
        return Cached(docs)
    return Cached(docs, [float(w) for w in won])


def kept(docs: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The documents a corpus of `max_tokens` tokens keeps of `docs`, added oldest first, by
    Corpus.add's rules: each one's last `max_tokens` tokens, one that extends the last replacing
    it, the oldest out first."""
    out: list[list[int]] = []
    for doc in docs:
        doc = doc[-max_tokens:]
        if out and len(doc) > len(out[-1]) and doc[: len(out[-1])] == out[-1]:
            out[-1] = doc
        elif doc:
            out.append(doc)
    n, first = sum(map(len, out)), 0
    while n > max_tokens:
        n -= len(out[first])
        first += 1
    return out[first:]


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """One process's save to `path` at a time: an exclusive lock (fcntl.flock) on FILE.lock beside
    it, a file of its own because the rename replaces the cache's; no lock where there is no
    fcntl."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(f"{os.fspath(path)}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def vocab_tag(texts: Sequence[bytes], kind: int = 0) -> str:
    """A short fingerprint of a vocabulary (VocabInfo's type and token texts): a cache's ids mean
    the same text only under the vocabulary it was made with."""
    h = hashlib.sha256(f"{kind}:{len(texts)}:".encode())
    for t in texts:
        h.update(len(t).to_bytes(4, "little"))
        h.update(t)
    return h.hexdigest()[:32]
