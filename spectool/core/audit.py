"""The controller checking itself against fixed policies, inside one greedy generation.

Prompt lookup's drafts are a deterministic function of the text, and at temperature 0 the text the
target makes is known once verified. So at each step the loop hands the audit what lookup offered
(up to HORIZON tokens, drawn whether or not they are drafted) and the length the controller picked;
once the text has passed a draft of k tokens there (or refused one of them), the audit knows how far
it would have been accepted: it yields min(k, m) + 1 tokens, m being how far the offer matched the
text, and costs what the cost table charges a batch of k + 1. (Each length is judged as soon as the
text says, not when the longest is known: under plain decoding a copy that holds would otherwise be
judged HORIZON steps late and a refused one at once, and the audit's evidence would run behind an
echo: research/audit_lag.py, notes/2026-12-06-spread-and-the-machine.md. A draft still pending
counts at what the text has shown of it so far, at least held + 1 tokens for its batch's cost, where
that rates its policy higher: the controller's own drafts of 8-16 would otherwise be judged 8-16
steps into an echo, after the short fixed lengths': notes/2026-12-06-pending-drafts.md.) Summed over
the recent steps (decayed), that is the speed of every fixed length (llama.cpp's n-gram drafters
draft a fixed length where their evidence holds) and of the controller's own choices, at this
machine's costs, on this very text.
Where the best fixed length has been faster than the controller by more than MARGIN, the next step
drafts that length instead: the controller never trails a fixed length by more than that for long,
whatever the prompt's format, and it keeps learning from what the other drafts show.
Sampled, the same count holds in expectation. A deterministic draft is accepted up to the first
token where the sampled text differs from it (a refused token is replaced by one drawn from the
rest of the target's row, never itself), and the text is the target's own sample whatever was
drafted. So how far an offer matches the text that was made is distributed as what drafting it
would have kept (tests/test_audit.py), and a replay of lookup over samples is exact in distribution.
The audit still stays greedy: replayed over samples at temperature 0.8 on both real models and six
formats, the controller led the best fixed length by 15-31% on every one, and with the audit it
made 0.972-1.006x what it made without, 0.988x on average: nothing for the net to catch, and counts
from one draw each (research/audit_sampled.py, notes/2026-12-05-audit-sampled.md).
Drafting nothing is judged beside them: plain decoding's one token a step at a batch of one's
cost does not depend on where the generation stands, so it is not flattered as the lengths are
(below), and takes over by PLAIN_MARGIN only. On a model whose batch of two costs nearly two
steps (SmolLM2 135M on a 2-core EPYC: 1.83x), drafts that miss soon cost more than they make
(research/notes/2026-12-04-vs-llamacpp-live.md).
llama-lookup's rule (core/ngram_cache.py) is judged beside them too: its drafts are also a
deterministic function of the text, so at each step the audit asks what it would have drafted
there, and where it has been faster than the controller by RULE_MARGIN, the next step drafts the
rule's tokens (the controller learns nothing from that step's acceptance: they are not its drafts).

The comparison is made at the states the generation visited (a fixed policy would have stepped
from other positions), and there it flatters the fixed lengths: replayed over Gemma 3 270M's greedy
output (research/controller_replay.py, 2026-12-03), a margin of 3% took over where the controller
was right and lost up to 6 points of the oracle's speed; from 30% on it never took over there, and
the controller alone made 1.11-1.22x the best fixed length on every set. So the audit is a safety
net, not a second controller: it takes over where the controller's estimates are badly wrong (a run
whose priors or acceptance were poisoned drafts nearly nothing: tests/test_audit.py), and costs
about 20 us of host time a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from spectool.core.evidence import Evidence
from spectool.core.ngram_cache import NgramCache

# the fixed lengths held up against the controller's choices
LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16)
HORIZON = LENGTHS[-1]  # how many tokens of each offer are drawn for the audit
# how much faster a fixed length must have been to take over (research/controller_replay.py)
MARGIN = 0.3
PLAIN_MARGIN = 0.03  # how much faster drafting nothing must have been (exact: see above)
RULE = -1  # llama-lookup's rule (core/ngram_cache.py), among the lengths by this key
# how much faster llama-lookup's rule must have been (research/rule_margin.py, 2026-12-04: over
# every format family's unseen greedy output, 0.2 lost on no family and raised the worst prompts
# by 7-8 points; 0.1 let the rule's 8 tokens trail a 16-token length on an echoed text)
RULE_MARGIN = 0.2
MIN_STEPS = 8  # steps seen before any takes over
DECAY = 0.98  # the weight of a step's evidence one step later
# the rule's: its drafts are its own, not lookup's offer cut short, and a text can stop suiting it
# (a SmolLM2 list it copied well for 20 steps, then drafted 8 tokens that failed, step after step)
RULE_DECAY = 0.95


class Offer(Protocol):
    """A drafter's offer whose tokens are known before any is drafted (prompt lookup's LookupOffer):
    `take(k)` its first k tokens, `keys` the keys of those drawn so far."""

    keys: list[Evidence]

    def take(self, k: int) -> list[int]: ...


OURS = -2  # the controller's own picks, among the policies judged by this key


@dataclass(slots=True)
class _Seen:
    pos: int  # where the step's drafts began in the history
    offer: list[int]  # what lookup offered there, up to HORIZON tokens
    rule: list[int]  # what llama-lookup's rule would have drafted there, within the step's limit
    # each policy's draft there, not yet judged: how many tokens (a fixed length's and the
    # controller's are the offer's first ones), and whether they are the rule's
    drafts: dict[int, tuple[int, bool]]

    @classmethod
    def of(cls, pos: int, offer: list[int], rule: list[int], picked: int, limit: int,
           lengths: Sequence[int]) -> _Seen:
        """The drafts at `pos`: drafting nothing, each of `lengths` (within `limit`), the
        controller's `picked`, the rule's."""
        fixed = {k: (min(k, limit, len(offer)), False) for k in (0, *lengths)}
        return cls(pos, offer, rule, {**fixed, OURS: (min(picked, len(offer)), False),
                                      RULE: (len(rule), True)})


@dataclass
class Audit:
    """One greedy generation's record of what each fixed length, and the controller, would have
    made on its text (see the module)."""

    lengths: Sequence[int] = LENGTHS
    margin: float = MARGIN
    plain_margin: float = PLAIN_MARGIN
    rule_margin: float = RULE_MARGIN
    min_steps: int = MIN_STEPS
    decay: float = DECAY
    rule_decay: float = RULE_DECAY
    # decayed tokens made and seconds spent: by each fixed length, and by the controller's picks
    made: dict[int, float] = field(default_factory=dict)
    spent: dict[int, float] = field(default_factory=dict)
    ours: list[float] = field(default_factory=lambda: [0.0, 0.0])
    steps: float = 0.0  # decayed count of the steps judged
    taken_over: int = 0  # how many steps a fixed policy drafted instead of the controller's pick
    _pending: list[_Seen] = field(default_factory=list)
    # the drafts still pending, by policy: tokens they have made at least so far, seconds they cost
    _lower: dict[int, list[float]] = field(default_factory=dict)
    rule: NgramCache = field(default_factory=NgramCache)

    def choose(self, picked: int, known: Offer, limit: int,
               history: Sequence[int]) -> tuple[int, list[int] | None]:
        """What to draft after `history`: the controller's `picked` tokens of lookup's offer
        (`known`), unless a fixed policy has lately been faster on this text: a fixed length
        (within `limit` and the offer), or llama-lookup's rule, whose tokens then come second (else
        None). The step is remembered, to be judged once the text has passed it."""
        offer, rule = known.take(min(HORIZON, limit)), self.rule.draft(history, limit)
        self._pending.append(_Seen.of(len(history), offer, rule, picked, limit, self.lengths))
        best = self.leader()
        if best is None:
            return picked, None
        self.taken_over += 1
        if best == RULE:  # (where it has nothing, nothing: it led as drafting nothing does)
            return (len(rule), rule) if rule else (0, None)
        return min(best, limit, len(offer)), None

    def leader(self) -> int | None:
        """The policy that has made more tokens a second than the controller by more than its
        margin, over enough steps: a fixed length, 0 (drafting nothing) or RULE; where several
        have, the one furthest ahead, each rate taken less its margin (the replay flatters the
        lengths and the rule, not drafting nothing); None where none has."""
        if self.steps < self.min_steps or not self.ours[1]:
            return None
        ours = self._rate(OURS, *self.ours)
        margins = {0: self.plain_margin, RULE: self.rule_margin}
        worth = {k: self._rate(k, self.made[k], self.spent[k]) / (1 + margins.get(k, self.margin))
                 for k in self.made if self.spent[k]}
        best = max(worth, key=worth.__getitem__, default=None)
        return best if best is not None and worth[best] > ours else None

    def _rate(self, k: int, made: float, spent: float) -> float:
        """Policy `k`'s tokens a second: those judged (`made` in `spent` seconds), or, where more,
        with its pending drafts counted at what the text has shown of them so far."""
        lower, cost = self._lower.get(k, (0.0, 0.0))
        return max(made / spent, (made + lower) / (spent + cost))

    def judge(self, history: Sequence[int], costs: Sequence[float]) -> None:
        """Judge each policy's draft at the steps the verified `history` has passed it: how much of
        it the text the target made holds, priced by `costs` (seconds of a batch by size, index =
        size). A draft is judged as soon as the text says how far it holds (at its end, or its first
        token the text refused), so a short draft's verdict does not wait for the longest's: under
        plain decoding a copy that holds for 16 tokens would otherwise be judged 16 steps late,
        while a refused one is judged at once, and the evidence would run behind an echo. A step
        counts towards min_steps once every draft at it is judged."""
        keep, self._lower = [], {}
        for s in self._pending:
            known = {False: _held(s.offer, history, s.pos), True: _held(s.rule, history, s.pos)}
            for k, (n, rule) in list(s.drafts.items()):
                held, final = known[rule]
                if n <= held or final:
                    del s.drafts[k]
                    self._add(k, n, min(n, held), costs)
                else:  # at least held + 1 tokens, for a batch of n + 1
                    lower = self._lower.setdefault(k, [0.0, 0.0])
                    lower[0], lower[1] = lower[0] + held + 1, lower[1] + costs[n + 1]
            if s.drafts:
                keep.append(s)
            else:
                self.steps = self.steps * self.decay + 1.0
        self._pending = keep

    def _add(self, k: int, n: int, held: int, costs: Sequence[float]) -> None:
        """Policy `k`'s draft of `n` tokens, of which the text held `held`, judged."""
        w = self.rule_decay if k == RULE else self.decay
        made, spent = (self.ours if k == OURS else (self.made.get(k, 0.0), self.spent.get(k, 0.0)))
        made, spent = made * w + held + 1, spent * w + costs[n + 1]
        if k == OURS:
            self.ours = [made, spent]
        else:
            self.made[k], self.spent[k] = made, spent


def _held(draft: list[int], history: Sequence[int], pos: int) -> tuple[int, bool]:
    """How many of `draft`'s tokens the history holds from `pos` on, as far as it goes, and whether
    that is final (the history refused the next one, or holds them all)."""
    for i, token in enumerate(draft):
        if pos + i >= len(history):
            return i, False
        if history[pos + i] != token:
            return i, True
    return len(draft), True
