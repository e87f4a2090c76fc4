"""Whether the text just before a drafted token tells a copy that goes on from one that stops (issue 57, item 2):
lookup's keys refined by what the token before each drafted one ends with, on copy_source.py's harness.

    python research/text_boundary.py [--models gemma-f16,smollm2] [--families qa,raw] [--prompts 8] [--seed N]

The fourth candidate for the evidence research/notes/2026-12-06-mean-bound.md finds missing, after the target's
margin, each model's own priors and the copy's source: copies often stop where the text does, at a line's or a
sentence's end (a quoted sentence ends, a code line is rewritten). Each drafted token is marked by the token before
it (the context's last for the first, the draft's own before the others): its text ends a line ("line": holds a
newline), a sentence or clause (". ! ? : ;"), at other punctuation or space ("punct"), or in a word ("word");
"boundary" keeps only whether it is one of the first two. copy_source.table's columns: in hindsight, from the
other families' rates, online and scaled by the other families' ratio to the key alone.
"""

from __future__ import annotations

import re

from controller_replay import features
from copy_source import table


def ending(piece: bytes) -> str:
    """What a token's text ends with: "line", "sentence", "punct" or "word"."""
    s = piece.decode("utf-8", "replace")
    if "\n" in s:
        return "line"
    if re.search(r"[.!?:;]\s*$", s):
        return "sentence"
    return "punct" if not s.strip() or re.search(r"[,()\[\]{}\"'`]\s*$", s) else "word"


def positions(p: list[int], y: list[int], target) -> list[tuple[int, list[dict]]]:
    """controller_replay.features, each drafted token's dict given "after": what the token before it ends with."""
    out, seen = features(p, y), {}

    def end(t: int) -> str:
        if t not in seen:
            seen[t] = ending(target.piece(t, special=True))
        return seen[t]

    for j, (_, feats) in enumerate(out):
        before = y[j - 1] if j else p[-1]
        for f in feats:
            f["after"], before = end(before), f["token"]
    return out


TEXT = {"key, after": lambda f: (f["key"], f["after"]),
        "key, boundary": lambda f: (f["key"], f["after"] in ("line", "sentence"))}


def main() -> None:
    table(__doc__, positions, TEXT, "key, after")


if __name__ == "__main__":
    main()
