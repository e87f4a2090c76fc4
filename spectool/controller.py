"""Chooses the draft length k of each step from what this machine charges and how often drafts are accepted.

With a_i the estimated chance that draft position i is accepted given that 1..i-1 were, a step with k drafts
yields on average E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j tokens and costs verify(k+1) + k * draft_cost. The
controller picks the k in [k_min, k_max] with the best E(k) / cost; k = 0 is plain decoding. Costs and
acceptance are learnt online (separately for each drafter key, e.g. "draft" or "lookup:3"), and a key held at
k = 0 is re-probed with a short draft now and then so that its estimate can recover.

Costs belong to the model and the machine, not to one generation: a `Costs` table can be shared by every
controller that drives the same target (the turns of a chat, the prompts of a benchmark), so that batch sizes
measured once keep their price. llama.cpp's CPU kernels make some sizes much cheaper than their neighbours
(Gemma 3 270M Q4_K_M: 7 tokens 60 ms, 8 tokens 43 ms), which only measurement finds.

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
class Costs:
    """What verifying a batch and drafting a token cost, learnt as running averages (seconds)."""

    jump_prior: float = 0.8  # extra cost of a batch of 2 over 1 token, relative to one token, until measured
    slope_prior: float = 0.2  # extra cost of each further batched token, relative to one token, until measured
    unmeasured: float = 0.9  # sizes not yet measured are priced this much below their estimate, so they get tried
    timed: bool = True
    verify: dict[int, float] = field(default_factory=dict)  # batch size -> seconds
    draft: dict[str, float] = field(default_factory=dict)  # drafter key -> seconds per drafted token
    _warm: set = field(default_factory=set)

    def to_json(self) -> dict:
        return {"verify": {str(b): c for b, c in sorted(self.verify.items())}, "draft": dict(self.draft)}

    @classmethod
    def from_json(cls, obj: dict) -> Costs:
        """Costs saved by an earlier run. Each size's first new sample is still dropped as a warm-up."""
        return cls(verify={int(b): float(c) for b, c in obj.get("verify", {}).items() if float(c) > 0},
                   draft={str(k): float(c) for k, c in obj.get("draft", {}).items() if float(c) >= 0})

    def observe_verify(self, batch_size: int, seconds: float) -> None:
        if self.timed:
            self._ema(self.verify, batch_size, seconds)

    def observe_draft(self, key: str, n_drafted: int, seconds: float) -> None:
        if self.timed and n_drafted > 0:
            self._ema(self.draft, key, seconds / n_drafted)

    def _ema(self, table: dict, key, sample: float) -> None:
        """Running average of a cost. The first sample of each key is a warm-up (llama.cpp builds and
        allocates a graph for a new batch shape) and is dropped; later outliers are clipped."""
        if key not in self._warm:
            self._warm.add(key)
            return
        old = table.get(key)
        table[key] = sample if old is None else 0.8 * old + 0.2 * min(sample, 4 * old)

    def verify_cost(self, batch_size: int) -> float:
        return self.verify_costs(batch_size)[batch_size]

    def verify_costs(self, largest: int) -> list[float]:
        """Seconds to verify a batch of each size up to `largest` (index = size; index 0 unused).

        Measured sizes answer for themselves; others are read off a piecewise line through the measured sizes
        (between two, the straight line; past the largest, their least-squares slope). Batches of two or more
        are priced apart from a single token, because llama.cpp's CPU backend switches matmul kernels there
        (Gemma 3 270M: 1 token 10-13 ms, 2 tokens 21-23 ms): until measured, a batch of 2 costs `jump_prior`
        more than one token and each further token `slope_prior` more, both relative to one token (or less,
        when a measured longer batch says so). Interpolating, rather than fitting one line through every size,
        keeps short batches cheap when only long ones were measured, so they get tried. Estimates are
        discounted by `unmeasured` (optimism that makes the controller measure a size)."""
        measured = sorted((b, c) for b, c in self.verify.items() if b >= 2)
        one = self.verify.get(1)
        if one is None:  # one token's cost, inferred from a batch through the priors (1.0 before anything)
            one = measured[0][1] / (1 + self.jump_prior + self.slope_prior * (measured[0][0] - 2)) if measured else 1.0
        if len(measured) >= 2:  # the least-squares slope of the measured sizes >= 2
            n = len(measured)
            mx = sum(b for b, _ in measured) / n
            my = sum(c for _, c in measured) / n
            sxx = sum((b - mx) ** 2 for b, _ in measured)
            slope = max(0.0, sum((b - mx) * (c - my) for b, c in measured) / sxx)
        else:
            slope = self.slope_prior * one
        if not measured or measured[0][0] > 2:  # size 2 from the priors: the cheaper of the jump over one token
            anchor = one * (1 + self.jump_prior)  # and the step down from the smallest measured size
            if measured:
                anchor = min(anchor, measured[0][1] - self.slope_prior * one * (measured[0][0] - 2))
            measured.insert(0, (2, max(anchor, one)))
        out, i = [0.0, one], 0
        for b in range(2, largest + 1):
            while i + 1 < len(measured) and measured[i + 1][0] <= b:
                i += 1
            (b0, c0), nxt = measured[i], measured[i + 1] if i + 1 < len(measured) else None
            if nxt is not None:  # between two measured sizes
                out.append(c0 + (nxt[1] - c0) * (b - b0) / (nxt[0] - b0))
            else:
                out.append(max(c0 + slope * (b - b0), 1e-9))
        return [c if b in self.verify else self.unmeasured * c for b, c in enumerate(out)]


@dataclass
class Controller:
    k_max: int = 8
    k_min: int = 0
    adaptive: bool = True
    decay: float = 0.97  # weight kept by older acceptance observations at each update
    # prior acceptance by key, and its weight in observations. Prompt lookup's keys (see PromptLookup.key):
    # the acceptance of a first drafted token measured on Gemma 3 270M over 35 code and grounded-chat prompts
    # (longer matches whose followers always agreed are right far more often), weighted as 8 observations. A
    # draft model's is a guess that its own first observations soon replace.
    priors: dict[str, tuple[float, float]] = field(
        default_factory=lambda: {"lookup:1": (0.55, 8.0), "lookup:2": (0.75, 8.0), "lookup:3": (0.8, 8.0),
                                 "lookup:4": (0.9, 8.0), "lookup:8": (0.97, 8.0), "lookup:1?": (0.3, 8.0),
                                 "lookup:2?": (0.2, 8.0), "lookup:3?": (0.25, 8.0), "lookup:4?": (0.35, 8.0),
                                 "lookup:8?": (0.3, 8.0), "draft": (0.6, 2.0)}
    )
    prior_other: tuple[float, float] = (0.5, 2.0)  # for other keys
    # a sampled run's keys carry its temperature ("lookup:3@T0.8"): what greedy runs learnt does not carry over.
    # Their prior is the greedy one raised to this power, with at most this weight in observations: at temperature
    # 0.8, first-position acceptance of lookup keys over 13 ShareGPT / HumanEval prompts (Gemma 3 270M) was close
    # to the square of the greedy one (lookup:1 0.27-0.56, lookup:1? 0.11-0.34, lookup:2 0.50-0.86, lookup:8 0.97+)
    sampled_prior: tuple[float, float] = (2.0, 4.0)
    # keys whose quality is unknown until tried (a user's draft model): draft this many times first
    explore: dict[str, int] = field(default_factory=lambda: {"draft": 2})
    explore_k: int = 4
    optimism: float = 0.1
    probe_every: int = 32
    draft_cost_prior: float = 0.15  # a draft-model token relative to one target decode, until measured
    timed: bool = True  # False: costs stay at their priors (see the module docstring)
    costs: Costs | None = None  # shared with other controllers of the same target; None: a table of our own
    _acc: dict[str, _Acceptance] = field(default_factory=dict)

    def __post_init__(self):
        if self.costs is None:
            self.costs = Costs()
        if not self.timed:
            self.costs = Costs(self.costs.jump_prior, self.costs.slope_prior, unmeasured=1.0, timed=False)

    # -- what the loop tells us ----------------------------------------------------------------------------
    def observe_verify(self, batch_size: int, seconds: float) -> None:
        self.costs.observe_verify(batch_size, seconds)

    def observe_draft(self, key: str, n_drafted: int, seconds: float) -> None:
        self.costs.observe_draft(key, n_drafted, seconds)

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
        (prior, w), out = self.prior(key), []
        for h, t in zip(a.hits, a.tries):
            prior = (h + w * prior) / (t + w)
            out.append(min(1.0, prior + optimism / (t + w) ** 0.5))
        return out

    def prior(self, key: str) -> tuple[float, float]:
        """(prior acceptance, its weight in observations) of a key."""
        base, sampled, _ = key.partition("@")
        prior, w = self.priors.get(base, self.prior_other)
        return (prior ** self.sampled_prior[0], min(w, self.sampled_prior[1])) if sampled else (prior, w)

    def verify_cost(self, batch_size: int) -> float:
        return self.costs.verify_cost(batch_size)

    def expected_rates(self, key: str, largest: int, optimism: float = 0.0) -> list[float]:
        """Expected tokens per second of a step drafting k tokens under `key`, for k = 0..largest."""
        per_draft = self.costs.draft.get(key)
        costs = self.costs.verify_costs(largest + 1)
        if per_draft is None:
            per_draft = self.draft_cost_prior * costs[1] if key.partition("@")[0] == "draft" else 0.0
        out, expected, run = [1.0 / costs[1]], 1.0, 1.0
        for k, a in enumerate(self.acceptance(key, optimism)[:largest], 1):
            run *= a
            expected += run
            out.append(expected / (costs[k + 1] + k * per_draft))
        return out

    # -- the decision --------------------------------------------------------------------------------------
    def choose(self, key: str, available: int) -> int:
        hi = min(self.k_max, available)
        if not self.adaptive or hi <= self.k_min:
            return max(0, hi)
        a = self._stats(key)
        if a.tries[0] < self.explore.get(key.partition("@")[0], 0):
            return max(self.k_min, min(hi, self.explore_k))
        rates = self.expected_rates(key, hi, self.optimism)
        best = max(range(self.k_min, hi + 1), key=rates.__getitem__)
        if best == 0:
            a.zero_streak += 1
            if a.zero_streak >= self.probe_every:  # re-probe: a short draft keeps the estimate honest
                a.zero_streak = 0
                return min(hi, self.explore_k)
        else:
            a.zero_streak = 0
        return best
