"""How the corpus of earlier requests should draft: its rules replayed over the target's own greedy output on
agentic.py's workloads, with this machine's measured batch costs (as lookup_bound.py replays lookup's).

    python research/corpus_replay.py [--requests 16] [--tokens 128] [--shuffles 5]

Each workload's requests are decoded plainly once, in order (the output every rule must reproduce); then each rule
drafts them in that order with one controller and one corpus across the requests, as `spectool serve` does, and is
charged the measured cost of each verification:
- no corpus (today's lookup);
- the corpus voting for a match's most frequent follower (`vote`, the default) or for the last seen (`latest`);
- the corpus's longer match outranking the request's own always, not only while the corpus wins their disputes
  (Corpus.outranks, the default);
- the corpus where its match is longer than the request's own by more than 0 (the default), 2 or 4 tokens, as
  long (it wins ties: margin -1), and only where the request's own text has no match at all;
- the corpus keeping n-grams up to 12 tokens (the request's own index's longest) instead of 8;
- SuffixDecoding's draft lengths (arXiv 2411.04975, section 4) where a draft starts in the corpus: at most alpha
  times the length of the context's longest match in the corpus (up to 64 tokens), alpha 1, 2 or 4, cut where the
  product of the followers' frequencies falls below 0.1; the controller's choice elsewhere.
And three bounds that no rule for draft lengths can beat (lookup_bound.cheapest: an oracle that knows how many
tokens of each draft the target accepts): over today's lookup's drafts, over the default corpus rule's drafts, and
over the better of the request's own draft and the corpus's own at every token (a perfect choice of source too).
And two looser bounds that no lookup over the same text can beat, whatever its followers, sources or lengths
(`chain_bounds`): the oracle over drafts that go on as long as each token follows the one before it somewhere in
the text (a pair seen there: every token lookup drafts follows an n-gram match, n >= 1), the text being the
request's own (its prompt and output so far), or that and the earlier requests'. Their ratio is what the corpus's
text is worth to a lookup that uses it as well as today's uses the request's own. Last, the oracle over the output
itself (foresight): what verifying at these batch costs allows any drafter at all; and the default rule with
foresight only on the requests whose output an earlier request wrote whole (what remembering whole outputs could
add at most, where a request repeats one).
With --shuffles N, each workload is replayed in N more orders (seeded shuffles of its requests), and the table
gives each rule's mean and lowest ratio over all the orders: a small change anywhere moves a replay's later choices,
and with them its ratio by a few hundredths, so one order says little about a rule that changes little.
Replayed costs leave out Python time and machine noise: compare the ratios, not the tokens/s.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass
from itertools import chain, islice

from spectool_lab.common import WORKLOADS, models

from lookup_bound import accepted, batch_costs, cheapest, cost_line, ours, plain_output, verified
from spectool.llama import engine  # llama.cpp's libraries before numpy
from spectool.core.controller import Controller
from spectool.core.costs import Costs
from spectool.core.evidence import Source
from spectool.drafters.corpus import CORPUS_N_MAX, Corpus
from spectool.drafters.lookup import PromptLookup, latest, vote
from spectool.options import CORPUS_TOKENS, CTX_SIZE



class Unruled(Corpus):
    """The corpus before its disputes counted: a longer match in it always outranks the request's own."""

    def outranks(self) -> bool:
        return True


@dataclass(frozen=True)
class Rule:
    pick: object = vote  # which follower the corpus drafts
    margin: int = 0  # PromptLookup.corpus_margin
    n_max: int = CORPUS_N_MAX  # the corpus's longest n-gram
    corpus: type = Corpus  # Unruled: without the disputes


RULES = {"no corpus (today's lookup)": None, "corpus, most frequent (default)": Rule(),
         "corpus, longer always outranks (no disputes)": Rule(corpus=Unruled),
         "corpus, last seen": Rule(latest), "corpus, wins ties too (margin -1)": Rule(margin=-1),
         "corpus, margin 2": Rule(margin=2), "corpus, margin 4": Rule(margin=4),
         "corpus only where own text has no match": Rule(margin=10_000), "corpus of n-grams up to 12": Rule(n_max=12)}
SUFFIX_ALPHAS, SUFFIX_FLOOR, SUFFIX_DEPTH = (1, 2, 4), 0.1, 64
BOUNDS = ("bound: oracle over today's lookup's drafts", "bound: oracle over the corpus's drafts (default rule)",
          "bound: oracle over the better of own and corpus drafts",
          "bound: any lookup of the request's own text (pairs seen in it)",
          "bound: any lookup of its own and earlier requests' text (pairs seen in them)",
          "bound: the output itself as every draft (foresight)")
REPEATS = "the default, each output an earlier request wrote whole foreseen"


def replay(data, rule, cost, k_max: int, foresee_repeats: bool = False) -> float:
    """Seconds the rule's steps would cost over the requests of `data` in order; with `foresee_repeats`, an output
    that an earlier request wrote whole costs what foresight would (`foresight`) instead."""
    ctl, corpus = Controller(k_max=k_max, costs=Costs()), None
    if rule is not None:
        corpus = rule.corpus(CORPUS_TOKENS, pick=rule.pick, n_max=rule.n_max)
    total, written = 0.0, []
    for p, y in data:
        if foresee_repeats and y in written:
            total += foresight(y, cost, k_max)
        else:
            lookup = PromptLookup(corpus_margin=rule.margin if rule else 0)
            lookup.corpus = corpus
            lookup.start(p)
            total += ours(p, y, cost, k_max, ctl.costs, lookup, ctl)
        if corpus is not None:
            corpus.add(p + y)
        written.append(y)
    return total


def foresight(y, cost, k_max: int) -> float:
    """Seconds of the oracle whose every draft is the output itself: what verification allows any drafter."""
    return cheapest([min(k_max, len(y) - j) for j in range(len(y))], cost)


def match_length(context, docs, cap: int = SUFFIX_DEPTH) -> int:
    """The length of the longest suffix of `context` that some document of `docs` holds followed by a token (what
    SuffixDecoding's suffix tree finds), up to `cap`: by brute force, for a replay."""
    best = 0
    for d in docs:
        for i in range(1, len(d)):  # d[i] follows the match ending at d[i - 1]
            n = 0
            while n < cap and n < i and n < len(context) and d[i - 1 - n] == context[-1 - n]:
                n += 1
            best = max(best, n)
    return best


def suffix_rule(data, alpha: float, cost, k_max: int) -> float:
    """Seconds over `data` in order with the default corpus, SuffixDecoding's draft length where a draft's first
    token comes from the corpus, the controller's elsewhere."""
    ctl, corpus, total = Controller(k_max=k_max, costs=Costs()), Corpus(CORPUS_TOKENS), 0.0
    for p, y in data:
        lookup, j = PromptLookup(), 0
        lookup.corpus = corpus
        while j < len(y):
            h, room = p + y[:j], min(k_max, len(y) - j - 1)
            offer, keys = lookup.peek(h, room), None
            first = next(iter(offer), None)
            if first is not None and first.source is Source.corpus:
                cap, score, draft = min(room, int(alpha * match_length(h, corpus.docs))), 1.0, []
                for t, _, count, seen, _ in islice(lookup._predict_both(h, corpus), cap):  # counts, for a replay
                    score *= count / seen
                    if score < SUFFIX_FLOOR:
                        break
                    draft.append(t)
            else:
                keys = ctl.pick(chain([first], offer)) if first is not None else []
                draft = lookup.propose(h, len(keys), None, None).tokens if keys else []
            m, seconds = verified(ctl, keys, draft, y, j, cost)
            total += seconds
            j += m + 1
        corpus.add(p + y)
    return total


def bounds(data, cost, k_max: int) -> list[float]:
    """Seconds of the oracle (lookup_bound.cheapest) over BOUNDS' drafts, the requests of `data` in order."""
    corpus, totals = Corpus(CORPUS_TOKENS), [0.0, 0.0, 0.0]
    for p, y in data:
        own, both = PromptLookup(), PromptLookup()
        both.corpus = corpus
        reach = [[], [], []]
        for j in range(len(y)):
            h = p + y[:j]
            a = accepted(own.lookup(h, k_max)[0], y, j)
            m = accepted(both.lookup(h, k_max)[0], y, j)
            c = accepted([t for t, *_ in islice(corpus.index.predict(h), k_max)], y, j) if len(corpus) else 0
            for r, v in zip(reach, (a, m, max(a, m, c))):
                r.append(v)
        for i, r in enumerate(reach):
            totals[i] += cheapest(r, cost)
        corpus.add(p + y)
    return totals


def chain_bounds(data, cost, k_max: int) -> list[float]:
    """Seconds of the oracle (lookup_bound.cheapest) over the longest drafts made of pairs of tokens seen in the
    request's own text (its prompt and output so far), and in it or the earlier requests' prompts and outputs:
    at each token, as many of the next as each follow the one before it there. The requests of `data` in order."""
    earlier, totals = set(), [0.0, 0.0]
    for p, y in data:
        text = p + y
        own = set(zip(p, p[1:]))
        reach = [[], []]
        for j in range(len(y)):
            if j:  # the request's own text is now p + y[:j]
                own.add((text[len(p) + j - 2], text[len(p) + j - 1]))
            for r, seen in zip(reach, ((own,), (own, earlier))):
                m = 0
                while m < k_max and j + m < len(y) and any((text[len(p) + j + m - 1], y[j + m]) in s for s in seen):
                    m += 1
                r.append(m)
        for i, r in enumerate(reach):
            totals[i] += cheapest(r, cost)
        earlier |= set(zip(text, text[1:]))
    return totals


def all_rules(data, cost, k_max: int) -> dict[str, float]:
    """Seconds of every rule and bound over the requests of `data` in order."""
    seconds = {rule: replay(data, r, cost, k_max) for rule, r in RULES.items()}
    seconds |= {f"SuffixDecoding's lengths, alpha {a}": suffix_rule(data, a, cost, k_max) for a in SUFFIX_ALPHAS}
    seconds[REPEATS] = replay(data, Rule(), cost, k_max, foresee_repeats=True)
    foreseen = sum(foresight(y, cost, k_max) for _, y in data)
    return seconds | dict(zip(BOUNDS, [*bounds(data, cost, k_max), *chain_bounds(data, cost, k_max), foreseen]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="only the workloads whose name contains this text")
    ap.add_argument("--shuffles", type=int, default=0, help="replay each workload in this many more orders too")
    args = ap.parse_args()
    engine.set_verbose(False)
    lines = ["| workload | rule, replayed | tok/s | vs no corpus |", "|---|---|---:|---:|"]
    if args.shuffles:
        lines = [lines[0] + f" mean over {args.shuffles + 1} orders | lowest |", lines[1] + "---:|---:|"]
    worth = ["| workload | oracle over the corpus's drafts / over today's | any lookup with the earlier requests' "
             "text / of the request's own |", "|---|---:|---:|"]
    with engine.Model(models()["F16"], n_ctx=CTX_SIZE, n_threads=args.threads) as target:
        cost = None
        for name, make in WORKLOADS.items():
            if args.only not in name:
                continue
            data = []
            for text in make(args.requests):
                p = target.tokenize(text)
                data.append((p, plain_output(target, p, args.tokens)))
            cost = cost or batch_costs(target, data[0][0], args.k_max + 1)
            n = sum(len(y) for _, y in data)
            orders = [data] + [random.Random(seed).sample(data, len(data)) for seed in range(args.shuffles)]
            runs = [all_rules(order, cost, args.k_max) for order in orders]
            for rule, s in runs[0].items():
                ratios = [r["no corpus (today's lookup)"] / r[rule] for r in runs]
                more = f" {statistics.mean(ratios):.2f}x | {min(ratios):.2f}x |" if args.shuffles else ""
                lines.append(f"| {name} | {rule} | {n / s:.1f} | {ratios[0]:.2f}x |{more}")
            pairs = ((BOUNDS[0], BOUNDS[1]), (BOUNDS[3], BOUNDS[4]))  # each without the corpus's text, then with it
            worth.append(f"| {name} | " + " | ".join(f"{statistics.mean(r[a] / r[b] for r in runs):.2f}x"
                                                    for a, b in pairs) + " |")
            print("\n".join(lines), flush=True)
    print("\nWhat the corpus's text is worth where it is used as well as the request's own (bounds' ratios, mean "
          "over the orders):\n\n" + "\n".join(worth) + "\n\n" + cost_line(cost or []))


if __name__ == "__main__":
    main()
