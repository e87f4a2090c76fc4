"""The speculative loop on the generated tiny models: greedy exactness, distribution exactness, rollback, stops."""

import math

import numpy as np
import pytest

from spectool.controller import Controller
from spectool.drafters import DraftModel, Hybrid, PromptLookup
from spectool.engine import Model
from spectool.speculative import Generation, generate_text, speculative_generate
from spectool.stats import Stats
from spectool.verify import Sampling, probs, sample

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef greet(name):",
    "Speculative decoding lets a small draft model propose tokens that a large target",
]


def tokens_of(g, prompt, stats=None):
    return [t for step in speculative_generate(g, prompt, stats) for t in step.tokens]


def drafters(draft):
    return {
        "lookup": lambda: PromptLookup(),
        "draft": lambda: DraftModel(draft),
        "hybrid": lambda: Hybrid(PromptLookup(), DraftModel(draft)),
        "draft-pmin": lambda: DraftModel(draft, p_min=0.6),
    }


@pytest.mark.parametrize("text", PROMPTS)
@pytest.mark.parametrize("n", [1, 7, 64, 200])
@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_output_equals_plain(target, draft, text, n, adaptive):
    prompt = target.tokenize(text)
    plain = tokens_of(Generation(target, None, max_tokens=n), prompt)
    assert len(plain) == n
    for name, make in drafters(draft).items():
        st = Stats()
        g = Generation(target, make(), max_tokens=n, controller=Controller(k_max=5, adaptive=adaptive))
        assert tokens_of(g, prompt, st) == plain, name
        if not adaptive and n >= 64:
            assert st.n_drafted > 0 and st.n_accepted > 0, name


def test_target_as_its_own_draft_accepts_everything(tiny, target):
    with Model(tiny["target"], n_ctx=1024) as same:
        st = Stats()
        g = Generation(target, DraftModel(same), max_tokens=100, controller=Controller(k_max=4, adaptive=False))
        tokens_of(g, target.tokenize("The lazy dog"), st)
        assert st.n_drafted == 80 and st.n_accepted == st.n_drafted  # 20 steps of 4 drafts + 1 bonus token
        assert st.mean_accepted_length == 5.0


def test_rollback_after_many_steps_matches_fresh_prefill(tiny):
    # flash attention off: llama.cpp's CPU logits then differ between batchings only by float32 summation order
    # (~1e-4), far below what one stale cache entry left by a bad rollback does (~1e-1)
    opts = dict(n_ctx=1024, flash_attn=False)
    with Model(tiny["target"], **opts) as target, Model(tiny["draft"], **opts) as draft:
        prompt = target.tokenize("When the draft is right, the target accepts several tokens")
        st = Stats()
        g = Generation(target, Hybrid(PromptLookup(), DraftModel(draft)), max_tokens=150,
                       controller=Controller(k_max=6, adaptive=False))
        out = tokens_of(g, prompt, st)
        assert st.n_accepted < st.n_drafted  # there were rejections to roll back
        x = prompt + out
        assert target.tokens == x[:-1]
        target.eval([x[-1]])
        draft.eval([x[-1]]) if draft.tokens == x[:-1] else draft.sync(x)
        for model, path in ((target, tiny["target"]), (draft, tiny["draft"])):
            with Model(path, **opts) as fresh:
                fresh.eval(model.tokens)
                np.testing.assert_allclose(model.logits(-1), fresh.logits(-1), rtol=0, atol=1e-3)


def test_rollback_happens_even_when_a_step_raises(target, draft):
    class Exploding(DraftModel):
        calls = 0

        def propose(self, *a, **kw):
            self.calls += 1
            if self.calls == 5:
                raise RuntimeError("boom")
            return super().propose(*a, **kw)

    prompt = target.tokenize("The quick brown fox")
    g = Generation(target, Exploding(draft), max_tokens=50, controller=Controller(k_max=4, adaptive=False))
    seen = []
    with pytest.raises(RuntimeError):
        for step in speculative_generate(g, prompt):
            seen += step.tokens
    assert target.tokens == (prompt + seen)[:-1]


def test_failing_draft_model_falls_back_to_lookup(target, draft):
    from spectool.engine import DecodeError

    class Failing(DraftModel):
        def propose(self, *a, **kw):
            raise DecodeError("no memory for the draft context")

    prompt = target.tokenize("The quick brown fox")
    plain = tokens_of(Generation(target, None, max_tokens=40), prompt)
    steps = list(speculative_generate(Generation(target, Failing(draft), max_tokens=40,
                                                 controller=Controller(adaptive=False)), prompt))
    assert [t for s in steps for t in s.tokens] == plain
    assert "prompt lookup" in steps[0].notice


# -- distribution exactness at temperature > 0 ------------------------------------------------------------------
N_RUNS = 3000
SAMPLING = Sampling(temp=1.0)


def exact_joint(model, prompt, s):
    """P(first two generated tokens) under the target alone, for pairs with noticeable mass."""
    model.reset()
    model.eval(prompt)
    p0 = probs(model.logits(-1), s)
    joint = {}
    for t1 in np.flatnonzero(p0 > 1e-4):
        model.sync(prompt + [int(t1)])
        p1 = probs(model.logits(-1), s)
        for t2 in np.flatnonzero(p1 > 1e-4):
            joint[int(t1), int(t2)] = p0[t1] * p1[t2]
    model.reset()
    return joint


def chi2_rejects(counts, joint, n, alpha_z=3.09):
    """Pearson chi-square of observed pair counts against `joint`; True if it rejects at about 0.1%."""
    cells = {c: p for c, p in joint.items() if p * n >= 5}
    other_p = 1.0 - sum(cells.values())
    stat, other_obs = 0.0, n
    for c, p in cells.items():
        o = counts.get(c, 0)
        other_obs -= o
        stat += (o - n * p) ** 2 / (n * p)
    if other_p * n >= 5:
        stat += (other_obs - n * other_p) ** 2 / (n * other_p)
    df = len(cells) - (0 if other_p * n >= 5 else 1)
    crit = df * (1 - 2 / (9 * df) + alpha_z * math.sqrt(2 / (9 * df))) ** 3  # Wilson-Hilferty, z = 3.09
    return stat > crit, stat, crit


def sample_pairs(target, make_drafter, prompt, n=N_RUNS):
    counts = {}
    for seed in range(n):
        g = Generation(target, make_drafter(), SAMPLING, Controller(k_max=3, adaptive=False), max_tokens=2,
                       seed=seed)
        pair = tuple(tokens_of(g, prompt))
        counts[pair] = counts.get(pair, 0) + 1
    return counts


@pytest.fixture(scope="module")
def lookup_prompt(target):
    # a prompt whose n-grams recur, so lookup drafts at the first positions
    return target.tokenize("the dog the fox the dog the fox the dog the fox the dog the")


@pytest.mark.parametrize("kind", ["draft", "lookup"])
def test_sampled_tokens_follow_the_target_distribution(target, draft, lookup_prompt, kind):
    prompt = lookup_prompt if kind == "lookup" else target.tokenize("The quick brown fox")
    joint = exact_joint(target, prompt, SAMPLING)
    make = (lambda: DraftModel(draft)) if kind == "draft" else PromptLookup
    rejects, stat, crit = chi2_rejects(sample_pairs(target, make, prompt), joint, N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"


def test_negative_control_accept_always_fails(target, draft, monkeypatch):
    """The same test must catch a wrong acceptance rule: accept every draft token."""
    import spectool.speculative as spec

    def accept_always(p, q, d, rng):
        return len(d), sample(p[len(d)], rng)

    monkeypatch.setattr(spec, "accept_sampled", accept_always)
    prompt = target.tokenize("The quick brown fox")
    joint = exact_joint(target, prompt, SAMPLING)
    rejects, stat, crit = chi2_rejects(sample_pairs(target, lambda: DraftModel(draft), prompt), joint, N_RUNS)
    assert rejects, f"chi2 {stat:.1f} <= {crit:.1f}: the test cannot tell a wrong rule"


@pytest.mark.parametrize("controller", [dict(adaptive=False, k_max=4), dict(timed=False)])
def test_seeded_runs_reproduce(target, draft, controller):
    prompt = target.tokenize("The quick brown fox")
    s = Sampling(0.8, 40, 0.95, 0.05)
    runs = [
        tokens_of(Generation(target, Hybrid(PromptLookup(), DraftModel(draft)), s, Controller(**controller),
                             max_tokens=60, seed=5), prompt)
        for _ in range(3)
    ]
    assert runs[0] == runs[1] == runs[2]
    other = tokens_of(Generation(target, DraftModel(draft), s, Controller(**controller), max_tokens=60, seed=6),
                      prompt)
    assert other != runs[0]


# -- stopping ---------------------------------------------------------------------------------------------------
def test_stop_string_inside_an_accepted_run(target):
    prompt = target.tokenize("The quick brown fox")
    plain = Generation(target, None, max_tokens=80)
    full = "".join(text for text, _ in generate_text(plain, prompt))
    stop = full[30:34]
    assert stop and full.index(stop) >= 1
    st = Stats()
    g = Generation(target, PromptLookup(), max_tokens=80, controller=Controller(k_max=8, adaptive=False))
    text = "".join(t for t, _ in generate_text(g, prompt, stop=[stop], stats=st))
    assert text == full[: full.index(stop)]
    assert st.finish_reason == "stop"


def test_end_of_generation_token_stops(target, monkeypatch):
    prompt = target.tokenize("The quick brown fox")
    plain = tokens_of(Generation(target, None, max_tokens=30), prompt)
    eog = plain[10]
    monkeypatch.setattr(Model, "is_eog", lambda self, t: t == eog)
    st = Stats()
    g = Generation(target, PromptLookup(), max_tokens=30)
    out = tokens_of(g, prompt, st)
    assert out == plain[: plain.index(eog)] and st.finish_reason == "stop"


def test_context_full(tiny):
    with Model(tiny["target"], n_ctx=64) as m:
        prompt = m.tokenize("The quick brown fox jumps over the lazy dog.")
        st = Stats()
        g = Generation(m, PromptLookup(), max_tokens=500, controller=Controller(k_max=8, adaptive=False))
        out = tokens_of(g, prompt, st)
        assert st.finish_reason == "context"
        assert len(prompt) + len(out) == m.n_ctx + 1  # the last token needs no cache slot
        with Model(tiny["target"], n_ctx=64) as ref:
            plain = tokens_of(Generation(ref, None, max_tokens=500), prompt)
        assert out == plain


def test_stats_json_schema(target, draft):
    st = Stats(mode="hybrid", target="t", draft="d")
    g = Generation(target, Hybrid(PromptLookup(), DraftModel(draft)), max_tokens=60,
                   controller=Controller(k_max=4, adaptive=False))
    tokens_of(g, target.tokenize("def add(a, b):"), st)
    j = st.to_json()
    assert list(j) == [
        "mode", "target", "draft", "n_prompt_tokens", "n_generated", "n_steps", "n_drafted", "n_accepted",
        "acceptance_rate", "mean_accepted_length", "accepted_per_position", "prompt_seconds", "decode_seconds",
        "tokens_per_second", "finish_reason",
    ]
    assert j["n_generated"] == 60 and j["finish_reason"] == "length"
    assert sum(j["accepted_per_position"]) == j["n_accepted"]
    assert j["accepted_per_position"] == sorted(j["accepted_per_position"], reverse=True)
    assert j["mean_accepted_length"] == pytest.approx(60 / j["n_steps"], abs=1e-5)


def test_a_draft_models_catch_up_is_not_charged_to_its_draft_length(target, draft):
    """After steps without drafts the draft model must decode the tokens it missed. That is not a cost of each
    drafted token: counted as one, a probe after an idle stretch looked dear and kept the draft idle."""
    rng = np.random.default_rng(0)
    dm = DraftModel(draft)
    history = target.tokenize("The quick brown fox jumps over the lazy dog")
    dm.prefill(history)
    first = dm.propose(history, 3, Sampling(), rng)
    assert first.tokens and first.catch_up_seconds == 0.0  # in step: nothing to catch up
    history += first.tokens + target.tokenize(" and then it ran far away into the woods")
    later = dm.propose(history, 3, Sampling(), rng)
    assert later.catch_up_seconds > 0.0
    assert draft.tokens == history + later.tokens[:-1]  # and it did catch up
