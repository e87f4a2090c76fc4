"""Which controller generalizes: variants of lookup's controller replayed over the prompts and outputs that
lookup_bound.py saved, as a share of the oracle over the same drafts, on the tuning list and on unseen samples.

    python research/lookup_bound.py --seed 4401 --save /tmp/replay.json   # decodes each prompt once
    python research/controller_replay.py /tmp/replay.json [--variants base,shared]

Each variant drafts every prompt of a set with spectool's PromptLookup (the same drafts as the oracle's) and picks
its draft lengths its own way; it is charged the saved batch costs (the costs the oracle is charged). The table
gives, for each variant, the share of the oracle it makes on each set's tuning list and its mean and lowest share
over the unseen samples. A variant is worth keeping only where it raises the unseen shares without lowering the
tuning list's: the tuning list is where the priors were set. Variants "costs known" start from a cost table that
holds every batch size's saved cost, as the product's does after its first run (the cost table is kept in a file);
the others learn costs as they go, as a first run does.

A second table (--features) asks what the features of a draft's tokens could tell any controller at all: for each
prompt, each feature combination's acceptance as it turned out over that very prompt (hindsight, fit on the text it
is scored on), handed to a chooser that maximizes expected tokens per second of each step at the exact saved costs.
No estimate learnt online from those features can know more about the prompt than its own hindsight, short of
tracking changes within it; a combination fine enough to memorize the prompt (the last, with the output's length)
shows where hindsight stops being a bound and becomes a lookup table of the answers.
"""

from __future__ import annotations

import argparse
import json
import statistics
from itertools import islice
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from spectool_lab.replay import accepted, fixed, oracle, ours
from spectool.core.audit import LENGTHS
from spectool.core.controller import Controller
from spectool.core.costs import WINDOW, Costs
from spectool.core.evidence import Evidence
from spectool.drafters.lookup import PromptLookup

K_MAX = 32


@dataclass
class Streaks(Controller):
    """The controller with one more feature: how many tokens the output has copied since a draft was last
    rejected (`since`, bucketed by SINCE). Each key's estimate becomes the prior of its estimate under each bucket
    (weight `streak_weight`), so a request learns whether its long runs go on without a constant saying so."""
    streak_weight: float = 4.0
    since_buckets: tuple[int, ...] = (0, 4, 16)
    _since: int = 0
    _by_since: dict[tuple[Evidence, int], list[float]] = field(default_factory=dict)

    def _bucket(self) -> int:
        return max(b for b in self.since_buckets if b <= self._since)

    def observe_accept(self, keys: Sequence[Evidence], drafted: int, accepted: int) -> None:
        s = self._bucket()
        for i in range(min(drafted, accepted + 1)):
            c = self._by_since.setdefault((keys[i], s), [0.0, 0.0])
            c[0] = c[0] * self.decay + 1.0
            c[1] = c[1] * self.decay + (1.0 if i < accepted else 0.0)
        super().observe_accept(keys, drafted, accepted)
        self._since = self._since + accepted + 1 if accepted == drafted else 1

    def acceptance(self, key: Evidence) -> float:
        base = super().acceptance(key)
        c = self._by_since.get((key, self._bucket()))
        if c is None:
            return base
        return (c[1] + self.streak_weight * base) / (c[0] + self.streak_weight)


@dataclass
class Hindsight(Controller):
    """Not a controller but a bound on any that learns by these keys: each key's acceptance as it turned out over
    the whole of this prompt (`rates`, from `hindsight`), fixed from the first step."""
    rates: dict[Evidence, float] = field(default_factory=dict)

    def acceptance(self, key: Evidence) -> float:
        rate = self.rates.get(key)
        return super().acceptance(key) if rate is None else rate


def hindsight(p: list[int], y: list[int], k_max: int = K_MAX) -> dict[Evidence, float]:
    """Each key's acceptance over output y of prompt p: of the tokens lookup would draft under it at every
    position (its whole draft, k_max tokens), the share accepted, counting those whose predecessors were."""
    return {k: hits / tries for k, (tries, hits) in key_counts(p, y, k_max).items()}


def key_counts(p: list[int], y: list[int], k_max: int = K_MAX, counts: dict | None = None) -> dict:
    """`hindsight`'s counts, key -> [tries, hits], added to `counts` where given (pooled over prompts)."""
    lookup, counts = PromptLookup(), {} if counts is None else counts
    for j in range(len(y)):
        tokens, keys = lookup.lookup(p + y[:j], min(k_max, len(y) - j - 1))
        m = accepted(tokens, y, j)
        for i in range(min(len(tokens), m + 1)):
            c = counts.setdefault(keys[i], [0, 0])
            c[0], c[1] = c[0] + 1, c[1] + (i < m)
    return counts


@dataclass
class Variant:
    name: str
    make: Callable[[Costs], Controller]
    shared: bool = False  # one controller across a set's prompts (acceptance kept across runs)
    per_prompt: bool = False  # made for each prompt from its (prompt, output): make(costs, p, y)
    known_costs: bool = False  # the cost table holds every batch size's saved cost from the start


def variants() -> dict[str, Variant]:
    def weighted(w: float) -> Callable[[Costs], Controller]:
        def make(costs: Costs) -> Controller:
            ctl = Controller(k_max=K_MAX, costs=costs)
            ctl.priors = {k: (a, min(wt, w)) for k, (a, wt) in ctl.priors.items()}
            return ctl
        return make

    base = Variant("base", lambda c: Controller(k_max=K_MAX, costs=c))
    unaudited = Variant("no audit", lambda c: Controller(k_max=K_MAX, costs=c, audit=False))
    out = [base, unaudited, Variant("costs known", base.make, known_costs=True),
           Variant("costs known, no audit", unaudited.make, known_costs=True),
           Variant("costs known, shared", base.make, shared=True, known_costs=True),
           Variant("costs known, no probes", lambda c: Controller(k_max=K_MAX, costs=c, probe_every=1 << 30),
                   known_costs=True)]
    out += [Variant(f"costs known, weight {w:g}", weighted(w), known_costs=True) for w in (2, 4)]
    out += [Variant(f"costs known, decay {d:g}", lambda c, d=d: Controller(k_max=K_MAX, costs=c, decay=d),
                    known_costs=True) for d in (0.95, 0.9)]
    out += [Variant(f"costs known, streaks w{w:g}", lambda c, w=w: Streaks(k_max=K_MAX, costs=c, streak_weight=w),
                    known_costs=True) for w in (2, 8)]
    out += [Variant("hindsight, costs known (a bound)",
                    lambda c, p, y: Hindsight(k_max=K_MAX, costs=c, rates=hindsight(p, y)),
                    per_prompt=True, known_costs=True)]
    return {v.name: v for v in out}


def known(cost: list[float]) -> Costs:
    """A cost table that has measured every batch size at its saved cost (WINDOW times)."""
    costs = Costs()
    for _ in range(WINDOW):
        for b in range(1, len(cost)):
            costs.observe_verify(b, cost[b])
    return costs


def replay(v: Variant, data: list, cost: list[float]) -> float:
    """Seconds of variant `v` over a set's (prompt, output) pairs, in order."""
    costs, total, ctl = known(cost) if v.known_costs else Costs(), 0.0, None
    for p, y in data:
        if v.per_prompt:
            ctl = v.make(costs, p, y)  # type: ignore[call-arg]
        elif not (v.shared and ctl is not None):
            ctl = v.make(costs)
        total += ours(p, y, cost, K_MAX, costs, ctl=ctl)
    return total


def table(saved: dict, chosen: list[Variant]) -> list[str]:
    cost, sets = saved["cost"], saved["data"]
    names = sorted({k.split(" / ")[0] for k in sets})
    bound = {k: sum(oracle(p, y, cost, K_MAX) for p, y in d) for k, d in sets.items()}
    head = " | ".join(f"{n.split(' (')[0]}: tuning, unseen mean (min)" for n in names)
    rows = [f"| variant | {head} |", "|---|" + "---:|" * len(names)]
    print("\n".join(rows), flush=True)
    for v in chosen:
        cells = []
        for n in names:
            share = {k.split(" / ")[1]: bound[k] / replay(v, d, cost) for k, d in sets.items()
                     if k.startswith(n + " / ")}
            unseen = [s for k, s in share.items() if k != "tuning"]
            cells.append(f"{share['tuning']:.1%}, {statistics.mean(unseen):.1%} ({min(unseen):.1%})")
        rows.append(f"| {v.name} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    return rows


# the features of a drafted token that the second table combines (see `features`)
FEATURES: dict[str, Callable[[dict], object]] = {
    "key (today's)": lambda f: f["key"],
    "key, match length": lambda f: (f["key"], f["n"]),
    "key, copy run": lambda f: (f["key"], f["run"] // 4),
    "key, length, votes, run": lambda f: (f["key"], f["n"], f["votes"], f["total"], f["run"] // 4),
    "the same and output length (memorizes)": lambda f: (f["key"], f["n"], f["votes"], f["total"], f["run"] // 4,
                                                        f["at"] // 16),
}


def features(p: list[int], y: list[int], k_max: int = K_MAX) -> list[tuple[int, list[dict]]]:
    """At each position j of output y: how many tokens of lookup's whole draft the target accepts, and the
    features of each drafted token: the token itself, its key, its match's length, its followers' votes and their
    total (capped at 4), the copy run (how many tokens before j lookup's first drafted token was right, capped at 16)
    and j (capped)."""
    lookup, out, run = PromptLookup(), [], 0
    for j in range(len(y)):
        h = p + y[:j]
        tokens, keys = lookup.lookup(h, min(k_max, len(y) - j - 1))
        preds = islice(lookup.index.predict(h), len(tokens))
        out.append((accepted(tokens, y, j), [
            {"token": t, "key": key, "n": n, "votes": min(votes, 4), "total": min(total, 4), "run": run,
             "at": min(j, 64)}
            for t, key, (_, n, votes, total, _) in zip(tokens, keys, preds)]))
        run = min(16, run + 1) if tokens and tokens[0] == y[j] else 0
    return out


def best_k(a: list[float], cost: list[float]) -> int:
    """The draft length with the most expected tokens per second, where token i of the draft is accepted with
    chance a[i] once those before it were."""
    k_best, best, expected, run = 0, 1.0 / cost[1], 1.0, 1.0
    for k, ai in enumerate(a, 1):
        run *= ai
        expected += run
        if expected / cost[k + 1] > best:
            k_best, best = k, expected / cost[k + 1]
    return k_best


def rates(prompts: list[list[tuple[int, list[dict]]]], fn: Callable[[dict], object]) -> dict[object, float]:
    """Each feature combination's (`fn`) acceptance over the positions of `prompts` (each prompt's `features`)."""
    counts: dict[object, list[int]] = {}
    for pos in prompts:
        for m, feats in pos:
            for i in range(min(len(feats), m + 1)):
                c = counts.setdefault(fn(feats[i]), [0, 0])
                c[0], c[1] = c[0] + 1, c[1] + (i < m)
    return {f: hits / tries for f, (tries, hits) in counts.items()}


def hindsight_seconds(pos: list[tuple[int, list[dict]]], cost: list[float], fn: Callable[[dict], object],
                      rate: dict[object, float] | None = None) -> float:
    """Seconds of the chooser over one prompt's positions `pos`, told each feature combination's (`fn`) acceptance
    over the same positions (or `rate`: over others)."""
    rate = rates([pos], fn) if rate is None else rate
    j, total = 0, 0.0
    while j < len(pos):
        m, feats = pos[j]
        k = best_k([rate.get(fn(f), 0.0) for f in feats], cost)
        total += cost[k + 1]
        j += min(k, m) + 1
    return total


def online_seconds(pos: list[tuple[int, list[dict]]], cost: list[float], fn: Callable[[dict], object] | None,
                   weight: float = 4.0) -> float:
    """Seconds of the chooser over one prompt's positions `pos` told what the controller estimates (costs known),
    refined online by the feature combination `fn` (None: not refined): each combination's decayed counts over the
    tokens drafted so far, after the controller's estimate for its key worth `weight` observations."""
    ctl, fine = Controller(k_max=K_MAX, costs=known(cost)), {}

    def chance(f: dict) -> float:
        coarse = ctl.acceptance(f["key"])
        c = fine.get(fn(f)) if fn is not None else None
        return coarse if c is None else (c[1] + weight * coarse) / (c[0] + weight)

    def learn(feats: list[dict], k: int, m: int) -> None:
        ctl.observe_accept([f["key"] for f in feats[:k]], k, min(k, m))
        for i, f in enumerate(feats[: min(k, m + 1)] if fn is not None else ()):
            c = fine.setdefault(fn(f), [0.0, 0.0])
            c[0], c[1] = c[0] * ctl.decay + 1.0, c[1] * ctl.decay + (i < m)

    return learnt_seconds(pos, cost, chance, learn)


def learnt_seconds(pos: list[tuple[int, list[dict]]], cost: list[float], chance: Callable[[dict], float],
                   learn: Callable[[list[dict], int, int], None]) -> float:
    """Seconds of the chooser over one prompt's positions `pos`, told each drafted token's `chance` as it stands, and
    after each step of k drafts, m of its offer right, `learn(features, k, m)`."""
    j, total = 0, 0.0
    while j < len(pos):
        m, feats = pos[j]
        k = best_k([chance(f) for f in feats], cost)
        total += cost[k + 1]
        if k:
            learn(feats, k, m)
        j += min(k, m) + 1
    return total


def feature_table(saved: dict) -> None:
    cost, richest = saved["cost"], FEATURES["key, length, votes, run"]
    print("\n| set / sample | " + " | ".join(FEATURES) + " | online: key | online: key, length, votes, run |"
          "\n|---|" + "---:|" * (len(FEATURES) + 2))
    for name, data in saved["data"].items():
        pos = [features(p, y) for p, y in data]
        bound = sum(oracle(p, y, cost, K_MAX) for p, y in data)
        cells = [bound / sum(hindsight_seconds(ps, cost, fn) for ps in pos) for fn in FEATURES.values()]
        cells += [bound / sum(online_seconds(ps, cost, fn) for ps in pos) for fn in (None, richest)]
        print(f"| {name} | " + " | ".join(f"{c:.1%}" for c in cells) + " |", flush=True)


def llama_lookup_table(saved: dict) -> None:
    """spectool's lookup (its controller, cost table known; with its audit against fixed lengths, core/audit.py,
    and without), the best fixed length over the same drafts (replay.fixed) and the oracle, each over llama-lookup's
    drafting (lookup_bound.llama_lookup, its port, at 8 tokens a step as vs_llamacpp.py runs it), replayed at the
    same costs, with no Python or machine time in it; and the worst prompt: spectool (audited) over the faster of
    llama-lookup and the set's best fixed length on that prompt."""
    from lookup_bound import llama_lookup

    cost = saved["cost"]
    audited = Variant("costs known", lambda c: Controller(k_max=K_MAX, costs=c), known_costs=True)
    bare = Variant("no audit", lambda c: Controller(k_max=K_MAX, costs=c, audit=False), known_costs=True)
    print("\n| set / sample | spectool lookup / llama-lookup | without the audit | best fixed length | spectool / best "
          "fixed | worst prompt | oracle / llama-lookup |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, data in saved["data"].items():
        theirs = [llama_lookup(p, y, cost) for p, y in data]
        mine = [replay(audited, [d], cost) for d in data]
        k = min(LENGTHS, key=lambda k: sum(fixed(p, y, cost, k) for p, y in data))
        best = [fixed(p, y, cost, k) for p, y in data]
        worst = min(min(t, b) / m for t, b, m in zip(theirs, best, mine))
        bound = sum(oracle(p, y, cost, K_MAX) for p, y in data)
        print(f"| {name} | {sum(theirs) / sum(mine):.2f}x | {sum(theirs) / replay(bare, data, cost):.2f}x | "
              f"k={k}: {sum(theirs) / sum(best):.2f}x | {sum(best) / sum(mine):.2f}x | {worst:.2f}x | "
              f"{sum(theirs) / bound:.2f}x |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="lookup_bound.py --save's file")
    ap.add_argument("--variants", default=None, help="names, separated by ; (default: all)")
    ap.add_argument("--features", action="store_true", help="also the table of features in hindsight")
    ap.add_argument("--llama-lookup", action="store_true", help="also the table against llama-lookup, replayed")
    args = ap.parse_args()
    saved = json.loads(args.data.read_text())
    known = variants()
    chosen = [known[n] for n in args.variants.split(";")] if args.variants else list(known.values())
    print(f"seed {saved['seed']}; share of the oracle over the same drafts")
    table(saved, chosen)
    if args.features:
        feature_table(saved)
    if args.llama_lookup:
        llama_lookup_table(saved)


if __name__ == "__main__":
    main()
