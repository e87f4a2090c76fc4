import numpy as np
import pytest

from spectool.verify import Sampling, accept_greedy, accept_sampled, probs, sample, top_probability


def test_temperature_only_is_softmax():
    logits = np.array([1.0, 2.0, 3.0, 0.5], np.float32)
    p = probs(logits, Sampling(temp=0.5))
    expect = np.exp(logits / 0.5) / np.exp(logits / 0.5).sum()
    np.testing.assert_allclose(p, expect, rtol=1e-6)


def test_top_k_top_p_min_p():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert np.count_nonzero(probs(logits, Sampling(1.0, top_k=2))) == 2
    # top-p keeps the smallest head reaching the mass: 0.5 + 0.2 = 0.7 >= 0.7
    assert np.count_nonzero(probs(logits, Sampling(1.0, top_p=0.7))) == 2
    assert np.count_nonzero(probs(logits, Sampling(1.0, top_p=0.71))) == 3
    # min-p drops tokens below min_p * max
    p = probs(logits, Sampling(1.0, min_p=0.3))
    assert np.count_nonzero(p) == 3 and p.sum() == pytest.approx(1.0)


def test_top_p_on_a_large_vocabulary_matches_a_full_sort():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1, 20000).astype(np.float32)  # flat: the 4096-token head is not enough
    p = probs(logits, Sampling(1.0, top_p=0.9))
    full = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    order = np.argsort(-full, kind="stable")
    cut = np.searchsorted(np.cumsum(full[order]), 0.9) + 1
    assert set(np.flatnonzero(p)) == set(order[:cut])


def test_sample_follows_p():
    rng = np.random.default_rng(1)
    p = np.array([0.1, 0.6, 0.3])
    counts = np.bincount([sample(p, rng) for _ in range(20000)], minlength=3) / 20000
    np.testing.assert_allclose(counts, p, atol=0.015)


def test_accept_greedy():
    assert accept_greedy([5, 6, 7, 8], [5, 6, 9]) == (2, 7)
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == (3, 8)
    assert accept_greedy([4], []) == (0, 4)


def test_rejection_sampling_marginal_is_p():
    """One position: whatever q is, the emitted token follows p exactly."""
    rng = np.random.default_rng(2)
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.1, 0.1, 0.8])
    out = []
    for _ in range(30000):
        d = sample(q, rng)
        n, t = accept_sampled([p, p], [q], [d], rng)
        out.append(d if n == 1 else t)
    np.testing.assert_allclose(np.bincount(out, minlength=3) / len(out), p, atol=0.012)


def test_one_hot_q_accepts_with_p_of_the_draft():
    rng = np.random.default_rng(3)
    p = np.array([0.25, 0.75])
    acc = sum(accept_sampled([p, p], None, [0], rng)[0] for _ in range(20000)) / 20000
    assert acc == pytest.approx(0.25, abs=0.015)
    # on rejection the resample never returns the rejected token
    assert all(accept_sampled([p, p], None, [0], rng) in [(1, 0), (1, 1), (0, 1)] for _ in range(200))


def test_top_probability():
    assert top_probability(np.array([0.0, 0.0], np.float32)) == pytest.approx(0.5)
    assert top_probability(np.array([10.0, 0.0], np.float32)) > 0.99
