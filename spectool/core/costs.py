"""What verifying a batch and drafting a token cost on this machine: measured, so that a busy minute
cannot set a price for good (see Costs)."""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Sequence

from spectool.core.evidence import Evidence
from spectool.core.evidence import Source


WINDOW = 9  # samples a batch size keeps, the newest
# no verification of one batch takes this long: a saved price beyond it is damage, not a price
MAX_SECONDS = 600.0


def _seconds(x) -> float | None:
    """`x` as a cost in seconds if it can be one: a finite number in (0, MAX_SECONDS)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 < x < MAX_SECONDS:
        return float(x)
    return None


@dataclass(slots=True)
class _Size:
    """One batch size's measurements: its newest samples (seconds), the last `fresh` of them taken
    by this process, the others by an earlier run (`run`, saved at Unix time `time`) or before a
    pause."""

    seconds: list[float]
    fresh: int = 0
    last: int = 0  # this process's verification count when it last measured the size
    run: int = 0
    time: float = 0.0

    def estimate(self) -> float:
        """The lower median: one stall among a few samples is not believed."""
        return _lower_median(self.seconds)

    @classmethod
    def from_json(cls, entry) -> _Size | None:
        """A saved size, or None where it is not what `Costs.to_json` writes. An older table's
        single price per size reads as measured at time 0, so it is stale."""
        if not isinstance(entry, dict):
            entry = {"seconds": [entry], "run": 0, "time": 0.0}
        seconds, run, when = entry.get("seconds"), entry.get("run"), entry.get("time")
        if (
            not isinstance(seconds, list)
            or not 1 <= len(seconds) <= WINDOW
            or None in map(_seconds, seconds)
        ):
            return None
        if (
            not isinstance(run, int)
            or isinstance(run, bool)
            or run < 0
            or not isinstance(when, (int, float))
            or not math.isfinite(when)
        ):
            return None
        return cls([float(x) for x in seconds], run=run, time=float(when))


@dataclass
class Costs:
    """What verifying a batch and drafting a token cost on this machine (seconds), measured so that
    a busy minute cannot set a price for good.

    Each batch size keeps its newest samples and is priced at their lower median (one stall, or the
    slower first run of a new batch shape, is outvoted). Samples are pooled only while they come
    close together (within `recent` verifications): a size measured again after a pause, and every
    size a new run measures, starts anew from its old estimate as one sample beside its new ones, so
    a saved table's prices lose weight as soon as this run measures. A price is believed when
    `confirm` close samples say so; otherwise only while it is within `doubt` times what the
    believed sizes around it predict (see `price`) and no dearer than a larger size. A doubted size
    is priced like an unmeasured one, so the controller tries it and measures it again: a price
    inflated by a stall, a busy neighbour or an earlier day corrects itself, while a real kernel
    switch (a batch of 8 dearer or cheaper than 7) is confirmed and kept."""

    # extra cost of a batch of 2 over 1 token, relative to one token, until measured
    jump_prior: float = 0.8
    # extra cost of each further batched token, relative to one token, until measured
    slope_prior: float = 0.2
    # sizes not yet measured are priced this much below their estimate, so they get tried
    unmeasured: float = 0.9
    # ... and sizes past the largest measured, up to this many times it, at most at the slope prior
    # (see `curve`; 1: none)
    reach: float = 1.5
    timed: bool = True
    # a price above this many times its prediction is doubted until confirmed: above the spread of a
    # quiet machine's prices, below a busy spell's (research/notes/2026-12-02-lab.md, "The cost
    # table")
    doubt: float = 1.5
    # ... and this many times a prediction that rests on the priors, which fit a real CPU only
    # roughly (same place)
    doubt_priors: float = 3.0
    confirm: int = 3  # close samples that confirm a price, however far it is from the prediction
    recent: int = 64  # samples further apart than this many verifications are not pooled
    stale_runs: int = 8  # a saved size not measured in this many runs is measured afresh ...
    # ... and so is one measured longer ago than this (the machine's load moves)
    stale_seconds: float = 86400.0
    # the price of every batch size is derived anew when a size is measured for the first time, and
    # otherwise at most every this many verifications (prices move slowly): deriving them is most of
    # the controller's work in a step
    reprice_every: int = 16
    # batch size -> seconds, each size's estimate
    verify: dict[int, float] = field(default_factory=dict)
    # Evidence.cost_key -> seconds per drafted token
    draft: dict[Evidence, float] = field(default_factory=dict)
    # the tables of decodes of several sequences' rows, by how many (`shape`)
    shapes: dict[int, Costs] = field(default_factory=dict)
    runs: int = 0  # the runs of spectool that saved this table before (this one is number runs + 1)
    rejected: int = 0  # entries of a saved table dropped as invalid when it was read
    _sizes: dict[int, _Size] = field(default_factory=dict)
    _warm: set = field(default_factory=set)  # drafters whose first draft was timed (a warm-up)
    _n: int = 0  # verifications observed
    # (_n, _version) when derived, and verify_costs' list
    _prices: tuple[int, int, list[float]] = (-1, 0, [])
    _version: int = 0  # counts the sizes measured for the first time (or afresh)
    # by the run that saved a size: this run's first
    _drift: dict[int, list[float]] = field(default_factory=dict)
    # sample of it over its saved price

    def __post_init__(self):
        now = time.time()
        # prices given by the caller: as if a table saved by this run
        for b, c in self.verify.items():
            self._sizes.setdefault(b, _Size([c], run=self.runs, time=now))

    # -- the saved table
    # -----------------------------------------------------------------------------------
    def to_json(self, now: float | None = None) -> dict:
        now = time.time() if now is None else now
        return {"runs": self.runs + 1,
                "verify": {str(b): {"seconds": [round(x, 7) for x in s.seconds],
                                    "run": self.runs + 1 if s.fresh else s.run, "time": now
                                    if s.fresh else s.time}
                           for b, s in sorted(self._sizes.items()) if s.fresh
                           or not self.forgotten(s.run)},
                "draft": [{"source": k.source.value, "temp": k.temp, "seconds": c}
                          for k, c in self.draft.items()],
                "shapes": {str(n): t.to_json(now) for n, t in sorted(self.shapes.items())
                           if t._sizes}}

    @classmethod
    def from_json(cls, obj, max_batch: int = 1 << 20, now: float | None = None) -> Costs:
        """A table written by `to_json` in an earlier run, read as input: what this code would not
        have written (a size outside 1..max_batch, a cost that is not a finite number of seconds in
        (0, MAX_SECONDS), a damaged draft entry) is dropped and counted in `rejected`. Sizes
        measured more than `stale_runs` runs or `stale_seconds` ago are dropped too (not counted),
        to be measured afresh."""
        now = time.time() if now is None else now
        if not isinstance(obj, dict):
            return cls(rejected=1)
        runs = obj.get("runs", 0)
        whole = isinstance(runs, int) and not isinstance(runs, bool)
        runs = runs if whole and 0 <= runs < 1 << 40 else 0
        costs, bad = cls(runs=runs), 0
        verify, draft = obj.get("verify", {}), obj.get("draft", [])
        for b, entry in (verify.items() if isinstance(verify, dict) else ()):
            s = _Size.from_json(entry) if str(b).isdigit() and 1 <= int(b) <= max_batch else None
            if s is None:
                bad += 1
            elif (
                costs.runs + 1 - s.run <= costs.stale_runs
                and now - costs.stale_seconds <= s.time <= now + 60
            ):
                costs._sizes[int(b)], costs.verify[int(b)] = s, s.estimate()
        for d in (draft if isinstance(draft, list) else ()):
            try:
                temp, seconds = float(d["temp"]), d["seconds"]
                key = Evidence.of(Source(d["source"]), temp=temp)
                if not (math.isfinite(temp) and temp >= 0 and (seconds == 0 or _seconds(seconds))):
                    raise ValueError
            except (TypeError, KeyError, ValueError):
                bad += 1
                continue
            costs.draft[key] = float(seconds)
        shapes = obj.get("shapes", {})
        for n, table in (shapes.items() if isinstance(shapes, dict) else ()):
            if not (str(n).isdigit() and 2 <= int(n) <= max_batch and isinstance(table, dict)):
                bad += 1
                continue
            shape = costs.shapes[int(n)] = cls.from_json({**table, "shapes": {}}, max_batch, now)
            bad, shape.rejected = bad + shape.rejected, 0
        bad += (not isinstance(verify, dict)) + (not isinstance(draft, list))
        bad += not isinstance(shapes, dict)
        costs.rejected = bad
        return costs

    def shape(self, n_seqs: int) -> Costs:
        """The table of decodes of `n_seqs` sequences' rows (generate/batch.py; this one for one),
        kept and saved beside this one. A new one starts from this one's believed prices, as if an
        earlier run had saved them (doubted against what its own decodes measure, and replaced as
        they do): a decode costs by its rows, not by the sequences that share them (2-core EPYC, 400
        tokens a sequence: 4 rows 24.7 ms in one sequence, 25.3 ms as 1+1+1+1; 16 rows 49.4 and
        50.2 ms: research/notes/2026-12-04-parallel-prompts.md)."""
        if n_seqs == 1:
            return self
        if n_seqs not in self.shapes:
            self.shapes[n_seqs] = Costs(verify=self.believed(), timed=self.timed)
        return self.shapes[n_seqs]

    # -- what the loop tells us
    # ----------------------------------------------------------------------------
    def observe_verify(self, batch_size: int, seconds: float) -> None:
        if not self.timed:
            return
        self._n += 1
        s = self._sizes.get(batch_size)
        if s is not None and not s.fresh:
            self._drift.setdefault(s.run, []).append(seconds / s.estimate())
        # anew: the machine may have changed
        if s is None or not s.fresh or self._n - s.last > self.recent:
            old = [] if s is None or (not s.fresh and self.forgotten(s.run)) else [s.estimate()]
            # a size measured for the first time (or afresh) is priced at once
            self._version += not old
            s = self._sizes[batch_size] = _Size(old)
        s.seconds.append(seconds)
        s.fresh += 1
        if len(s.seconds) > WINDOW:
            del s.seconds[0]
        s.last = self._n
        self.verify[batch_size] = s.estimate()

    def observe_draft(self, key: Evidence, n_drafted: int, seconds: float) -> None:
        """A running average per drafter; the first sample is a warm-up, later outliers are
        clipped."""
        if not self.timed or n_drafted <= 0:
            return
        if key not in self._warm:
            self._warm.add(key)
            return
        old, sample = self.draft.get(key), seconds / n_drafted
        self.draft[key] = sample if old is None else 0.8 * old + 0.2 * min(sample, 4 * old)

    # -- prices
    # --------------------------------------------------------------------------------------------
    def verify_cost(self, batch_size: int) -> float:
        """Seconds to verify a batch of `batch_size`, priced from the measurements as they are
        now."""
        return self.price(batch_size)[batch_size]

    def verify_costs(self, largest: int) -> list[float]:
        """Seconds to verify a batch of each size up to at least `largest` (index = size; index 0
        unused), as derived at most `reprice_every` verifications ago (see `price`)."""
        n, version, prices = self._prices
        if len(prices) <= largest or version != self._version or self._n - n >= self.reprice_every:
            prices = self.price(max(largest, len(prices) - 1))
            self._prices = (self._n, self._version, prices)
        return prices

    def price(self, largest: int) -> list[float]:
        """Seconds to verify a batch of each size up to `largest` (index = size; index 0 unused):
        the believed prices (`believed`), and between and beyond them the curve of `curve`,
        discounted by `unmeasured` (optimism that makes the controller measure a size)."""
        believed = self.believed()
        return [c if b in believed else self.unmeasured * c
                for b, c in enumerate(self.curve(believed, largest))]

    def believed(self) -> dict[int, float]:
        """The measured sizes whose price is believed, and at what price. A size confirmed by
        `confirm` close samples, the newest within `recent` verifications, answers for itself. Any
        other (fewer samples, or saved by an earlier run that is not `forgotten`) is believed only
        within `doubt` times what the sizes believed so far predict for it (`predict`;
        `doubt_priors` times where that rests on the priors; one token, the base, always), this
        run's sizes first and the saved ones after them, each in increasing size. Then a believed
        price is no more than the price of a larger believed size: verifying more tokens costs more
        unless measurement says so."""
        sure = {b for b, s in self._sizes.items()
                if s.fresh >= self.confirm and self._n - s.last <= self.recent}
        believed = {b: self.verify[b] for b in sure}
        sizes = sorted(believed)
        # this run's prices first, then the saved ones: a saved price is judged against what the
        # machine charges now
        for b in sorted(self.verify.keys() - sure, key=lambda b: (not self._sizes[b].fresh, b)):
            s = self._sizes[b]
            if not s.fresh and self.forgotten(s.run):
                continue
            price, by_priors = self.predict(believed, sizes, b)
            if b == 1 or self.verify[b] <= (self.doubt_priors if by_priors else self.doubt) * price:
                believed[b] = self.verify[b]
                bisect.insort(sizes, b)
        cheapest = math.inf
        for b in reversed(sizes):
            if b not in sure:
                believed[b] = min(believed[b], cheapest)
            cheapest = min(cheapest, believed[b])
        return believed

    def drift(self, run: int) -> float:
        """How much dearer this machine is now than when the run `run` measured the sizes it saved:
        the lower median of this run's first sample of each of them over its saved price (1 before
        any)."""
        return _lower_median(self._drift.get(run, (1.0,)))

    def forgotten(self, run: int) -> bool:
        """Whether the sizes that the run `run` saved are no longer believed, nor saved again: that
        run measured a machine more than `doubt` times dearer than this one (a busy minute). Its
        prices are then out of date as a whole, and their shape too: a busy neighbour slows some
        batch sizes several times more than others. The other way round (a dearer machine now) is
        left to the doubt of each price, since a stall only inflates."""
        return self.drift(run) * self.doubt < 1.0

    def predict(self, prices: dict[int, float], sizes: list[int], b: int) -> tuple[float, bool]:
        """What `prices` (their sizes in increasing order in `sizes`, b not among them) say a batch
        of `b` costs, and whether that rests on the priors: the straight line between its nearest
        neighbours; below the smallest, the smallest's price; past the largest, its price and the
        least-squares slope of the four largest sizes >= 2, or where fewer than two of those are
        known, the priors' jump and slope relative to one token; infinite where nothing is known."""
        i = bisect.bisect(sizes, b)
        if 0 < i < len(sizes):
            lo, hi = sizes[i - 1], sizes[i]
            return prices[lo] + (prices[hi] - prices[lo]) * (b - lo) / (hi - lo), False
        if i < len(sizes):
            return prices[sizes[0]], False
        if not sizes:
            return math.inf, True
        lo, c = sizes[-1], prices[sizes[-1]]
        points = [(s, prices[s]) for s in sizes[-4:] if s >= 2]
        if len(points) >= 2:
            return c + _slope(points) * (b - lo), False
        one = prices.get(1) or c / (1 + self.jump_prior + self.slope_prior * (lo - 2))
        return c + one * (self.jump_prior * (lo == 1) + self.slope_prior * (b - max(lo, 2))), True

    def curve(self, measured: dict[int, float], largest: int) -> list[float]:
        """Seconds to verify a batch of each size up to `largest` (index = size; index 0 unused), as
        the prices `measured` imply.

        Measured sizes answer for themselves; others are read off a piecewise line through the
        measured sizes (between two, the straight line; past the largest, their least-squares
        slope, and up to `reach` times the largest size no more than the slope prior: a slope
        measured over a few short sizes does not tell a longer batch, and one priced above its worth
        is never tried, so never measured. 2-core EPYC, Gemma Q4_K_M after a busy run: sizes 3-5
        measured at 11.5 ms a token where 5-31 cost 5.4, and the controller drafted 3 tokens run
        after run. The optimism reaches half as far again at a time because trying a long batch
        costs where each token is dear: research/notes/2026-12-07-extrapolation.md). Batches of
        two or more are priced apart from a single token, because llama.cpp's CPU backend switches
        matmul kernels there (Gemma 3 270M: 1 token 10-13 ms, 2 tokens 21-23 ms): until measured, a
        batch of 2 costs `jump_prior` more than one token and each further token
        `slope_prior` more, both relative to one token (or less, when a measured longer batch says
        so). Interpolating, rather than fitting one line through every size, keeps short batches
        cheap when only long ones were measured, so they get tried."""
        points = sorted((b, c) for b, c in measured.items() if b >= 2)
        one = measured.get(1)
        # one token's cost, inferred from a batch through the priors (1.0 before anything)
        if one is None:
            one = (
                points[0][1] / (1 + self.jump_prior + self.slope_prior * (points[0][0] - 2))
                if points
                else 1.0
            )
        slope = _slope(points) if len(points) >= 2 else self.slope_prior * one
        near = min(slope, self.slope_prior * one)
        # size 2 from the priors: the cheaper of the jump over one token
        if not points or points[0][0] > 2:
            # and the step down from the smallest measured size
            anchor = one * (1 + self.jump_prior)
            if points:
                anchor = min(anchor, points[0][1] - self.slope_prior * one * (points[0][0] - 2))
            points.insert(0, (2, max(anchor, one)))
        out = [0.0, one]
        for (b0, c0), (b1, c1) in pairwise(points):  # between two measured sizes: the straight line
            out += [c0 + (c1 - c0) * (b - b0) / (b1 - b0) for b in range(b0, b1)]
        b0, c0 = points[-1]  # past the largest: `near` up to `reach` times its size, then the slope
        far = self.reach * b0
        out += [max(c0 + near * (min(b, far) - b0) + slope * max(0.0, b - far), 1e-9)
                for b in range(b0, largest + 1)]
        return out

    # -- what the user sees
    # --------------------------------------------------------------------------------
    def describe(self, now: float | None = None) -> str:
        """One line: the sizes measured, the runs, and how old the oldest and newest measurements
        are."""
        now = time.time() if now is None else now
        if not self._sizes:
            return f"no batch measured yet ({self.runs} runs)"
        ages = [0.0 if s.fresh else max(0.0, now - s.time) for s in self._sizes.values()]
        newest, oldest = _age(min(ages)), _age(max(ages))
        runs = f"{self.runs} run{'s' if self.runs != 1 else ''}"
        shapes = "".join(f"; {len(t._sizes)} sizes of {n} sequences at once"
                         for n, t in sorted(self.shapes.items()))
        return (f"{len(self._sizes)} batch sizes ({_ranges(sorted(self._sizes))}), saved by "
                f"{runs}, measured {newest if newest == oldest else f'{newest} to {oldest}'} ago"
                f"{shapes}")


def _lower_median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[(len(s) - 1) // 2]


def _slope(points: list[tuple[int, float]]) -> float:
    """The least-squares slope through (size, seconds) points, at least 0."""
    mx = sum(b for b, _ in points) / len(points)
    return max(0.0, sum((b - mx) * c for b, c in points) / sum((b - mx) ** 2 for b, _ in points))


def _ranges(sizes: list[int]) -> str:
    """[1, 2, 3, 5, 8, 9] -> '1-3, 5, 8-9'."""
    runs = [[sizes[0], sizes[0]]]
    for b in sizes[1:]:
        if b == runs[-1][1] + 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f} {unit}"
    return f"{seconds:.0f} s"
