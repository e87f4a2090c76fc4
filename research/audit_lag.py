"""When the audit judges a draft (core/audit.py): each policy's as soon as the text says how far it holds, against every
policy's at once when the longest is known (as before 2026-12-06), replayed over every format family.

    python research/audit_lag.py [--tuning] [--seed N] [--models gemma-f16,smollm2]

Under plain decoding a 16-token offer that holds is known 16 steps later, a refused one at once: judged together, the
audit's evidence runs behind an echo, and where drafting nothing led before it, it keeps the controller from drafting
the echo (a SmolLM2 chat answer that repeated a phrase, seed 921226: 17 steps of plain decoding while the controller
picked 5-8 tokens that would all have held). For each real model and format family (spectool_lab.formats, the prompts
benchmarks/vs_llamacpp.py measures), the target's greedy output of 8 prompts, then spectool's lookup replayed over it
(spectool_lab.replay.ours: its controller, cost table known) at this machine's measured batch costs: audited as
shipped, audited with pending drafts counted for nothing until judged (as before the second change of 2026-12-06:
notes/2026-12-06-pending-drafts.md), audited with every draft judged at once, and not audited, against
llama-lookup's drafting replayed (lookup_bound.llama_lookup) and the best fixed length over lookup's drafts. Replayed
costs leave out Python time and machine noise: compare the ratios. Unseen samples by default; --tuning: the tuning
lists (held-out families have none).
"""

from __future__ import annotations

from typing import Sequence

from spectool_lab import common, replay

from spectool.core.audit import Audit, _held
from spectool.core.controller import Controller

from controller_replay import K_MAX, known
from rule_margin import cell, each_family, options


class Together(Audit):
    """The audit as it judged before 2026-12-06: a step's drafts all at once, when the text has passed the longest
    (or the first token it refused)."""

    def judge(self, history: Sequence[int], costs: Sequence[float]) -> None:
        keep = []
        for s in self._pending:
            known = {False: _held(s.offer, history, s.pos), True: _held(s.rule, history, s.pos)}
            if not all(n <= known[rule][0] or known[rule][1] for n, rule in s.drafts.values()):
                keep.append(s)
                continue
            for k, (n, rule) in s.drafts.items():
                self._add(k, n, min(n, known[rule][0]), costs)
            s.drafts.clear()
            self.steps = self.steps * self.decay + 1.0
        self._pending = keep


class Unseen(Audit):
    """The audit as it led before 2026-12-06's second change: a draft still pending counted for nothing, not at what
    the text has shown of it so far."""

    def _rate(self, k: int, made: float, spent: float) -> float:
        return made / spent


VARIANTS = {"as shipped": Audit, "pending unseen": Unseen, "judged together": Together, "no audit": None}


def seconds(data, cost, variant) -> list[float]:
    """spectool's replayed seconds over each prompt of `data` under the audit `variant` (None: none)."""
    real, replay.Audit = replay.Audit, variant or Audit  # type: ignore[misc]
    try:
        return [replay.ours(p, y, cost, K_MAX, known(cost),
                            ctl=Controller(k_max=K_MAX, costs=known(cost), audit=variant is not None))
                for p, y in data]
    finally:
        replay.Audit = real  # type: ignore[misc]


def main() -> None:
    args, seed = options(__doc__)
    print(f"{common.machine(2)}; seed {seed}, {'tuning lists' if args.tuning else 'unseen samples'}; replayed "
          "seconds, as llama-lookup's over spectool's (above 1: spectool faster): over the family, and (in brackets) "
          "its worst prompt\n")
    print("| model | family | " + " | ".join(VARIANTS) + " | best fixed length |\n|---|---|"
          + "---:|" * (len(VARIANTS) + 1))
    for name, fam, data, cost, theirs, best, _ in each_family(args, seed):
        cells = [cell(theirs, seconds(data, cost, variant)) for variant in VARIANTS.values()]
        print(f"| {name} | {fam} | " + " | ".join(cells) + f" | {sum(theirs) / best:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
