"""Sampling transforms and the acceptance rules of speculative decoding.

Notation (Leviathan et al. 2023, Chen et al. 2023): p is the TARGET's distribution, q the DRAFTER's; d_1..d_k are
the drafted tokens. A draft token is accepted with probability min(1, p(d)/q(d)); at the first rejection the
token is resampled from max(0, p - q), renormalised; when all k are accepted one bonus token comes from p. The
output then follows p exactly. At temperature 0 this reduces to: accept while argmax p == d.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np


@dataclass(frozen=True)
class Sampling:
    temp: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0


def probs(logits: np.ndarray, s: Sampling) -> np.ndarray:
    """The distribution after temperature, top-k, top-p and min-p (in that order), as float64."""
    z = logits.astype(np.float64) / s.temp
    n = z.shape[0]
    if 0 < s.top_k < n:
        kth = np.partition(z, n - s.top_k)[n - s.top_k]
        z[z < kth] = -np.inf
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    if s.top_p < 1.0:
        # the smallest set of most likely tokens whose mass reaches top_p; sort only the head when it suffices
        m = min(n, 4096)
        head = np.argpartition(-p, m - 1)[:m] if m < n else np.arange(n)
        order = head[np.argsort(-p[head], kind="stable")]
        cum = np.cumsum(p[order])
        if cum[-1] < s.top_p and m < n:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
        cut = int(np.searchsorted(cum, s.top_p)) + 1
        keep = np.zeros(n, bool)
        keep[order[:cut]] = True
        p[~keep] = 0.0
    if s.min_p > 0.0:
        p[p < s.min_p * p.max()] = 0.0
    return p / p.sum()


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(p) - 1))


def accept_greedy(target_argmax: Iterable[int], draft: Sequence[int]) -> tuple[int, int]:
    """(number of draft tokens accepted, the target's next token) at temperature 0. `target_argmax` may be
    lazy: nothing past the first mismatch is read."""
    for n, t in enumerate(target_argmax):
        if n == len(draft) or draft[n] != t:
            return n, int(t)
    raise ValueError("need len(draft) + 1 target rows")


def accept_sampled(
    p: Sequence[np.ndarray],
    q: Sequence[np.ndarray] | None,
    draft: Sequence[int],
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Rejection sampling. p has len(draft)+1 rows; q has len(draft) rows, or None for a deterministic
    drafter (prompt lookup), whose q is one-hot on the drafted token."""
    for i, d in enumerate(draft):
        q_d = 1.0 if q is None else q[i][d]
        if rng.random() * q_d < p[i][d]:  # accept with probability min(1, p(d)/q(d))
            continue
        residual = np.maximum(p[i] - (_one_hot(d, len(p[i])) if q is None else q[i]), 0.0)
        return i, sample(residual / residual.sum(), rng)
    return len(draft), sample(p[len(draft)], rng)


def _one_hot(i: int, n: int) -> np.ndarray:
    e = np.zeros(n)
    e[i] = 1.0
    return e


def top_probability(logits: np.ndarray) -> float:
    """Softmax probability of the most likely token (for the draft's early stop at temperature 0)."""
    m = logits.max()
    return float(1.0 / np.exp(logits - m, dtype=np.float32).sum())
