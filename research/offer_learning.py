"""Learning from the whole offer: the controller's estimates fed by every token lookup offered, drafted or not, once
the text has judged it; replayed over every format family.

    python research/offer_learning.py [--models gemma-f16,smollm2] [--families qa,raw] [--prompts 8] [--seed N]

The controller learns each key's acceptance from the tokens it drafts, and only from those: a key it rates too low
to draft stays low until a probe. But lookup's offer is a deterministic function of the text, and at temperature 0
the text is known once verified, so every offered token can be judged without drafting it (the audit,
core/audit.py, already draws HORIZON tokens of each offer and judges them so). mean_bound.py measured the
controller, replayed, at 1.13x the live fastest drafter on average, against 1.14-1.18x for lookup's keys' rates
known in hindsight: a controller that learns the rates from every offered token as the text judges it reaches
toward that reference causally. For each real model and format family (rule_margin.each_family: greedy outputs,
this machine's batch costs), replayed, as plain decoding's seconds over each policy's (the family pooled): the
oracle over lookup's drafts, lookup's keys in hindsight, spectool's lookup as shipped (cost table known, audited),
and the same controller also told each offered token beyond those it drafted, at each of WEIGHTS (an observation
counted at that weight), as soon as the text passes it; and the share of the oracle of the shipped controller and
of the learners.
"""

from __future__ import annotations

from spectool_lab import formats, replay
from spectool_lab.replay import oracle

from spectool.core.audit import HORIZON
from spectool.core.controller import Controller

from controller_replay import K_MAX, Hindsight, hindsight, known
from rule_margin import each_family, options

WEIGHTS = (0.5, 1.0, 2.0)  # what an offered token the controller did not draft counts for, against a drafted one


class OfferLearner:
    """replay.ours's `step`: each step's offer beyond the drafted keys, pending until the text judges it, then told
    to the controller token by token (up to the first the text refused), each at `weight`."""

    def __init__(self, y: list[int], weight: float):
        self.y, self.weight = y, weight
        self.pending: list[list] = []  # [j, keys, tokens, next i]
        # (where the offer began in y, the token's position, held, tokens known then)
        self.told: list[tuple[int, int, bool, int]] = []

    def __call__(self, ctl: Controller, offer, j: int, keys: list, m: int, n: int) -> None:
        if m >= len(keys):  # the drafted keys all held (or none was the offer's): the rest is unjudged
            tokens = offer.take(min(HORIZON, len(self.y) - j - 1))
            self.pending.append([j, offer.keys[: len(tokens)], tokens, len(keys)])
        keep = []
        for s in self.pending:
            j0, ks, tokens, i = s
            while i < len(tokens) and j0 + i < n:
                hit = tokens[i] == self.y[j0 + i]
                self.tell(ctl, ks[i], hit)
                self.told.append((j0, j0 + i, hit, n))
                i = i + 1 if hit else len(tokens)
            s[3] = i
            if i < len(tokens):
                keep.append(s)
        self.pending = keep

    def tell(self, ctl: Controller, key, hit: bool) -> None:
        a = ctl._stats(key)
        a.tries = a.tries * ctl.decay + self.weight
        a.hits = a.hits * ctl.decay + (self.weight if hit else 0.0)
        ctl._memo.clear()


def main() -> None:
    args, seed = options(__doc__)
    print(f"seed {seed}, {'tuning lists' if args.tuning else 'unseen samples'}, {args.tokens} tokens; replayed "
          "speed-up over plain decoding (plain's seconds over the policy's), the family's prompts pooled; in brackets "
          "the share of the oracle\n")
    head = ("| model | family | oracle | lookup's keys in hindsight | spectool lookup | "
            + " | ".join(f"learning from the offer, weight {w}" for w in WEIGHTS) + " |")
    print(head + "\n|---|---|" + "---:|" * (head.count("|") - 3))
    gains: dict[float, list[float]] = {w: [] for w in WEIGHTS}
    for name, fam, data, cost, _, _, _ in each_family(args, seed):
        data = [(p, y) for p, y in data if len(y) > 1]  # an output that ended at once measures nothing
        if not data:
            continue
        plain = sum(len(y) for _, y in data) * cost[1]
        bound = sum(oracle(p, y, cost, K_MAX) for p, y in data)

        def run(ctl_of, step_of=lambda y: None) -> float:
            return sum(replay.ours(p, y, cost, K_MAX, known(cost), ctl=ctl_of(p, y), step=step_of(y)) for p, y in data)

        hind = run(lambda p, y: Hindsight(k_max=K_MAX, costs=known(cost), rates=hindsight(p, y)))
        ours = run(lambda p, y: Controller(k_max=K_MAX, costs=known(cost)))
        learnt = {w: run(lambda p, y: Controller(k_max=K_MAX, costs=known(cost)),
                         lambda y, w=w: OfferLearner(y, w)) for w in WEIGHTS}
        for w in WEIGHTS:
            gains[w].append(ours / learnt[w])
        cells = [f"{plain / bound:.3f}x", f"{plain / hind:.3f}x ({bound / hind:.1%})",
                 f"{plain / ours:.3f}x ({bound / ours:.1%})"] + [
            f"{plain / learnt[w]:.3f}x ({bound / learnt[w]:.1%})" for w in WEIGHTS]
        held = " (held out)" if formats.FAMILIES[fam].held_out else ""
        print(f"| {name} | {fam}{held} | " + " | ".join(cells) + " |", flush=True)
    for w, g in gains.items():
        print(f"\nweight {w}: over the shipped controller {min(g):.3f}-{max(g):.3f}x a family, "
              f"{sum(g) / len(g):.3f}x on average ({sum(x > 1.0 for x in g)} of {len(g)} families faster)")


if __name__ == "__main__":
    main()
