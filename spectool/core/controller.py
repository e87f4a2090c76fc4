"""Chooses the draft length k of each step from what this machine charges and how often drafts are
accepted.

A drafter offers tokens with a key each, naming the evidence behind that token ("draft"; for prompt
lookup the match it came from, see PromptLookup.key). With a_i the estimated chance that token i is
accepted given that 1..i-1 were (learnt online per key), a step with k drafts yields on average E(k)
= 1 + sum_{i<=k} prod_{j<=i} a_j tokens and costs verify(k+1) plus drafting. The controller picks
the k in [k_min, k_max] with the best E(k) / cost; k = 0 is plain decoding. A draft therefore stops
at the token whose evidence is too weak for what the next batched token costs, and runs long where
every token's evidence holds. A key held at k = 0 is re-probed with a short draft now and then so
that its estimate can recover.

Costs belong to the model and the machine, not to one generation: a `Costs` table can be shared by
every controller that drives the same target (the turns of a chat, the prompts of a benchmark), so
that batch sizes measured once keep their price. llama.cpp's CPU kernels make some sizes much
cheaper than their neighbours, which only measurement finds (docs/performance.md, "How the draft
length is chosen").

Measured timings make the choice of k, and so the use of random numbers, vary from run to run. For
seeded sampling that must reproduce exactly, `timed=False` keeps the cost model at its priors: k
then depends only on the tokens seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import islice, repeat
from typing import TYPE_CHECKING, Iterable, Iterator, NamedTuple, Sequence

from spectool.core.costs import Costs
from spectool.core.evidence import (BUCKETS, DFLASH, DRAFT, EAGLE3, GRAMMAR, MTP, Agreement,
                                    Evidence)
from spectool.core.evidence import Source

if TYPE_CHECKING:  # (protocol.py loads llama.cpp and numpy: the CLI's options import this module)
    from spectool.core.protocol import Branch

# How many tokens a step may draft when a pair does not say (models.toml's draft_max says it per
# pair): lookup's controller keeps drafts short where their evidence is weak, so the cap only bounds
# the long copies.
DRAFT_MAX = 32

# the drafters that cost time to run (a draft model, an MTP, EAGLE-3 or DFlash head), beside those
# that read the text for free (lookup, a grammar's forced tokens, a request's prediction)
PAID = (Source.draft, Source.mtp, Source.eagle3, Source.dflash)

# the least the siblings' shares are scaled by (Controller.share_scale): a sibling the drafter is
# sure of still pays on a machine where a row is cheap, and so goes on being checked
SHARE_FLOOR = 0.25


# Prompt lookup's prior acceptance by agreement, for each match length of BUCKETS (see
# PromptLookup.key): the acceptance of a drafted token, given that the tokens before it were
# accepted, by its own evidence; measured on Gemma 3 270M (research/notes/2026-12-02-lab.md,
# "Lookup's priors"). Longer matches, and followers that agreed, are right far more often.
LOOKUP_PRIORS = {Agreement.agreed: (0.4, 0.7, 0.8, 0.9, 0.97),
                 Agreement.mostly: (0.6, 0.4, 0.5, 0.7, 0.5),
                 Agreement.contested: (0.15, 0.25, 0.25, 0.3, 0.2)}


# The corpus of earlier requests (drafters/corpus.py) starts from lookup's priors with this weight:
# a corpus that does not fit the requests is learnt within a few short drafts under its own keys.
# A request's prediction (drafters/prediction.py) starts from them with lookup's own weight: its
# matches are lookup's, into a text the request says the answer follows (with prior_other's guess
# instead, an edit request drafted 8% slower with its file as the prediction than without one:
# research/prediction_bound.py)
CORPUS_PRIOR_WEIGHT = 4.0


def _default_priors() -> dict[Evidence, tuple[float, float]]:
    weight = {Source.lookup: 8.0, Source.corpus: CORPUS_PRIOR_WEIGHT, Source.prediction: 8.0}
    lookup = {Evidence.lookup(b, agreement, source=source): (a, weight[source])
              for source in weight
              for agreement, row in LOOKUP_PRIORS.items()
              for b, a in zip(BUCKETS, row, strict=True)}
    # a draft model's and an MTP head's: a guess that their first observations replace. A grammar's
    # forced tokens are the text's own unless the model spells them with other tokens than the
    # grammar's canonical ones
    return {**lookup, DRAFT: (0.6, 2.0), MTP: (0.6, 2.0), EAGLE3: (0.6, 2.0), DFLASH: (0.6, 2.0),
            GRAMMAR: (0.95, 8.0)}


class Beside(NamedTuple):
    """The rest of a decode that verifies a sequence's drafts beside other sequences' (a batch's):
    their rows, the tokens they make as expected, and the table of decodes of that many sequences
    (generate/batch.py)."""

    rows: int
    expected: float
    costs: Costs


@dataclass(slots=True)
class _Acceptance:
    # the key's prior acceptance (a continuation's is the estimate for the token before it) ...
    prior: float
    weight: float  # ... and its weight in observations
    tries: float = 0.0  # decayed counts of the tokens drafted under a key that were verified ...
    hits: float = 0.0  # ... and accepted
    zero_streak: int = 0
    idle_probes: int = 0  # probes in a row that did not make the controller draft under the key


# a source's siblings before any stood where a chain broke: their shares as offered, worth 2
# siblings sure to be right
_SIBLINGS_PRIOR = _Acceptance(1.0, 2.0)


@dataclass
class Controller:
    # the most tokens a step may draft (a pair's draft_max where it gives one)
    k_max: int = DRAFT_MAX
    k_min: int = 0
    adaptive: bool = True
    decay: float = 0.99  # weight kept by older acceptance observations at each update
    # key -> (acceptance, weight)
    priors: dict[Evidence, tuple[float, float]] = field(default_factory=_default_priors)
    prior_other: tuple[float, float] = (0.5, 2.0)  # for other keys
    # a sampled run's keys carry its temperature ("lookup:3@T0.8"): what greedy runs learnt does not
    # carry over. Their prior is the greedy one raised to this power, with at most this weight in
    # observations (at temperature 0.8 lookup's acceptance was close to the square of the greedy
    # one: research/notes/2026-12-02-lab.md, "Lookup's priors")
    sampled_prior: tuple[float, float] = (2.0, 4.0)
    # keys whose quality is unknown until tried (a user's draft model): draft this many times first
    explore: dict[Source, int] = field(default_factory=lambda: {Source.draft: 2, Source.mtp: 2,
                                                                 Source.eagle3: 2,
                                                                 Source.dflash: 2})
    explore_k: int = 4
    probe_every: int = 32
    # a drafter that costs time to run (PAID: a draft model, a head) is probed half as often after
    # each probe that did not make it pay (nor was all accepted), down to once in probe_every <<
    # this many steps: a probe pays for the draft's catch-up on all the text since it last ran (a
    # draft through text on the 2-core EPYC: ~2 ms a token, 70 ms after 32 idle steps)
    probe_backoff: int = 4
    # a draft-model token relative to one target decode, until measured
    draft_cost_prior: float = 0.15
    costs: Costs = field(default_factory=Costs)  # shared with other controllers of the same target
    # a greedy generation's picks held up against fixed lengths on its own text (core/audit.py)
    audit: bool = True
    # False: an untimed copy of `costs`, at its priors (see the module docstring); then, whether
    timed: bool = True
    # timings count (the cost table's to say)
    _acc: dict[Evidence, _Acceptance] = field(default_factory=dict)
    _memo: dict[Evidence, float] = field(default_factory=dict)
    # draft trees' siblings at stake (the path reached their depth and the chain's token there was
    # refused), by the source that offered them: their shares summed (tries) and how many the target
    # took (hits), decayed, after _SIBLINGS_PRIOR
    _siblings: dict[Source, _Acceptance] = field(default_factory=dict)

    def __post_init__(self):
        if not self.timed:
            self.costs = Costs(self.costs.jump_prior, self.costs.slope_prior, unmeasured=1.0,
                               timed=False)
        self.timed = self.costs.timed

    # -- what the loop tells us
    # ----------------------------------------------------------------------------
    def observe_verify(self, batch_size: int, seconds: float) -> None:
        self.costs.observe_verify(batch_size, seconds)

    def observe_draft(self, keys: Sequence[Evidence], seconds: float) -> None:
        """Drafting the tokens under `keys` took `seconds`, charged to the source of the last: a
        hybrid draft's lookup tokens cost next to nothing beside its draft-model tokens."""
        last = keys[-1].source
        n = len(keys) if keys[0].source is last else sum(k.source is last for k in keys)
        self.costs.observe_draft(keys[-1].cost_key, n, seconds)

    def observe_accept(self, keys: Sequence[Evidence], drafted: int, accepted: int) -> None:
        """A step drafted `drafted` tokens, under keys[i] each, and the first `accepted` were
        accepted (all of them: a probe under keys[0] that paid: the next comes at probe_every)."""
        self._memo.clear()
        if drafted and accepted >= drafted:
            self._stats(keys[0]).idle_probes = 0
        # token i was tried: all before it were accepted
        for i in range(min(drafted, accepted + 1)):
            a = self._acc.get(keys[i]) or self._stats(keys[i])
            a.tries = a.tries * self.decay + 1.0
            a.hits = a.hits * self.decay + (1.0 if i < accepted else 0.0)

    def observe_siblings(self, shares: dict[Source, float], taken: Source | None) -> None:
        """A draft tree's step refused the chain's token at a depth where siblings stood, of these
        `shares` summed by source, and the path went through one of source `taken`, or none."""
        for source, share in shares.items():
            s = self._siblings.setdefault(source, replace(_SIBLINGS_PRIOR))
            s.tries = s.tries * self.decay + share
            s.hits = s.hits * self.decay + (source is taken)

    def share_scale(self, source: Source) -> float:
        """How the shares of the siblings `source` offers turned out (hits per share): what the
        controller multiplies them by, at least SHARE_FLOOR (a scale so low that no sibling is
        chosen would learn nothing more). Each source's apart: a draft model's runner-ups share its
        top 4's softmax, lookup's its followers' counts."""
        s = self._siblings.get(source) or _SIBLINGS_PRIOR
        return max(SHARE_FLOOR, (s.hits + s.weight * s.prior) / (s.tries + s.weight))

    # -- estimates
    # -----------------------------------------------------------------------------------------
    def _stats(self, key: Evidence) -> _Acceptance:
        a = self._acc.get(key)
        if a is None:
            prior, w = self.priors.get(key.stretch_start, self.prior_other)
            if key.temp:
                prior, w = prior ** self.sampled_prior[0], min(w, self.sampled_prior[1])
            a = self._acc[key] = _Acceptance(prior, w)
        return a

    def acceptance(self, key: Evidence) -> float:
        """Estimated chance that a token drafted under `key` is accepted, given that the tokens
        before it were: its observations after a prior worth `weight` observations. The prior is the
        key's own (`priors`, by its stretch's start), or for a continuation ("lookup:2+3", see
        PromptLookup) what the controller now estimates for the token before it in its stretch."""
        est = self._memo.get(key)
        if est is None:
            a = self._acc.get(key) or self._stats(key)
            prior = a.prior if key.before is None else self.acceptance(key.before)
            # until the next observation
            est = self._memo[key] = (a.hits + a.weight * prior) / (a.tries + a.weight)
        return est

    def worth(self, key: Evidence, temp: float = 0.0) -> float:
        """What a token drafted under greedy `key` is worth at sampling temperature `temp`, in
        tokens: its estimated acceptance less what drafting it costs, counted in single target steps
        (nothing for a lookup token; a draft-model token on a CPU can cost half a target step)."""
        key = key.at(temp)
        one = self.costs.verify_costs(1)[1]
        return self.acceptance(key) - self.draft_cost(key, one) / one

    def verify_cost(self, batch_size: int) -> float:
        return self.costs.verify_cost(batch_size)

    def draft_cost(self, key: Evidence, one: float) -> float:
        """Seconds to draft one token under `key`: measured per source, else a guess
        (`draft_cost_prior` target steps a draft-model token, nothing for a lookup)."""
        cost = self.costs.draft.get(key.cost_key)
        if cost is None:
            cost = self.draft_cost_prior * one if key.source in PAID else 0.0
        return cost

    # -- the decision
    # --------------------------------------------------------------------------------------
    def pick(self, offer: Iterable[Evidence], temp: float = 0.0,
             limit: int | None = None) -> list[Evidence]:
        """The keys of the tokens to draft at sampling temperature `temp`: the first k of the greedy
        keys on offer, each at `temp`, k as the module docstring says, and never more than `limit`
        (the room left in the context and the batch, the token budget, a request's own maximum: the
        loop's; 0 drafts nothing) nor k_max, the one place a draft's length is bounded. `offer`
        may be lazy (PromptLookup.peek): it is drawn from only while a longer draft could still do
        better than the best so far, since each further token adds at most the chance of reaching
        it and no drafting cost."""
        return self.pick_together([(offer, temp, limit)])[0]

    def pick_together(self, offers: Sequence[tuple[Iterable[Evidence], float, int | None]],
                      others: int = 0, costs: Costs | None = None) -> list[list[Evidence]]:
        """`pick` for several sequences whose drafts one decode verifies, beside `others` rows of
        sequences that do not draft (generate/batch.py): each sequence's keys, the lengths chosen
        together for the best expected tokens, summed over the sequences, per second of a decode of
        all their rows. The next row goes to the sequence whose next token is likeliest to be kept,
        so a row of a batch is priced at what it adds to the batch's decode, and where the batch's
        own rows fill the machine, nothing is drafted. `costs`: the table of decodes of that many
        sequences (a decode of several costs more than one of the same rows in one sequence), else
        this controller's."""
        chains = [_Chain.of(self, offer, temp, limit) for offer, temp, limit in offers]
        free = [c for c in chains if not c.decided]
        if free:  # the others' rows, and their tokens (a decided draft's as expected)
            decided = [c for c in chains if c.decided]
            self._best_lengths(free, others + sum(1 + len(c.keys) for c in decided),
                               others + sum(self.expected(c.keys) for c in decided),
                               costs or self.costs)
        for c in free:
            c.keys = self._probed(c)
        return [c.keys for c in chains]

    def expected(self, keys: Sequence[Evidence]) -> float:
        """The tokens a step with a chain drafted under `keys` makes, as expected."""
        return sum(self.reach(keys))

    def reach(self, keys: Sequence[Evidence]) -> list[float]:
        """For a chain drafted under `keys`: the chance that a step reaches each depth (every
        draft before it accepted), 1 for the target's own token after x."""
        reach = [1.0]
        for key in keys:
            reach.append(reach[-1] * self.acceptance(key))
        return reach

    def _best_lengths(self, chains: list[_Chain], rows: int, expected: float,
                      table: Costs) -> None:
        """Each chain's length (`n`), at least its floor: the one with the best E / cost (the
        `table`'s prices), summed over the chains and beside `rows` rows of other sequences that
        make `expected` tokens, drawing keys while a longer draft could still pay."""
        costs = table.verify_costs(rows + sum(1 + c.cap for c in chains))
        drafting = 0.0
        for c in chains:
            rows += 1
            expected += 1.0
            while c.n < c.floor:
                gain = c.run * self.acceptance(c.keys[c.n])
                rows, expected = rows + 1, expected + gain
                drafting += c.grow(self, gain, costs[1])
        best, chosen = expected / (costs[rows] + drafting), [c.n for c in chains]
        while True:
            likeliest, gain, top = self._likeliest(chains)
            if likeliest is None:
                break
            c = likeliest
            rows, expected = rows + 1, expected + gain
            drafting += c.grow(self, gain, costs[1])
            ratio = expected / (costs[rows] + drafting)
            if ratio > best:
                best, chosen = ratio, [c.n for c in chains]
                continue
            longer = costs[rows + 1 : rows + 1 + sum(c.cap - c.n for c in chains)]
            if self._no_longer_draft_pays(longer, expected, top, drafting, best):
                break
        for c, n in zip(chains, chosen, strict=True):
            c.n = n

    def _likeliest(self, chains: list[_Chain]) -> tuple[_Chain | None, float, float]:
        """The chain whose next key is likeliest to be accepted with all before it (None where
        none can grow), that chance, and the largest chance any further key could add (the
        highest `run` of the chains that can grow: acceptances are at most 1)."""
        best, gain, top = None, -1.0, 0.0
        for c in chains:
            if c.can_grow():
                g = c.run * self.acceptance(c.keys[c.n])
                if g > gain:
                    best, gain = c, g
                top = max(top, c.run)
        return best, gain, top

    def _probed(self, c: _Chain) -> list[Evidence]:
        """A chain's keys as chosen, unless its first key has been held at no draft for
        `probe_every` steps (a paid drafter's: more after probes that did not pay, see
        `probe_backoff`): then a short draft keeps the estimate honest."""
        if not c.keys:
            return []
        key = c.keys[0]
        a = self._stats(key)
        if c.n:
            a.zero_streak = a.idle_probes = 0
            return c.keys[: c.n]
        a.zero_streak += 1
        paid = key.source in PAID
        if a.zero_streak < self.probe_every << (min(a.idle_probes, self.probe_backoff) * paid):
            return []
        a.zero_streak = 0
        a.idle_probes += 1
        return c.draw(min(c.cap, self.explore_k))

    def branching(self, keys: Sequence[Evidence], cap: int, beside: Beside | None = None) -> int:
        """How many of the first depths of a chain drafted under `keys` could hold a sibling worth
        its row (`branch`'s test for a sibling sure to be right where the chain's token is refused):
        the siblings to offer are at those depths only (0: none, and no tree; `cap` 0: none)."""
        reach, expected, prices, rows = self._chain_reach(keys, 1, beside)
        bar = expected * (prices[rows + 1] / prices[rows] - 1.0)
        could = [d for d, key in enumerate(keys) if reach[d] * (1.0 - self.acceptance(key)) > bar]
        return could[-1] + 1 if could and cap else 0

    def branch(self, keys: Sequence[Evidence], offered: Sequence[Branch], cap: int,
               beside: Beside | None = None) -> list[Branch]:
        """Which of the siblings `offered` beside a chain drafted under `keys` (each key at the
        step's temperature) to verify with it in one decode, at most `cap` of them and WIDTH - 1 at
        a depth: best first by what each adds, the chance that the path reaches its depth with the
        chain's token there refused and it the target's token (Branch.share, as its source's
        shares turned out: share_scale; a token offered by several sources, at the best), while
        that raises the expected tokens per second of the decode (a row more each, at the cost
        table's prices; `beside`: the decode's other sequences' rows and tokens, at their table's);
        none where a chain is best."""
        # (loaded by then: a tree is being drafted)
        from spectool.core.protocol import WIDTH, at_best

        reach, expected, prices, rows = self._chain_reach(keys, cap, beside)
        offered = [b for b in offered if b.depth < len(keys)]
        best = at_best(offered, lambda b: reach[b.depth] * (1.0 - self.acceptance(keys[b.depth]))
                       * min(1.0, b.share * self.share_scale(b.source)))
        chosen: list[int] = []
        at: dict[int, int] = {}  # siblings chosen at each depth
        for gain, i in sorted(best.values(), reverse=True):
            if len(chosen) == cap or (expected + gain) * prices[rows] \
                    <= expected * prices[rows + 1]:
                break
            if at.get(offered[i].depth, 0) < WIDTH - 1:
                chosen.append(i)
                at[offered[i].depth] = at.get(offered[i].depth, 0) + 1
                expected, rows = expected + gain, rows + 1
        return [offered[i] for i in sorted(chosen)]

    def _chain_reach(self, keys: Sequence[Evidence], more: int, beside: Beside | None = None
                     ) -> tuple[list[float], float, list[float], int]:
        """For a chain drafted under `keys` (in a decode with the rows `beside`): the chance of
        reaching each depth (all before it accepted), the tokens the decode makes as expected, the
        prices of decodes of up to `more` rows beyond its, and its rows."""
        reach = self.reach(keys)
        rows, expected, table = 1 + len(keys), sum(reach), self.costs
        if beside is not None:
            rows, expected, table = rows + beside.rows, expected + beside.expected, beside.costs
        return reach, expected, table.verify_costs(rows + more), rows

    @staticmethod
    def _no_longer_draft_pays(longer: list[float], expected: float, run: float, drafting: float,
                              best: float) -> bool:
        """Whether no longer draft can beat the ratio `best`: each further token adds at most
        `run` expected tokens (acceptances are at most 1) and no drafting cost; `longer`: the costs
        of verifying one more row, two more, ..."""
        for cost in longer:
            expected += run
            if expected > best * (cost + drafting):
                return False
        return True


@dataclass
class _Chain:
    """One sequence's offer as the controller weighs it: the keys drawn so far from `offer`, the
    most it may draft (`cap`) and the least (`floor`), how many are chosen (`n`) and the chance
    that all of them are accepted (`run`). `decided`: its keys are what it drafts (a fixed
    length, an offer no longer than the floor, a drafter being explored); else the controller
    chooses."""

    keys: list[Evidence]
    offer: Iterator[Evidence]
    cap: int
    floor: int
    decided: bool = False
    n: int = 0
    run: float = 1.0
    drafter: Evidence | None = None
    per_token: float = 0.0

    @classmethod
    def of(cls, ctl: Controller, offer: Iterable[Evidence], temp: float,
           limit: int | None) -> _Chain:
        cap = ctl.k_max if limit is None else max(0, min(ctl.k_max, limit))
        floor = min(ctl.k_min, cap)
        keys = map(Evidence.at, offer, repeat(temp))
        c = cls([], keys, cap, floor)
        c.draw(cap if not ctl.adaptive else min(cap, floor + 1))
        if not ctl.adaptive or len(c.keys) <= floor:
            c.decided = True
        elif ctl._stats(c.keys[0]).tries < ctl.explore.get(c.keys[0].source, 0):
            c.decided = True
            c.draw(min(cap, max(floor, ctl.explore_k)))
        return c

    def draw(self, n: int) -> list[Evidence]:
        """The first n keys, drawn from the offer as far as needed (fewer where it ends)."""
        self.keys += islice(self.offer, max(0, n - len(self.keys)))
        return self.keys[:n]

    def can_grow(self) -> bool:
        """Whether a longer draft is allowed and on offer (its next key drawn)."""
        if self.n >= self.cap:
            return False
        if self.n == len(self.keys):
            key = next(self.offer, None)
            if key is None:
                self.cap = self.n  # the offer ends here
                return False
            self.keys.append(key)
        return True

    def grow(self, ctl: Controller, gain: float, one: float) -> float:
        """The next key chosen, `gain` the chance that it and all before it are accepted: its
        drafting's seconds (`one`: a target step's)."""
        key = self.keys[self.n]
        self.run = gain
        if key.cost_key is not self.drafter:
            self.drafter, self.per_token = key.cost_key, ctl.draft_cost(key, one)
        self.n += 1
        return self.per_token
