"""The sampler chain against llama.cpp's own (the oracle: its samplers, through llama-cpp-python's low-level
bindings), and the acceptance rules on sparse rows."""

import ctypes

import numpy as np
import pytest

from spectool.core.verify import (Dist, Random, Sampling, accept_greedy, accept_sampled, distribution, greedy_token,
                                  penalize, residual)

# -- the oracle --------------------------------------------------------------------------------------------------
TOKEN = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


def llama_cpp_chain(logits: np.ndarray, s: Sampling, history=()) -> dict[int, float]:
    """The distribution llama.cpp's default chain (common/sampling.cpp: penalties -> top-k -> top-p -> min-p ->
    temperature, then `dist` draws) leaves for this row: {token: probability}, computed by llama.cpp's samplers
    themselves on a llama_token_data_array."""
    import llama_cpp as L

    n = len(logits)
    last_n = s.repeat_last_n if s.repeat_last_n >= 0 else len(history) + 1  # -1 is common/arg.cpp's "the context"
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    try:
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_penalties(
            n, last_n, s.repeat_penalty, s.frequency_penalty, s.presence_penalty))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(s.top_k))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(s.top_p, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(s.min_p, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(s.temp))
        for t in history:
            L.llama_sampler_accept(chain, int(t))
        ids, z = apply_sampler(chain, logits)
        z = z.astype(np.float64)
    finally:
        L.llama_sampler_free(chain)
    w = np.exp(z - z.max())  # at temperature 0 llama.cpp sets every logit but the best to -inf: weight 0
    return {t: p for t, p in zip(ids.tolist(), (w / w.sum()).tolist()) if p > 0}


def apply_sampler(sampler, logits: np.ndarray, selected: bool = False):
    """(ids, logits) of the candidates llama.cpp's `sampler` leaves when applied to a row of every token; with
    `selected`, the id of the one it selected."""
    import llama_cpp as L

    n = len(logits)
    buf = np.zeros(n, TOKEN)
    buf["id"] = np.arange(n)
    buf["logit"] = logits
    arr = L.llama_token_data_array(data=buf.ctypes.data_as(L.llama_token_data_p), size=n, selected=-1, sorted=False)
    L.llama_sampler_apply(sampler, ctypes.byref(arr))
    out = np.ctypeslib.as_array(ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_uint8)),
                                shape=(arr.size * TOKEN.itemsize,)).view(TOKEN)
    if selected:
        return int(out["id"][arr.selected])
    return out["id"].copy(), out["logit"].copy()


def llama_cpp_draws(rows, s: Sampling, seed: int) -> list[int]:
    """The tokens llama.cpp's default chain, ending in its `dist` sampler seeded with `seed`, draws from these
    rows one after the other (as llama-completion samples a text)."""
    import llama_cpp as L

    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    try:
        for stage in (L.llama_sampler_init_top_k(s.top_k), L.llama_sampler_init_top_p(s.top_p, 1),
                      L.llama_sampler_init_min_p(s.min_p, 1), L.llama_sampler_init_temp(s.temp),
                      L.llama_sampler_init_dist(seed)):
            L.llama_sampler_chain_add(chain, stage)
        return [apply_sampler(chain, np.asarray(row, np.float32), selected=True) for row in rows]
    finally:
        L.llama_sampler_free(chain)


def top_p_boundary(logits, s: Sampling, history, token: int) -> bool:
    """Whether `token` sits on the top-p boundary within float32 rounding: the mass of the tokens above it is
    within 1e-5 of top_p. llama.cpp sums 262k float32 terms in index order (relative error ~1e-6 and more), so
    such a token may fall on either side in either implementation."""
    z = penalize(logits, s, history).astype(np.float64)
    if s.top_k > 0:
        z = np.where(z >= np.sort(z)[-s.top_k], z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    return s.top_p < 1 and abs(p[z > z[token]].sum() - s.top_p) < 1e-5


def assert_same(ours: Dist, theirs: dict[int, float], ties: bool = False, row=None):
    """Same support and probabilities within float32 rounding. With `ties` at a cut-off, which of the tied
    tokens survive is up to each sort, so only the multiset of probabilities must agree. `row` = (logits,
    sampling, history) lets a token on the top-p boundary (see top_p_boundary) be in one support only."""
    mine = dict(zip(ours.ids.tolist(), ours.p.tolist()))
    assert ours.p.sum() == pytest.approx(1.0, abs=1e-9)
    if ties:
        assert len(mine) == len(theirs)
        np.testing.assert_allclose(sorted(mine.values()), sorted(theirs.values()), rtol=2e-5, atol=1e-7)
        return
    odd = set(mine) ^ set(theirs)
    if row is not None and len(odd) == 1 and top_p_boundary(*row, odd.pop()):
        mine, theirs = _renormalised(mine, theirs), _renormalised(theirs, mine)
    assert set(mine) == set(theirs), (sorted(set(mine) ^ set(theirs))[:10], len(mine), len(theirs))
    ids = sorted(mine)
    # llama.cpp computes in float32 (expf, float sums); we normalise in float64: relative 2e-5 covers float32's
    # rounding over a few hundred terms (measured differences here: below 3e-6)
    np.testing.assert_allclose([mine[i] for i in ids], [theirs[i] for i in ids], rtol=2e-5, atol=1e-7)


def _renormalised(a: dict, b: dict) -> dict:
    common = {t: p for t, p in a.items() if t in b}
    total = sum(common.values())
    return {t: p / total for t, p in common.items()}


SETTINGS = [
    Sampling(0.8, 40, 0.95, 0.05),  # llama.cpp's defaults
    Sampling(1.0, 0, 0.9, 0.0),  # top-p over the whole vocabulary
    Sampling(0.7, 0, 1.0, 0.1),  # min-p alone
    Sampling(1.5, 5, 1.0, 0.0),  # top-k alone
    Sampling(0.5, 0, 0.5, 0.05),
    Sampling(1.0, 0, 1.0, 0.0),  # temperature alone: every token
    Sampling(2.0, 100, 0.99, 0.01),
    Sampling(0.8, 40, 0.95, 0.05, repeat_penalty=1.3, repeat_last_n=64),
    Sampling(0.9, 0, 0.8, 0.02, repeat_penalty=0.8, repeat_last_n=16, presence_penalty=0.5, frequency_penalty=0.3),
    Sampling(1.0, 20, 1.0, 0.0, frequency_penalty=-0.7, repeat_last_n=-1),
]


@pytest.mark.parametrize("s", SETTINGS, ids=str)
@pytest.mark.parametrize("n,scale", [(50, 1.0), (5000, 3.0), (262144, 2.5)])
def test_random_rows_match_llama_cpp(s, n, scale):
    rng = np.random.default_rng(n + int(scale * 10))
    for trial in range(3):
        logits = (rng.standard_normal(n) * scale + rng.standard_normal() * 5).astype(np.float32)
        history = rng.integers(0, min(n, 300), size=int(rng.integers(0, 100))).tolist()
        assert_same(distribution(logits, s, history), llama_cpp_chain(logits, s, history),
                    row=(logits, s, history))


@pytest.mark.parametrize("s", [SETTINGS[0], Sampling(1.0, 0, 0.9, 0.0), Sampling(0.7, 0, 1.0, 0.1),
                               Sampling(1.5, 5, 1.0, 0.0), Sampling(1.0, 0, 1.0, 0.0)],
                         ids=["defaults", "top-p", "min-p", "top-k", "temperature"])
def test_a_seed_draws_what_llama_cpp_draws(s):
    """A seed's draws are llama.cpp's: its mt19937 numbers, its candidates' order (by logit once top-k or top-p
    sorted them, else by id). A draw can differ only where its number falls within float rounding of two
    tokens' boundary (about 1e-7 of the time): none did in 2,000 rows on each of these settings."""
    rng = np.random.default_rng(21)
    rows = [(rng.standard_normal(5000) * 2.0).astype(np.float32) for _ in range(300)]
    ours = Random(1234)
    mine = [distribution(row, s).sample(ours) for row in rows]
    theirs = llama_cpp_draws(rows, s, 1234)
    assert sum(a != b for a, b in zip(mine, theirs)) <= 1
    assert sum(a != b for a, b in zip(mine, llama_cpp_draws(rows, s, 1235))) > 100  # another seed, other draws
    again = Random(1234 + (1 << 32))  # llama.cpp's seeds are 32-bit
    assert [distribution(row, s).sample(again) for row in rows[:20]] == mine[:20]


def test_a_deterministic_draft_costs_one_number_a_token_as_plain_sampling():
    """Lookup's drafts are the target's own draws kept where they are the draft: the same numbers choose the same
    tokens, drafted or not, up to a refused draft's token."""
    rows = [dist([0.5, 0.3, 0.2])] * 6
    r = Random(9)
    plain = [rows[0].sample(r) for _ in range(6)]
    n, t = accept_sampled(lambda i: rows[i], None, plain[:3] + [(plain[3] + 1) % 3], Random(9))
    assert (n, t) == (3, plain[3])


def test_the_order_of_the_chain_matters():
    """Temperature comes last in llama.cpp's chain: top-p and min-p see the untempered logits. Applying it first
    (as spectool once did) keeps another set of tokens: the oracle tells them apart."""
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], np.float32))
    s = Sampling(3.0, 0, 0.7, 0.0)
    ours, theirs = distribution(logits, s), llama_cpp_chain(logits, s)
    assert_same(ours, theirs)
    assert set(ours.ids.tolist()) == {0, 1}  # with temperature first, softmax(logits / 3) would need 4 tokens


ADVERSARIAL = {
    "one dominant token": np.array([30.0] + [0.0] * 999, np.float32),
    "flat": np.zeros(1000, np.float32),
    "ties above the cut-offs": np.array([5.0, 5.0, 5.0, 4.0, 4.0] + [-3.0] * 995, np.float32),
    "top-p exactly on a boundary": np.log(np.array([0.5, 0.25, 0.125, 0.125], np.float32)),
    "min-p exactly on a boundary": np.array([0.0, np.log(0.05), np.log(0.05) - 1e-3, -10.0], np.float32),
    "huge and tiny": np.array([80.0, 79.0, -80.0, -1e4, 0.0], np.float32),
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
@pytest.mark.parametrize("s", [Sampling(0.8, 40, 0.95, 0.05), Sampling(1.0, 0, 0.75, 0.0), Sampling(1.0, 2, 1.0, 0.0),
                               Sampling(1.0, 0, 1.0, 0.05), Sampling(0.3, 3, 0.5, 0.0)], ids=str)
def test_adversarial_rows_match_llama_cpp(name, s):
    logits = ADVERSARIAL[name]
    ours = distribution(logits, s)
    outside = np.setdiff1d(np.arange(len(logits)), ours.ids)
    ties = bool(np.isin(logits[ours.ids].min(), logits[outside]))  # a tie at the cut-off: either token may stay
    assert_same(ours, llama_cpp_chain(logits, s), ties=ties)


@pytest.mark.realmodel
def test_real_gemma_rows_match_llama_cpp(gemma_q4):
    from spectool.llama.engine import Model

    with Model(gemma_q4, n_ctx=256, n_threads=2) as m:
        prompt = m.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
        m.eval(prompt, logits="all")
        rows = [np.array(m.logits(i)) for i in range(0, len(prompt), 3)]
    for s in SETTINGS:
        for i, row in enumerate(rows):
            history = prompt[: 3 * i + 1]
            assert_same(distribution(row, s, history), llama_cpp_chain(row, s, history), row=(row, s, history))


def test_greedy_token_is_the_argmax_of_the_penalised_row():
    """At temperature 0 the token is the argmax of the row after penalties (within their window), as llama.cpp
    picks it, and never a banned one."""
    logits = np.array([1.0, 3.0, 2.9, -1.0], np.float32)
    for s, recent, expected in ((Sampling(), [], 1),
                                (Sampling(repeat_penalty=1.1), [1], 2),  # 3 / 1.1 < 2.9
                                (Sampling(repeat_penalty=1.1, repeat_last_n=2), [1, 0, 0], 1)):  # 1 out of window
        assert greedy_token(logits, s, recent=recent) == expected
        assert list(llama_cpp_chain(logits, s, history=recent)) == [expected]
    assert greedy_token(logits, Sampling(), banned=np.array([1, 2])) == 0


# -- acceptance ----------------------------------------------------------------------------------------------------
def dist(p, n=None):
    p = np.asarray(p, float)
    ids = np.flatnonzero(p)
    return Dist(ids, p[ids] / p.sum(), n or len(p))


def test_sample_follows_p():
    rng = np.random.default_rng(1)
    d = dist([0.1, 0.6, 0.3])
    counts = np.bincount([d.sample(rng) for _ in range(20000)], minlength=3) / 20000
    np.testing.assert_allclose(counts, [0.1, 0.6, 0.3], atol=0.015)


def test_accept_greedy():
    assert accept_greedy([5, 6, 7, 8], [5, 6, 9]) == (2, 7)
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == (3, 8)
    assert accept_greedy([4], []) == (0, 4)


def test_residual_is_over_the_union_of_supports():
    r = residual(dist([0.5, 0.5, 0, 0]), dist([0, 0.3, 0.7, 0]))
    assert r.ids.tolist() == [0, 1] and r.p == pytest.approx([0.5 / 0.7, 0.2 / 0.7])
    r = residual(dist([0.2, 0, 0.8, 0]), dist([0.1, 0.6, 0.3, 0]))  # token 1: q only; tokens 0, 2: both
    assert r.ids.tolist() == [0, 2] and r.p == pytest.approx([0.1 / 0.6, 0.5 / 0.6])


def test_rejection_sampling_marginal_is_p():
    """One position: whatever q is, the emitted token follows p exactly, with supports that differ."""
    rng = np.random.default_rng(2)
    p, q = dist([0.5, 0.3, 0.2, 0.0]), dist([0.1, 0.0, 0.6, 0.3])
    out = []
    for _ in range(30000):
        d = q.sample(rng)
        n, t = accept_sampled(lambda i: p, [q], [d], rng)
        out.append(d if n == 1 else t)
    np.testing.assert_allclose(np.bincount(out, minlength=4) / len(out), [0.5, 0.3, 0.2, 0.0], atol=0.012)


def test_one_hot_q_accepts_with_p_of_the_draft():
    rng = np.random.default_rng(3)
    p = dist([0.25, 0.75])
    acc = sum(accept_sampled(lambda i: p, None, [0], rng)[0] for _ in range(20000)) / 20000
    assert acc == pytest.approx(0.25, abs=0.015)
    # on rejection the resample never returns the rejected token
    assert all(accept_sampled(lambda i: p, None, [0], rng) in [(1, 0), (1, 1), (0, 1)] for _ in range(200))


def test_rows_past_the_first_rejection_are_never_computed():
    rng = np.random.default_rng(4)
    asked = []

    def p(i):
        asked.append(i)
        return dist([1.0, 0.0, 0.0])

    n, t = accept_sampled(p, None, [0, 1, 0, 0], rng)  # token 1 has p = 0: rejected at position 1
    assert (n, t) == (1, 0) and asked == [0, 1]


def test_mismatched_vocabularies_fail_loudly():
    rng = np.random.default_rng(5)
    p, q = dist([0.5, 0.5, 0.0]), dist([0.2, 0.8], n=2)
    with pytest.raises(ValueError, match="lives on 2 tokens"):
        accept_sampled(lambda i: p, [q], [1], rng)
    with pytest.raises(ValueError, match="target has 3"):
        accept_sampled(lambda i: p, None, [7], rng)
