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
- online, by the controller's estimate, alone, refined by key and both as the tokens drafted so far say
  (controller_replay.online_seconds), and scaled by what key and both said over the other families against the key
  alone (their rates' ratio: what a prior for the feature would tell the controller).
A feature worth building on gains in all three, not only in hindsight. `table` is the harness: research/
text_boundary.py runs it on another candidate.
"""

from __future__ import annotations

from typing import Callable

from spectool_lab import common
from spectool_lab.replay import oracle

from spectool.core.controller import Controller

from controller_replay import K_MAX, features, hindsight_seconds, known, learnt_seconds, online_seconds, rates
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


def positions(p: list[int], y: list[int], _target=None) -> list[tuple[int, list[dict]]]:
    """controller_replay.features, each drafted token's dict given its draft's source: "where" (prompt, output or
    none) and "back" (its distance's bucket). (`table` hands the target too: text_boundary.py reads its vocabulary.)"""
    out = features(p, y)
    for j, (_, feats) in enumerate(out):
        if not feats:
            continue
        h = p + y[:j]
        at = source(h, feats[0]["n"], feats[0]["token"])
        where = "none" if at is None else "prompt" if at < len(p) else "output"
        back = -1 if at is None else sum(len(h) - at >= b for b in BACK)
        for f in feats:
            f["where"], f["back"] = where, back
    return out


FNS = {"key": lambda f: f["key"], "key, where": lambda f: (f["key"], f["where"]),
       "key, how far": lambda f: (f["key"], f["back"]), "key, both": lambda f: (f["key"], f["where"], f["back"])}


def scaled_seconds(pos: list[tuple[int, list[dict]]], cost: list[float], ratio: Callable[[dict], float]) -> float:
    """Seconds of the chooser over one prompt's positions `pos` told the controller's estimate (costs known) times
    `ratio(features)`, the controller learning as it does."""
    ctl = Controller(k_max=K_MAX, costs=known(cost))

    def learn(feats: list[dict], k: int, m: int) -> None:
        ctl.observe_accept([f["key"] for f in feats[:k]], k, min(k, m))

    return learnt_seconds(pos, cost, lambda f: min(1.0, ctl.acceptance(f["key"]) * ratio(f)), learn)


def ratios(others: list, fn: Callable[[dict], object]) -> Callable[[dict], float]:
    """What the feature combination `fn` says over `others` (prompts' positions) against lookup's key alone: the
    ratio of their rates (1 where either is unmeasured)."""
    fine, coarse = rates(others, fn), rates(others, FNS["key"])

    def ratio(f: dict) -> float:
        a, b = fine.get(fn(f)), coarse.get(f["key"])
        return a / b if a and b else 1.0

    return ratio


def table(doc: str, annotate: Callable, fns: dict[str, Callable[[dict], object]], name: str) -> None:
    """The harness: per model and family, each chooser's share of the oracle, with lookup's drafted tokens'
    features from `annotate(prompt, output, target)` (positions' form), refined by each of `fns` in hindsight and
    by fns[name] from the other families' rates and online."""
    args, seed = options(doc)
    best = fns[name]
    print(f"{common.machine(2)}; seed {seed}; each chooser's share of the oracle over lookup's drafts (the oracle's "
          "seconds over its own), the family's prompts pooled\n")
    print("| model | family | hindsight: key | " + " | ".join(fns) + f" | other families': key | {name} | online: "
          f"estimate | refined by {name} | scaled by the other families' {name} |\n|---|---|"
          + "---:|" * (len(fns) + 6))
    by_model: dict[str, dict] = {}
    for model, fam, data, cost, _, _, target in each_family(args, seed):
        data = [(p, y) for p, y in data if len(y) > 1]
        by_model.setdefault(model, {})[fam] = ([annotate(p, y, target) for p, y in data], cost,
                                               sum(oracle(p, y, cost, K_MAX) for p, y in data))
    for model, fams in by_model.items():
        for fam, (pos, cost, bound) in fams.items():
            others = [ps for f, (o, _, _) in fams.items() if f != fam for ps in o]
            cells = [sum(hindsight_seconds(ps, cost, fn) for ps in pos) for fn in (FNS["key"], *fns.values())]
            cells += [sum(hindsight_seconds(ps, cost, fn, rates(others, fn)) for ps in pos)
                      for fn in (FNS["key"], best)]
            cells += [sum(online_seconds(ps, cost, fn) for ps in pos) for fn in (None, best)]
            cells.append(sum(scaled_seconds(ps, cost, ratios(others, best)) for ps in pos))
            print(f"| {model} | {fam} | " + " | ".join(f"{bound / c:.1%}" for c in cells) + " |", flush=True)


def main() -> None:
    table(__doc__, positions, {k: v for k, v in FNS.items() if k != "key"}, "key, both")


if __name__ == "__main__":
    main()
