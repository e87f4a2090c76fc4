"""Whether how long the copy's source went on matching tells a copy that goes on from one that stops (issue 57,
item 2): lookup's keys refined by two runs of its source, on copy_source.py's harness.

    python research/source_run.py [--models gemma-f16,smollm2] [--families qa,raw] [--prompts 8] [--seed N]

The last candidate research/notes/2026-12-07-offer-learning.md left for the evidence the mean-bound note finds
missing. A drafted copy comes from a source (copy_source.source: the latest earlier place where the matched n-gram
was followed by the token drafted first). Two runs of that source, each bucketed:
- "after": where the same n-gram occurred once more before the source, how many tokens the text after that earlier
  occurrence went on as the text after the source did (a copy of a copy: the pair agreed that far). Each drafted
  token is marked "alone" (no earlier occurrence), "within" (its offset in the draft is inside that agreement) or
  "beyond";
- "before": how many tokens back the text so far matches the text before the source (the true match, not capped at
  lookup's n-gram lengths), in buckets of 8, 16, 32 and 64.
copy_source.table's columns: in hindsight, from the other families' rates, online, and scaled by the other
families' ratio to the key alone. A feature worth building on gains in all three.
"""

from __future__ import annotations

from controller_replay import features
from copy_source import source, table

CAP = 64  # the longest run counted either way
BEFORE = (8, 16, 32, 64)  # "before" buckets, in tokens


def agreed(h: list[int], a: int, b: int) -> int:
    """How many tokens h[a:] and h[b:] share from their start (a < b), within h and CAP."""
    n = 0
    while n < CAP and b + n < len(h) and h[a + n] == h[b + n]:
        n += 1
    return n


def matched_before(h: list[int], at: int) -> int:
    """How many tokens before position `at` match the end of h, going back (within CAP)."""
    n = 0
    while n < CAP and at - 1 - n >= 0 and h[at - 1 - n] == h[len(h) - 1 - n]:
        n += 1
    return n


def earlier(h: list[int], n: int, at: int) -> int | None:
    """The follower's position of the latest occurrence of the n-gram h[at - n:at] before it (None: none)."""
    tail = h[at - n:at]
    for i in range(at - n - 1, -1, -1):
        if h[i:i + n] == tail:
            return i + n
    return None


def positions(p: list[int], y: list[int], _target=None) -> list[tuple[int, list[dict]]]:
    """controller_replay.features, each drafted token's dict given "after" and "before" (see the module)."""
    out = features(p, y)
    for j, (_, feats) in enumerate(out):
        if not feats:
            continue
        h, n = p + y[:j], feats[0]["n"]
        at = source(h, n, feats[0]["token"])
        prev = None if at is None else earlier(h, n, at)
        went = None if prev is None or at is None else agreed(h, prev, at)
        back = 0 if at is None else matched_before(h, at)
        for i, f in enumerate(feats):
            f["after"] = "alone" if went is None else "within" if i < went else "beyond"
            f["before"] = sum(back >= b for b in BEFORE)
    return out


RUNS = {"key, after": lambda f: (f["key"], f["after"]),
        "key, before": lambda f: (f["key"], f["before"]),
        "key, both": lambda f: (f["key"], f["after"], f["before"])}


def main() -> None:
    table(__doc__, positions, RUNS, "key, after")


if __name__ == "__main__":
    main()
