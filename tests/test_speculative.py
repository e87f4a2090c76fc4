"""The speculative loop on the generated tiny models: greedy exactness, distribution exactness, rollback, costs
and statistics (stopping: test_stopping.py)."""

import numpy as np
from spectool_lab import helpers
import pytest
from exactness import K_DRAFT, N_RUNS, SAMPLING, chi2_rejects, exact_joint, sample_joint, wrong_acceptance
from spectool_lab.helpers import AlwaysWrong, SplitHybrid, tokens_of
from hypothesis import given, settings
from hypothesis import strategies as hst

from spectool.core.controller import Controller
from spectool.core.protocol import Drafter
from spectool.drafters.draft_model import DraftModel
from spectool.drafters.hybrid import Hybrid
from spectool.drafters.lookup import PromptLookup
from spectool.llama.engine import Model
from spectool.core.evidence import DRAFT, Agreement
from spectool.options import Mode
from spectool.core.evidence import Source
from spectool.drafters.builder import drafter_for
from spectool.drafters.builder import for_generation
from spectool.generate.loop import GenerationConfig, Step, speculative_generate
from spectool.core.stats import Stats
from spectool.core.verify import Sampling

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef greet(name):",
    "Speculative decoding lets a small draft model propose tokens that a large target",
]


def drafters(draft):
    """spectool's drafters (helpers.drafters), and two variants that only the tests make: a hybrid that hands over
    after every stretch's first token, and a draft model that stops below probability 0.6."""
    return {**helpers.drafters(draft), "hybrid-split": lambda: SplitHybrid(PromptLookup(), DraftModel(draft)),
            "draft-pmin": lambda: drafter_for(Mode.draft, draft, p_min=0.6)[0]}


def greedy_runs(target, draft, prompt, n, adaptive):
    """Plain decoding's first `n` tokens after `prompt`, and each drafter's (those of `drafters` and one that is
    always wrong): {name: (tokens, Stats)}."""
    plain = tokens_of(GenerationConfig(target, None, max_tokens=n), prompt)
    makers = {**drafters(draft), "always-wrong": lambda: AlwaysWrong(min(set(range(target.n_vocab)) - set(plain)))}
    runs = {}
    for name, make in makers.items():
        st = Stats()
        # untimed: the controller's choices depend on the tokens alone, so whether it drafts does not hang on
        # how busy the machine is (timing changes only k, never the output)
        g = GenerationConfig(target, make(), max_tokens=n, controller=Controller(k_max=5, adaptive=adaptive, timed=False))
        runs[name] = tokens_of(g, prompt, st), st
    return plain, runs


@pytest.mark.parametrize("text", PROMPTS)
@pytest.mark.parametrize("n", [2, 7, 64, 200])
@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_output_equals_plain(target, draft, text, n, adaptive):
    """Every drafter's greedy output is plain decoding's, token for token, from the shortest budget that leaves
    room for a draft (n = 2: one drafted token, then the target's) on. In every case drafts were both accepted
    (the draft model's) and rejected (the always-wrong drafter's); from 64 tokens on every drafter drafted."""
    plain, runs = greedy_runs(target, draft, target.tokenize(text), n, adaptive)
    assert len(plain) == n
    for name, (out, st) in runs.items():
        assert out == plain, name
        if n >= 64 and name != "always-wrong":  # the adaptive controller drafts too
            assert st.n_drafted > 0 and st.n_accepted > 0, name
    wrong = runs["always-wrong"][1]
    assert runs["draft"][1].n_accepted > 0 and wrong.n_drafted > 0 and wrong.n_accepted == 0
    if n >= 64 and not adaptive:  # lookup's tokens, then the draft model's
        assert "hybrid" in runs["hybrid-split"][1].by_source


@pytest.mark.parametrize("n", [2, 7, 64, 200])
def test_the_greedy_comparison_catches_a_wrong_acceptance(target, draft, monkeypatch, n):
    """The test above must fail, at every budget, when the greedy acceptance takes every draft."""
    import spectool.generate.loop as spec

    monkeypatch.setattr(spec, "accept_greedy", lambda rows, d: (len(d), list(rows)[len(d)]))
    plain, runs = greedy_runs(target, draft, target.tokenize(PROMPTS[0]), n, adaptive=True)
    assert any(out != plain for out, _ in runs.values())


def test_target_as_its_own_draft_accepts_everything(tiny, target):
    """A draft model that is the target itself is right at every position: each step drafts k = 4 tokens, the
    target accepts all of them and adds its own, so every step yields k + 1 tokens."""
    k = 4
    with Model(tiny["target"], n_ctx=1024) as same:
        st = Stats()
        g = GenerationConfig(target, DraftModel(same), max_tokens=100, controller=Controller(k_max=k, adaptive=False))
        out = tokens_of(g, target.tokenize("The lazy dog"), st)
        assert len(out) == 100 and st.n_accepted == st.n_drafted
        assert st.accepted_per_position == [st.n_steps] * k  # every step, every position
        assert st.mean_accepted_length == k + 1


def test_rollback_after_many_steps_matches_fresh_prefill(tiny):
    # flash attention off: llama.cpp's CPU logits then differ between batchings only by float32 summation order
    # (~1e-4), far below what one stale cache entry left by a bad rollback does (~1e-1)
    opts = dict(n_ctx=1024, flash_attn=False)
    with Model(tiny["target"], **opts) as target, Model(tiny["draft"], **opts) as draft:
        prompt = target.tokenize("When the draft is right, the target accepts several tokens")
        st = Stats()
        g = GenerationConfig(target, Hybrid(PromptLookup(), DraftModel(draft)), max_tokens=150,
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
    g = GenerationConfig(target, Exploding(draft), max_tokens=50, controller=Controller(k_max=4, adaptive=False))
    seen = []
    with pytest.raises(RuntimeError):
        for step in speculative_generate(g, prompt):
            seen += step.tokens
    assert target.tokens == (prompt + seen)[:-1]


def test_failing_draft_model_falls_back_to_lookup(target, draft):
    from spectool.llama.engine import DecodeError

    class Failing(DraftModel):
        def propose(self, *a, **kw):
            raise DecodeError("no memory for the draft context")

    class FailingAtOnce(DraftModel):
        def start(self, history, constraint=None):
            raise DecodeError("no memory for the draft context")

    prompt = target.tokenize("The quick brown fox")
    plain = tokens_of(GenerationConfig(target, None, max_tokens=40), prompt)
    for failing in (Failing, FailingAtOnce):  # the session's drafter is built whole: the fallback is the builder's
        drafter = for_generation(failing(draft), grammar=False)
        steps = list(speculative_generate(GenerationConfig(target, drafter, max_tokens=40,
                                                           controller=Controller(adaptive=False)), prompt))
        assert [t for s in steps for t in s.tokens] == plain
        assert "prompt lookup" in steps[0].notice and not any(s.notice for s in steps[1:])
    with pytest.raises(DecodeError):  # a bare draft model is not: the loop decides nothing of it
        list(speculative_generate(GenerationConfig(target, Failing(draft), max_tokens=40,
                                                   controller=Controller(adaptive=False)), prompt))


# -- distribution exactness at temperature > 0 (exactness.py) -------------------------------------------------
PENALISED = Sampling(temp=1.0, repeat_penalty=1.15, repeat_last_n=8, presence_penalty=0.1, frequency_penalty=0.05)


@pytest.mark.parametrize("kind", ["draft", "lookup", "hybrid", "hybrid-split"])
@pytest.mark.parametrize("s", [SAMPLING, PENALISED], ids=["plain", "penalties"])
def test_sampled_tokens_follow_the_target_distribution(target, draft, lookup_prompt, kind, s):
    prompt = lookup_prompt if kind != "draft" else target.tokenize("The quick brown fox")
    st = Stats()
    counts = sample_joint(target, drafters(draft)[kind], prompt, s, stats=st)
    assert kind != "hybrid-split" or "hybrid" in st.by_source  # first lookup's token, then the draft model's
    # every draft position was reached and both verdicts happened at it
    assert len(st.accepted_per_position) == K_DRAFT and min(st.accepted_per_position) > 0, st.accepted_per_position
    assert st.n_accepted < st.n_drafted
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, prompt, s), N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"


@pytest.mark.parametrize("bug,kind", [("accept always", "draft"), ("q[0] at every position", "draft"),
                                      ("p row off by one", "lookup"), ("resample from p", "draft"),
                                      ("draw again after a refusal", "lookup")])
def test_negative_controls_fail(target, draft, lookup_prompt, monkeypatch, bug, kind):
    """The same test must reject a wrong acceptance rule, at any draft position."""
    import spectool.generate.loop as spec
    import spectool.core.verify as V

    if bug == "resample from p":
        monkeypatch.setattr(V, "residual", lambda p, q: p)
    else:
        monkeypatch.setattr(spec, "accept_sampled", wrong_acceptance(bug))
    prompt = lookup_prompt if kind == "lookup" else target.tokenize("The quick brown fox")
    counts = sample_joint(target, drafters(draft)[kind], prompt)
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, prompt, SAMPLING), N_RUNS)
    assert rejects, f"chi2 {stat:.1f} <= {crit:.1f}: the test cannot tell a wrong rule"


@pytest.mark.parametrize("controller", [dict(adaptive=False, k_max=4), dict(timed=False)])
def test_seeded_runs_reproduce(target, draft, controller):
    prompt = target.tokenize("The quick brown fox")
    s = Sampling(0.8, 40, 0.95, 0.05)
    runs = [
        tokens_of(GenerationConfig(target, Hybrid(PromptLookup(), DraftModel(draft)), s, Controller(**controller),
                             max_tokens=60, seed=5), prompt)
        for _ in range(3)
    ]
    assert runs[0] == runs[1] == runs[2]
    other = tokens_of(GenerationConfig(target, DraftModel(draft), s, Controller(**controller), max_tokens=60, seed=6),
                      prompt)
    assert other != runs[0]


@pytest.mark.parametrize("kind", ["plain", "lookup", "hybrid"])
def test_llama_cpps_chain_on_the_host_draws_what_verify_draws(target, draft, lookup_prompt, monkeypatch, kind):
    """Sampled, the loop draws the target's own tokens with llama.cpp's chain on the host (generate/sampler.py) where
    the rows are whole: the seed's one stream of numbers shared with verify.py's own draws (a draft model's
    proposals, acceptance tests and residuals, in the hybrid), so the text is verify.py's chain's alone, token for
    token (the controller untimed, as seeded runs are: its lengths then depend on the tokens alone)."""
    import spectool.generate.loop as spec
    from spectool.generate.sampler import HostChain

    make = {"plain": lambda: None, "lookup": PromptLookup, "hybrid": lambda: Hybrid(PromptLookup(), DraftModel(draft))}
    prompt = lookup_prompt if kind == "lookup" else target.tokenize("The quick brown fox")
    s, host = Sampling(0.8, 40, 0.95, 0.05), [0]
    chain_draw = HostChain.draw

    def counted(self, rows, i):
        host[0] += 1
        return chain_draw(self, rows, i)

    monkeypatch.setattr(HostChain, "draw", counted)
    texts = []
    for seed in (5, 6, 7):
        g = GenerationConfig(target, make[kind](), s, Controller(timed=False), max_tokens=60, seed=seed)
        texts.append(tokens_of(g, prompt))
        assert host[0] > 0 and g.rng.drawn > (host[0] if kind == "hybrid" else 0)  # its own draws too
        host[0] = 0
    monkeypatch.setattr(spec.Loop, "drawer", lambda self, rows: None)  # verify.py's chain alone
    for seed, text in zip((5, 6, 7), texts):
        g = GenerationConfig(target, make[kind](), s, Controller(timed=False), max_tokens=60, seed=seed)
        assert tokens_of(g, prompt) == text
    assert host[0] == 0


def test_stats_json_schema(target, draft):
    """--stats-json's record of a run: the fields scripts read, each agreeing with the run's steps (counts, rates,
    tokens per step and per second), as strict JSON."""
    import json

    st = Stats(mode="hybrid", target="t", draft="d")
    g = GenerationConfig(target, Hybrid(PromptLookup(), DraftModel(draft)), max_tokens=60,
                   controller=Controller(k_max=4, adaptive=False))
    prompt = target.tokenize("def add(a, b):")
    steps = list(speculative_generate(g, prompt, st))
    j = json.loads(json.dumps(st.to_json(), allow_nan=False))
    assert set(j) == {
        "mode", "target", "draft", "n_prompt_tokens", "n_generated", "n_steps", "n_drafted", "n_accepted",
        "acceptance_rate", "mean_accepted_length", "accepted_per_position", "drafted_by_source", "prompt_seconds",
        "decode_seconds", "accepted_prediction_tokens", "rejected_prediction_tokens", "tree",
        "tokens_per_second", "finish_reason", "offload",
    }
    assert (j["mode"], j["target"], j["draft"], j["n_prompt_tokens"]) == ("hybrid", "t", "d", len(prompt))
    assert j["n_generated"] == sum(len(s.tokens) for s in steps) == 60 and j["finish_reason"] == "length"
    assert (j["n_steps"], j["n_drafted"], j["n_accepted"]) == \
        (len(steps), sum(s.drafted for s in steps), sum(s.accepted for s in steps))
    assert 0 < j["n_accepted"] <= j["n_drafted"] == sum(j["drafted_by_source"].values())
    assert j["acceptance_rate"] == pytest.approx(j["n_accepted"] / j["n_drafted"], abs=1e-6)
    longest = max(s.accepted for s in steps)
    assert j["accepted_per_position"] == [sum(s.accepted > i for s in steps) for i in range(longest)]
    assert j["mean_accepted_length"] == pytest.approx(60 / j["n_steps"], abs=1e-5)
    assert j["prompt_seconds"] > 0 and j["decode_seconds"] > 0
    assert j["tokens_per_second"] == pytest.approx(60 / j["decode_seconds"], rel=1e-3)


def test_a_draft_models_catch_up_is_not_charged_to_its_draft_length(target, draft):
    """After steps without drafts the draft model must decode the tokens it missed. That is not a cost of each
    drafted token: counted as one, a probe after an idle stretch looked dear and kept the draft idle."""
    rng = np.random.default_rng(0)
    dm = DraftModel(draft)
    history = target.tokenize("The quick brown fox jumps over the lazy dog")
    dm.start(history)
    first = dm.propose(history, 3, Sampling(), rng)
    assert first.tokens and first.catch_up_seconds == 0.0  # in step: nothing to catch up
    history += first.tokens + target.tokenize(" and then it ran far away into the woods")
    later = dm.propose(history, 3, Sampling(), rng)
    assert later.catch_up_seconds > 0.0
    assert draft.tokens == history + later.tokens[:-1]  # and it did catch up


# -- drafts whose vocabulary is a few tokens smaller or larger than the target's -----------------------------------
@pytest.fixture(scope="module", params=["draft_fewer", "draft_more"])
def odd_draft(request, tiny):
    with Model(tiny[request.param], n_ctx=1024, n_threads=2) as m:
        yield m


def test_a_draft_with_another_vocabulary_size_keeps_greedy_output(target, odd_draft):
    assert odd_draft.n_vocab != target.n_vocab
    for text in PROMPTS:
        prompt = target.tokenize(text)
        plain = tokens_of(GenerationConfig(target, None, max_tokens=60), prompt)
        st = Stats()
        g = GenerationConfig(target, DraftModel(odd_draft, n_target=target.n_vocab), max_tokens=60,
                       controller=Controller(k_max=4, adaptive=False))
        assert tokens_of(g, prompt, st) == plain
        assert st.n_accepted > 0


def test_a_draft_never_proposes_a_token_the_target_lacks(target, odd_draft):
    """draft-more's extra tokens copy, louder, the output rows of its likeliest tokens: unchecked, it would
    propose them at most steps (an id the target has no row for)."""
    rng = np.random.default_rng(0)
    dm = DraftModel(odd_draft, n_target=target.n_vocab)
    history = target.tokenize("The quick brown fox")
    dm.start(history)
    for s in (Sampling(), Sampling(temp=1.5)):
        for _ in range(40):
            d = dm.propose(history, 4, s, rng)
            assert d.tokens and 0 <= min(d.tokens) and max(d.tokens) < target.n_vocab
            assert all(q.n == target.n_vocab and 0 <= q.ids.min() and q.ids.max() < target.n_vocab for q in d.q or [])
            history = history + d.tokens[:1]


def test_sampled_tokens_with_another_vocabulary_size_follow_the_target(target, odd_draft):
    prompt = target.tokenize("The quick brown fox")
    counts = sample_joint(target, lambda: DraftModel(odd_draft, n_target=target.n_vocab), prompt)
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, prompt, SAMPLING), N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"


def test_a_fresh_cost_table_measures_batches_before_the_first_step(target):
    """A first run does not trust priors that may not fit the machine: it measures batches of 1, 2, 4 and 8
    tokens first, leaves the cache as it was, and an already measured table is not measured again."""
    from spectool.core.costs import Costs

    prompt = target.tokenize("The quick brown fox")
    plain = tokens_of(GenerationConfig(target, None, max_tokens=30), prompt)
    costs = Costs()
    g = GenerationConfig(target, PromptLookup(), max_tokens=1, controller=Controller(k_max=8, costs=costs))
    assert tokens_of(g, prompt) == plain[:1]
    assert {1, 2, 4, 8} <= set(costs.verify) and all(c > 0 for c in costs.verify.values())
    assert target.tokens == prompt  # the calibration batches were rolled back
    assert tokens_of(GenerationConfig(target, PromptLookup(), max_tokens=30, controller=Controller(k_max=8, costs=costs)),
                     prompt) == plain

    class NeverDrafts(Drafter):
        def start(self, history, constraint=None):
            pass

        def peek(self, history, k_max, estimate=None):
            return []

    before = dict(costs.verify)
    tokens_of(GenerationConfig(target, NeverDrafts(), max_tokens=3, controller=Controller(k_max=8, costs=costs)), prompt)
    assert {b: c for b, c in costs.verify.items() if b > 1} == {b: c for b, c in before.items() if b > 1}
    seeded = Costs()
    list(speculative_generate(GenerationConfig(target, PromptLookup(), Sampling(0.8), Controller(timed=False, costs=seeded),
                                         max_tokens=5, seed=1), prompt))
    assert not seeded.verify  # seeded sampling keeps its priors, so that it reproduces


@pytest.mark.parametrize("shape,measured", [("gpu", {1, 2, 4, 8, 16, 32}), ("cpu", {1, 2, 4, 8})])
def test_calibration_measures_long_batches_where_costs_are_flat(target, monkeypatch, shape, measured):
    """On a GPU verifying 32 tokens costs about what one does: calibration finds that and measures batches up to
    the longest a step may verify (k_max + 1 = 33), so the controller drafts long there; where a batch of 8 already
    costs more than two tokens (a CPU) it stops at 8. A first generation on a fresh cost table runs on the tiny
    target, whose decodes advance a fake clock: a flat 1.0 + 0.01 per token, or a CPU-like 1.0 + 0.5 per token.
    What was measured is read from the cost table afterwards."""
    import time

    from spectool.core.costs import Costs

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    real_eval = target.eval

    def timed_eval(tokens, **kw):
        clock[0] += 1.0 + (0.01 if shape == "gpu" else 0.5) * len(tokens)
        return real_eval(tokens, **kw)

    monkeypatch.setattr(target, "eval", timed_eval)
    costs = Costs()
    prompt = target.tokenize("The quick brown fox")
    g = GenerationConfig(target, PromptLookup(), max_tokens=1, controller=Controller(k_max=32, costs=costs))
    tokens_of(g, prompt)  # one token: its step verifies a batch of 1 alone
    assert set(costs.verify) == measured
    assert target.tokens == prompt  # the calibration batches were rolled back


def test_hybrid_hands_over_to_the_draft_model_where_lookup_is_worth_less(draft):
    """Lookup's tokens are offered while each is worth at least a draft-model token (the controller's estimate,
    see Controller.worth), and the draft model drafts the rest of the same step."""
    history = [1, 2, 3, 4, 5, 9] + [1, 2, 3, 4, 6, 9, 8] + [1, 2]  # lookup: 3, 4, then "1 2 3 4" went two ways
    worth = {DRAFT: 0.5}
    h = Hybrid(PromptLookup(), DraftModel(draft))
    keys = h.peek(history, 8, lambda key: worth.get(key, 0.1 if key.agreement == Agreement.contested else 0.9))
    assert list(map(str, keys)) == ["lookup:2", "lookup:2+1"] + ["draft"] * 6
    d = h.propose(history, 5, Sampling(), np.random.default_rng(0))
    assert d.tokens[:2] == [3, 4] and len(d.tokens) == 5 and d.source == "hybrid" and d.q is None
    plain_draft = DraftModel(draft).propose(history + [3, 4], 3, Sampling(), np.random.default_rng(0))
    assert d.tokens[2:] == plain_draft.tokens  # the draft model continued from lookup's tokens
    assert list(map(str, h.peek(history, 8, lambda key: worth.get(key, 0.9))[:3])) == ["lookup:2", "lookup:2+1",
                                                                                       "lookup:4?"]


@settings(max_examples=100, deadline=None)
@given(hst.lists(hst.integers(0, 9).flatmap(lambda d: hst.tuples(hst.just(d), hst.integers(0, d))), max_size=30))
def test_per_position_counts_are_those_of_the_steps(steps):
    """Stats keeps steps by draft length and by accepted length; per position i it reports how many steps drafted
    (accepted) a token there, counted here step by step."""
    s = Stats()
    for drafted, accepted in steps:
        s.add_step(Step(tokens=[0] * (accepted + 1), drafted=drafted, accepted=accepted, source=Source.lookup))
    for per_position, count in ((s.drafted_per_position, 0), (s.accepted_per_position, 1)):
        longest = max((step[count] for step in steps), default=0)
        assert per_position == [sum(step[count] > i for step in steps) for i in range(longest)]
