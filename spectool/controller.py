"""Chooses the draft length k of each step from what this machine charges and how often drafts are accepted.

With a_i the estimated chance that draft position i is accepted given that 1..i-1 were, a step with k drafts
yields on average E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j tokens and costs verify(k+1) + k * draft_cost. The
controller picks the k in [k_min, k_max] with the best E(k) / cost; k = 0 is plain decoding. Costs and
acceptance are learnt online (separately for each drafter key, e.g. "draft" or "lookup:3"), and a key held at
k = 0 is re-probed with a short draft now and then so that its estimate can recover.

Measured timings make the choice of k, and so the use of random numbers, vary from run to run. For seeded
sampling that must reproduce exactly, `timed=False` keeps the cost model at its priors: k then depends only on
the tokens seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Acceptance:
    tries: list[float]
    hits: list[float]
    zero_streak: int = 0


@dataclass
class Controller:
    k_max: int = 8
    k_min: int = 0
    adaptive: bool = True
    decay: float = 0.97  # weight kept by older acceptance observations at each update
    # prior acceptance by key until measured: longer prompt-lookup matches are more often right
    priors: dict[str, float] = field(
        default_factory=lambda: {"lookup:1": 0.3, "lookup:2": 0.5, "lookup:3": 0.6, "lookup:4": 0.75,
                                 "lookup:8": 0.9, "draft": 0.6}
    )
    prior_accept: float = 0.5  # for other keys
    # keys whose quality is unknown until tried (a user's draft model): draft this many times first
    explore: dict[str, int] = field(default_factory=lambda: {"draft": 2})
    explore_k: int = 4
    optimism: float = 0.3
    prior_weight: float = 2.0
    probe_every: int = 64
    slope_prior: float = 0.5  # extra cost of each batched token relative to one decode, until measured
    draft_cost_prior: float = 0.15  # a draft-model token relative to one target decode, until measured
    timed: bool = True
    _verify: dict[int, float] = field(default_factory=dict)  # batch size -> EMA seconds
    _draft: dict[str, float] = field(default_factory=dict)  # key -> EMA seconds per drafted token
    _acc: dict[str, _Acceptance] = field(default_factory=dict)
    _warm: set = field(default_factory=set)

    # -- what the loop tells us ----------------------------------------------------------------------------
    def observe_verify(self, batch_size: int, seconds: float) -> None:
        if self.timed:
            self._ema(self._verify, batch_size, seconds)

    def observe_draft(self, key: str, n_drafted: int, seconds: float) -> None:
        if self.timed and n_drafted > 0:
            self._ema(self._draft, key, seconds / n_drafted)

    def _ema(self, table: dict, key, sample: float) -> None:
        """Running average of a cost. The first sample of each key is a warm-up (llama.cpp builds and
        allocates a graph for a new batch shape) and is dropped; later outliers are clipped."""
        if key not in self._warm:
            self._warm.add(key)
            return
        old = table.get(key)
        table[key] = sample if old is None else 0.8 * old + 0.2 * min(sample, 4 * old)

    def observe_accept(self, key: str, drafted: int, accepted: int) -> None:
        a = self._stats(key)
        for i in range(min(drafted, accepted + 1)):  # position i was tried: all before it were accepted
            a.tries[i] = a.tries[i] * self.decay + 1.0
            a.hits[i] = a.hits[i] * self.decay + (1.0 if i < accepted else 0.0)

    # -- estimates -----------------------------------------------------------------------------------------
    def _stats(self, key: str) -> _Acceptance:
        a = self._acc.get(key)
        if a is None:
            a = self._acc[key] = _Acceptance([0.0] * self.k_max, [0.0] * self.k_max)
        return a

    def acceptance(self, key: str, optimism: float = 0.0) -> list[float]:
        """Estimated acceptance at each draft position; a position seldom tried borrows the one before it.
        `optimism` adds an upper-confidence bonus that shrinks as a position is tried (exploration)."""
        a = self._stats(key)
        w, prior, out = self.prior_weight, self.priors.get(key, self.prior_accept), []
        for h, t in zip(a.hits, a.tries):
            prior = (h + w * prior) / (t + w)
            out.append(min(1.0, prior + optimism / (t + w) ** 0.5))
        return out

    def verify_cost(self, batch_size: int) -> float:
        if batch_size in self._verify:
            return self._verify[batch_size]
        known = sorted(self._verify.items())
        if len(known) >= 2:  # least-squares line through the measured sizes
            n = len(known)
            mx = sum(b for b, _ in known) / n
            my = sum(c for _, c in known) / n
            sxx = sum((b - mx) ** 2 for b, _ in known)
            slope = sum((b - mx) * (c - my) for b, c in known) / sxx
            return max(my + slope * (batch_size - mx), 1e-9)
        base = known[0][1] / (1 + self.slope_prior * (known[0][0] - 1)) if known else 1.0
        return base * (1 + self.slope_prior * (batch_size - 1))

    def expected_rate(self, key: str, k: int, optimism: float = 0.0) -> float:
        """Expected tokens per second of a step drafting k tokens under `key`."""
        expected, run = 1.0, 1.0
        for a in self.acceptance(key, optimism)[:k]:
            run *= a
            expected += run
        per_draft = self._draft.get(key)
        if per_draft is None:
            per_draft = self.draft_cost_prior * self.verify_cost(1) if key == "draft" else 0.0
        return expected / (self.verify_cost(k + 1) + k * per_draft)

    # -- the decision --------------------------------------------------------------------------------------
    def choose(self, key: str, available: int) -> int:
        hi = min(self.k_max, available)
        if not self.adaptive or hi <= self.k_min:
            return max(0, hi)
        a = self._stats(key)
        if a.tries[0] < self.explore.get(key, 0):
            return max(self.k_min, min(hi, self.explore_k))
        best = max(range(self.k_min, hi + 1), key=lambda k: self.expected_rate(key, k, self.optimism))
        if best == 0:
            a.zero_streak += 1
            if a.zero_streak >= self.probe_every:  # re-probe: one short draft keeps the estimate honest
                a.zero_streak = 0
                return 1
        else:
            a.zero_streak = 0
        return best
