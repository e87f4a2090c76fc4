"""Where spectool's lookup trails llama-lookup's rule on a format: in what the two draft, or in when they draft?

    python research/rule_union.py [--tuning] [--seed N] [--models gemma-f16,smollm2] [--families qa,...]

For each real model and format family (rule_margin.each_family: the target's greedy output of 8 prompts, this
machine's batch costs), replayed seconds as llama-lookup's over each policy's (above 1: faster than llama-lookup),
over the family and, in brackets, its worst prompt:
- three oracles, which know how far each draft holds and take the cheapest way through the output (replay.cheapest):
  over lookup's offers (up to K_MAX tokens), over the drafts of llama-lookup's rule (core/ngram_cache.py, up to its 8
  tokens), and over whichever of the two holds further at each token: what the rule's drafts add to lookup's;
- spectool's lookup as shipped (its controller, audited: core/audit.py), and "union": the same, except that where the
  rule would draft more tokens than the step does, the step drafts the rule's (UnionAudit);
and at how many tokens both draft but their first tokens differ. Replayed costs leave out Python time and machine
noise: compare the ratios. Unseen samples by default; --tuning: the tuning lists.
"""

from __future__ import annotations

from spectool_lab.replay import accepted, cheapest, ours

from spectool.core.audit import Audit
from spectool.core.ngram_cache import NgramCache
from spectool.drafters.lookup import PromptLookup

from controller_replay import K_MAX, known
from rule_margin import cell, each_family, options


class UnionAudit(Audit):
    """The shipped audit, except that where llama-lookup's rule would draft more tokens than the step's, the step
    drafts the rule's."""

    def choose(self, picked, known, limit, history):
        k, theirs = super().choose(picked, known, limit, history)
        rule = self._pending[-1].rule  # what the rule drafts here, as the audit judges it
        return (len(rule), rule) if theirs is None and len(rule) > k else (k, theirs)


def reaches(p, y) -> tuple[list[int], list[int], int]:
    """At each token of output y: how far lookup's offer holds, how far the rule's draft holds, and the count of
    tokens where both drafted but their first tokens differ."""
    lookup, rule = PromptLookup(), NgramCache()
    offer, ruled, split = [], [], 0
    for j in range(len(y)):
        h, limit = p + y[:j], min(K_MAX, len(y) - j - 1)
        a = lookup.lookup(h, limit)[0] if limit else []
        b = rule.draft(h, limit) if limit else []
        offer.append(accepted(a, y, j))
        ruled.append(accepted(b, y, j))
        split += bool(a and b and a[0] != b[0])
    return offer, ruled, split


def played(p, y, cost, audit: Audit) -> float:
    """spectool's lookup replayed over y with `audit`, its controller's cost table known, as rule_margin.seconds
    replays it."""
    return ours(p, y, cost, K_MAX, known(cost), audit=audit)


def main() -> None:
    args, seed = options(__doc__)
    print(f"seed {seed}, {'tuning lists' if args.tuning else 'unseen samples'}; replayed seconds, as llama-lookup's "
          "over each policy's (above 1: faster): over the family, and (in brackets) its worst prompt\n")
    print("| model | family | oracle, lookup's offers | oracle, the rule's drafts | oracle, both | spectool lookup | "
          "union | first tokens differ |\n|---|---|---:|---:|---:|---:|---:|---:|")
    for name, fam, data, cost, theirs, _, _ in each_family(args, seed):
        r = [reaches(p, y) for p, y in data]
        paths = [[cheapest(offer, cost) for offer, _, _ in r], [cheapest(ruled, cost) for _, ruled, _ in r],
                 [cheapest([max(a, b) for a, b in zip(offer, ruled)], cost) for offer, ruled, _ in r]]
        shipped = [played(p, y, cost, Audit()) for p, y in data]
        union = [played(p, y, cost, UnionAudit()) for p, y in data]
        cells = [cell(theirs, s) for s in (*paths, shipped, union)]
        print(f"| {name} | {fam} | " + " | ".join(cells) + f" | {sum(s for _, _, s in r)} of "
              f"{sum(len(y) for _, y in data)} |", flush=True)


if __name__ == "__main__":
    main()
