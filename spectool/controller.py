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
    probe_every: int = 32
    jump_prior: float = 0.8  # extra cost of a batch of 2 over 1 token, relative to one token, until measured
    slope_prior: float = 0.2  # extra cost of each further batched token, relative to one token, until measured
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
        """Seconds to verify a batch. Measured sizes answer for themselves. Batches of two or more are modelled
        apart from single tokens, because llama.cpp's CPU backend switches matmul kernels there (measured on
        Gemma 3 270M: 1 token 10-13 ms, 2 tokens 21-23 ms, 8 tokens 39-40 ms): a line through the sizes >= 2
        seen, else the priors (`jump_prior` for the second token, `slope_prior` for each further one, both
        relative to one token)."""
        if batch_size in self._verify:
            return self._verify[batch_size]
        one = self._verify.get(1)
        multi = sorted((b, c) for b, c in self._verify.items() if b >= 2)
        if one is None:  # one token's cost, inferred from a batch through the priors (1.0 before anything)
            one = multi[0][1] / (1 + self.jump_prior + self.slope_prior * (multi[0][0] - 2)) if multi else 1.0
        if batch_size == 1:
            return one
        if len(multi) >= 2:  # least-squares line through the measured sizes >= 2
            n = len(multi)
            mx = sum(b for b, _ in multi) / n
            my = sum(c for _, c in multi) / n
            sxx = sum((b - mx) ** 2 for b, _ in multi)
            slope = max(0.0, sum((b - mx) * (c - my) for b, c in multi) / sxx)
            return max(my + slope * (batch_size - mx), 1e-9)
        if multi:
            b0, c0 = multi[0]
            return c0 + self.slope_prior * one * (batch_size - b0)
        return one * (1 + self.jump_prior + self.slope_prior * (batch_size - 2))

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
            if a.zero_streak >= self.probe_every:  # re-probe: a short draft keeps the estimate honest
                a.zero_streak = 0
                return min(hi, self.explore_k)
        else:
            a.zero_streak = 0
        return best
