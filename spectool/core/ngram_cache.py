"""llama-lookup's drafting rule (llama.cpp's common/ngram-cache.cpp, its context cache alone):
a fixed policy the audit (core/audit.py) replays beside the controller's picks, and drafts by
where it has been faster on the text.

The cache counts, for every n-gram of 1-4 tokens of the text so far, the tokens that followed it. A
draft grows token by token, up to a fixed most: each from the longest n-gram ending the text (and
the draft so far) whose followers pass llama.cpp's "lax" thresholds, so many seen and the most
frequent one so large a share of them; else a shorter one; else the draft ends. Drafts are a
deterministic function of the text. research/test_lab.py checks them against llama-lookup itself
(common/ngram-cache.cpp as llama-cpp-python vendors it)."""

from __future__ import annotations

from typing import Sequence

NGRAM_MAX = 4  # LLAMA_NGRAM_MAX
# common_ngram_cache_draft's lax thresholds, by n-gram size 1-4: followers seen, the top one's share
LAX_SAMPLES = (2, 2, 1, 1)
LAX_PERCENT = (66, 50, 50, 50)
# what llama-lookup drafts at most, as its examples and benchmarks/vs_llamacpp.py run it
N_DRAFT = 8


class NgramCache:
    """llama-lookup's context cache over one growing text: `draft(text)` as the text grows."""

    def __init__(self, n_draft: int = N_DRAFT):
        self.n_draft = n_draft
        self._seen: list[int] = []  # the text counted so far
        # n-gram -> {follower: count}, in the order each follower was first seen
        self._parts: dict[tuple[int, ...], dict[int, int]] = {}

    def update(self, text: Sequence[int]) -> None:
        """Count the n-grams before each token of `text` past those already counted (common_ngram_
        cache_update); anew where `text` does not extend what was counted."""
        seen = self._seen
        if len(text) < len(seen) or (seen and text[len(seen) - 1] != seen[-1]):
            self._seen, self._parts = [], {}
            seen = self._seen
        parts = self._parts
        for i in range(len(seen), len(text)):
            seen.append(text[i])
            for n in range(1, min(NGRAM_MAX, i) + 1):
                part = parts.setdefault(tuple(seen[i - n : i]), {})
                part[text[i]] = part.get(text[i], 0) + 1

    def draft(self, text: Sequence[int], limit: int | None = None) -> list[int]:
        """What llama-lookup drafts after `text` (counted first), at most `limit` (or n_draft)
        tokens."""
        self.update(text)
        most = self.n_draft if limit is None else min(limit, self.n_draft)
        context = list(text[-NGRAM_MAX:])
        out: list[int] = []
        while len(out) < most and (t := self._token(context)) is not None:
            out.append(t)
            context = (context + [t])[-NGRAM_MAX:]
        return out

    def _token(self, context: list[int]) -> int | None:
        """try_draft over the context cache: the longest n-gram first."""
        for n in range(min(NGRAM_MAX, len(context)), 0, -1):
            part = self._parts.get(tuple(context[-n:]))
            if part is None:
                continue
            # the most frequent; of those, the newest (libstdc++'s unordered_map lists it first)
            token = max(reversed(part), key=part.__getitem__)
            total = sum(part.values())
            if total >= LAX_SAMPLES[n - 1] and 100 * part[token] >= LAX_PERCENT[n - 1] * total:
                return token
        return None
