"""Whether where lookup's match was found tells a copy that goes on from one that stops (issue 57, item 2): lookup's
keys refined by the source of their match, in hindsight, from the other families' rates, and online.

    python research/copy_source.py [--models gemma-f16,smollm2] [--families qa,raw] [--prompts 8] [--seed N]

research/notes/2026-12-06-mean-bound.md found spectool's controller, replayed, about where its keys' whole-prompt
acceptance would put it, and the oracle over the same drafts far above: what is missing is evidence. A candidate:
the copy's source, the latest earlier place in the text where the matched n-gram was followed by the token lookup
drafts first. In the prompt or in the output so far, and how far back (under 16 tokens, 64, 256, or more). For each
real model and format family (rule_margin.each_family: the target's greedy outputs, this machine's batch costs), the
chooser of controller_replay.py (the best draft length for the chances it is told) over every position, as the
oracle's seconds over its own (its share of the oracle), told each token's chance:
- in hindsight, as it turned out over the same prompt, by lookup's key alone and refined by the source's place, its
  distance, and both (controller_replay.hindsight_seconds);
- from the other families' rates (pooled over their prompts), by the key and by the key with both: whether what the
  feature says carries over between formats;
- online, by the controller's estimate, alone and refined by key and both as the tokens drafted so far say
  (controller_replay.online_seconds).
A feature worth building on gains in all three, not only in hindsight.
"""

from __future__ import annotations

from spectool_lab import common
from spectool_lab.replay import oracle

from spectool.drafters.lookup import PromptLookup

from controller_replay import K_MAX, features, hindsight_seconds, online_seconds, rates
from rule_margin import each_family, options

BACK = (16, 64, 256)  # distance buckets, in tokens


def source(h: list[int], n: int, token: int) -> int | None:
    """Where the copy comes from: the position of the latest earlier `token` that followed the n-gram ending `h`
    (None where none did: lookup voted for a follower seen only before a longer n-gram's place)."""
    tail = h[len(h) - n:]
    for i in range(len(h) - n - 1, -1, -1):
        if h[i + n] == token and h[i:i + n] == tail:
            return i + n
    return None


def positions(p: list[int], y: list[int]) -> list[tuple[int, list[dict]]]:
    """controller_replay.features, each drafted token's dict given its draft's source: "where" (prompt, output or
    none) and "back" (its distance's bucket)."""
    out, lookup = features(p, y), PromptLookup()
    for j, (_, feats) in enumerate(out):
        h = p + y[:j]
        first = lookup.lookup(h, 1)[0]  # the draft's first token (features keeps only whether it was right)
        if not feats:
            continue
        at = source(h, feats[0]["n"], first[0])
        where = "none" if at is None else "prompt" if at < len(p) else "output"
        back = -1 if at is None else sum(len(h) - at >= b for b in BACK)
        for f in feats:
            f["where"], f["back"] = where, back
    return out


FNS = {"key": lambda f: f["key"], "key, where": lambda f: (f["key"], f["where"]),
       "key, how far": lambda f: (f["key"], f["back"]), "key, both": lambda f: (f["key"], f["where"], f["back"])}


def main() -> None:
    args, seed = options(__doc__)
    print(f"{common.machine(2)}; seed {seed}; each chooser's share of the oracle over lookup's drafts (the oracle's "
          "seconds over its own), the family's prompts pooled\n")
    print("| model | family | hindsight: key | key, where | key, how far | key, both | other families': key | "
          "key, both | online: estimate | refined by key, both |\n|---|---|" + "---:|" * 8)
    by_model: dict[str, dict] = {}
    for name, fam, data, cost, _, _ in each_family(args, seed):
        data = [(p, y) for p, y in data if len(y) > 1]
        by_model.setdefault(name, {})[fam] = ([positions(p, y) for p, y in data], cost,
                                              sum(oracle(p, y, cost, K_MAX) for p, y in data))
    for name, fams in by_model.items():
        for fam, (pos, cost, bound) in fams.items():
            others = [ps for f, (o, _, _) in fams.items() if f != fam for ps in o]
            cells = [sum(hindsight_seconds(ps, cost, fn) for ps in pos) for fn in FNS.values()]
            cells += [sum(hindsight_seconds(ps, cost, FNS[k], rates(others, FNS[k])) for ps in pos)
                      for k in ("key", "key, both")]
            cells += [sum(online_seconds(ps, cost, fn) for ps in pos) for fn in (None, FNS["key, both"])]
            print(f"| {name} | {fam} | " + " | ".join(f"{bound / c:.1%}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
