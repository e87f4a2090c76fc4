"""DFlash heads (`--spec dflash -md HEAD.gguf`): a generated tiny dflash head for the tiny target, in the real
llama.cpp, against llama.cpp's own draft-dflash."""

import pytest

from spectool_lab.helpers import spectool


@pytest.fixture(scope="session")
def head_path(tmp_path_factory):
    """A tiny DFlash head for the tiny target (tinymodels.write_dflash_head: it drafts the text's two-token loop)."""
    from spectool_lab.tinymodels import write_dflash_head

    return write_dflash_head(tmp_path_factory.mktemp("dflash"))


@pytest.fixture(scope="module")
def dflash_target(tiny, head_path):
    from spectool.drafters.dflash import DflashContext
    from spectool.llama.engine import Model

    with Model(tiny["target"], n_ctx=1024, n_threads=2) as m:
        head = DflashContext(m, head_path)
        try:
            yield m, head
        finally:
            head.close()


PROMPTS = ["the dog the fox the dog the fox the dog the", "def add(a, b):\n    return a + b\n\ndef greet(name):",
           "The quick brown fox"]
LOOP = "the dog the fox the dog the fox the dog the fox the dog the"  # 24 tokens on, the target's greedy text loops


def in_the_loop(target):
    """LOOP and 24 greedy tokens after it: the target's greedy text repeats two tokens there, which the head drafts."""
    from spectool_lab.helpers import tokens_of

    from spectool.generate.loop import GenerationConfig

    prompt = target.tokenize(LOOP)
    return prompt + tokens_of(GenerationConfig(target, None, max_tokens=24), prompt)


def test_head_facts_and_refusals(tiny, head_path, tmp_path):
    """A head's facts come from its metadata; a head that reads a layer the target lacks, a file that is not a DFlash
    head, a head without a mask token and a DSpark head (a Markov head: llama.cpp's draft-dspark) are refused with a
    reason."""
    from spectool_lab.tinymodels import write_dflash_head

    from spectool.drafters.dflash import DflashContext, head_facts, is_head
    from spectool.llama.engine import Model, ModelLoadError

    facts = head_facts(head_path)
    assert facts is not None and facts.layers == (0, 1, 2) and facts.block_size == 6 and not facts.causal
    assert is_head(head_path) and not is_head(tiny["target"]) and head_facts(tiny["draft"]) is None
    with Model(tiny["target"], n_ctx=256, n_threads=2) as m:
        with pytest.raises(ModelLoadError, match="reads layer 3; the target has 3"):
            DflashContext(m, write_dflash_head(tmp_path, layers=(0, 3)))
        with pytest.raises(ModelLoadError, match="not a DFlash head"):
            DflashContext(m, tiny["draft"])
        with pytest.raises(ModelLoadError, match="names no mask token"):
            DflashContext(m, write_dflash_head(tmp_path, mask=None, name="nomask.gguf"))
        with pytest.raises(ModelLoadError, match="a DSpark head"):
            DflashContext(m, write_dflash_head(tmp_path, name="dspark.gguf", markov=True))


def test_the_head_drafts_the_loop_in_one_block(dflash_target):
    """One decode of [t[n], mask * 5] drafts t[n-1], t[n], t[n-1], ... (the tiny head's design), n_max clamps to the
    block and a step takes the first k; p_min stops the draft before a token below it."""
    import numpy as np

    from spectool.core.verify import Sampling
    from spectool.drafters.dflash import Dflash

    target, head = dflash_target
    prompt = in_the_loop(target)
    target.reset()
    target.eval(prompt[:-1], logits="none")
    a, b = prompt[-1], prompt[-2]
    rng = np.random.default_rng(0)
    d = Dflash(head, n_max=99)
    assert d.n_max == 5
    assert list(d.propose(prompt, 5, Sampling(), rng).tokens) == [b, a, b, a, b]
    assert list(Dflash(head, n_max=3).propose(prompt, 2, Sampling(), rng).tokens) == [b, a]
    assert head.draft(a, len(prompt) - 1, 3, p_min=1.01) == []  # no token is above probability 1
    target.reset()


@pytest.mark.parametrize("text", PROMPTS)
@pytest.mark.parametrize("n", [2, 40])
def test_greedy_output_under_dflash_equals_plain_decoding(dflash_target, text, n):
    from spectool_lab.helpers import tokens_of

    from spectool.core.controller import Controller
    from spectool.core.stats import Stats
    from spectool.drafters.dflash import Dflash
    from spectool.generate.loop import GenerationConfig

    target, head = dflash_target
    prompt = target.tokenize(text)
    plain = tokens_of(GenerationConfig(target, None, max_tokens=n), prompt)
    for n_max in (3, 5):
        for controller in (Controller(k_max=3, k_min=3, adaptive=False), Controller(k_max=8)):
            st = Stats()
            assert tokens_of(GenerationConfig(target, Dflash(head, n_max=n_max), controller=controller,
                                              max_tokens=n), prompt, st) == plain
            assert n < 9 or st.n_drafted > 0


def test_sampled_tokens_under_dflash_follow_the_target_distribution(dflash_target):
    """Chi-square over 3,000 seeded runs of the joint distribution of the first three tokens, drafts of three tokens
    from the DFlash head in the target's loop (deterministic drafts: the head's top tokens at any temperature), every
    draft position accepted some of the time."""
    from exactness import K_DRAFT, N_RUNS, SAMPLING, chi2_rejects, exact_joint, sample_joint

    from spectool.core.stats import Stats
    from spectool.drafters.dflash import Dflash

    target, head = dflash_target
    prompt = in_the_loop(target)
    exact = exact_joint(target, prompt, SAMPLING)
    st = Stats()
    counts = sample_joint(target, lambda: Dflash(head, n_max=K_DRAFT), prompt, SAMPLING, stats=st)
    assert len(st.accepted_per_position) == K_DRAFT and min(st.accepted_per_position) > 0, st.accepted_per_position
    assert st.n_accepted < st.n_drafted
    rejects, stat, crit = chi2_rejects(counts, exact, N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"


def test_a_wrong_rule_under_dflash_is_caught(dflash_target, monkeypatch):
    """The check above can fail: with the target's row after each draft read one position late, it rejects."""
    import spectool.generate.loop as spec
    from exactness import K_DRAFT, N_RUNS, SAMPLING, chi2_rejects, exact_joint, sample_joint, wrong_acceptance

    from spectool.drafters.dflash import Dflash

    target, head = dflash_target
    prompt = in_the_loop(target)
    monkeypatch.setattr(spec, "accept_sampled", wrong_acceptance("p row off by one"))
    counts = sample_joint(target, lambda: Dflash(head, n_max=K_DRAFT), prompt)
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, prompt, SAMPLING), N_RUNS)
    assert rejects, f"chi2 {stat:.1f} <= {crit:.1f}"


@pytest.fixture(scope="session")
def speculative_simple():
    """llama.cpp's llama-speculative-simple, built once from the vendored llama.cpp sources (see test_mtp.py)."""
    from spectool_lab import llamacpp

    return llamacpp.build(quiet=True, targets=("llama-speculative-simple",))["llama-speculative-simple"]


@pytest.mark.parametrize("text", [LOOP, PROMPTS[0]])
def test_the_head_drafts_and_accepts_what_llama_cpps_draft_dflash_does(tiny, head_path, speculative_simple, text):
    """The oracle: llama.cpp's own DFlash drafting (`llama-speculative-simple -md HEAD --spec-type draft-dflash
    --spec-draft-n-max 3`, greedy: one block of the last token and 3 masks a step) and spectool's (`Dflash` with
    n_max 3, drafts fixed at 3) on the same target, head and prompt propose the same tokens and accept as many, step
    by step, and both outputs are plain decoding's. Steps are compared while both draft 3 tokens."""
    from spectool_lab import llamacpp
    from spectool_lab.helpers import same_drafts_as_llama_cpp

    from spectool.drafters.dflash import Dflash, DflashContext
    from spectool.llama.engine import Model

    theirs = llamacpp.draft_dflash(speculative_simple, tiny["target"], head_path, text, 40, n_draft=3)
    with Model(tiny["target"], n_ctx=512, n_threads=2) as m:
        head = DflashContext(m, head_path)
        try:
            same_drafts_as_llama_cpp(m, Dflash(head, n_max=3), m.tokenize(text), theirs, min_steps=10)
        finally:
            head.close()


def test_the_session_factory_makes_the_dflash_drafter(dflash_target):
    """drafter_for: --spec dflash (and auto with only the head) drafts with the head, its block's masks --draft-max
    clamped to the head's block; --spec dflash without a head is a PolicyError; hybrid does not pair lookup with it."""
    from spectool.drafters.builder import PolicyError, drafter_for
    from spectool.drafters.dflash import Dflash
    from spectool.options import Mode

    _, head = dflash_target
    for spec in (Mode.dflash, Mode.auto):
        d, mode = drafter_for(spec, None, dflash=head, k_max=3)
        assert mode is Mode.dflash and isinstance(d, Dflash) and d.n_max == 3
    assert drafter_for(Mode.dflash, None, dflash=head, k_max=32)[0].n_max == 5
    with pytest.raises(PolicyError, match="needs -md HEAD.gguf, a DFlash head"):
        drafter_for(Mode.dflash, None)
    assert drafter_for(Mode.hybrid, None, dflash=head, notices=[])[1] is Mode.lookup


def test_check_names_the_head_and_what_it_needs(tiny, head_path, tmp_path):
    """`spectool check TARGET HEAD` says the file is a DFlash head, which target layers it reads and its block size,
    and whether it can draft for the target; a head that reads a layer the target lacks cannot."""
    from spectool_lab.tinymodels import write_dflash_head

    r = spectool("check", tiny["target"], head_path)
    assert r.returncode == 0, r.stderr
    assert "a DFlash head" in r.stdout and "layers 0, 1, 2 (width 64)" in r.stdout and "block size 6" in r.stdout
    assert "compatible: the head drafts for the target with --spec dflash" in r.stdout
    r = spectool("check", tiny["target"], write_dflash_head(tmp_path, layers=(0, 3)))
    assert r.returncode == 0 and "cannot draft for the target: the head reads layer 3; the target has 3" in r.stdout


def test_spec_dflash_through_the_command_line(tiny, head_path, tmp_path):
    """--spec dflash drafts from the head -md names and says so (--stats-json, the summary); auto picks the head
    when -md is one; --spec dflash without a head, --spec eagle3 or draft with it, bench with it and --parallel
    above 1 are clear one-line errors."""
    import json

    stats = tmp_path / "s.json"
    # -ngl 0 on a GPU host too: there batched and single-token kernels may flip near-ties (docs/exactness.md)
    base = ["run", "-m", tiny["target"], "-n", "40", "-t", "2", "-c", "512", "-ngl", "0", "--stats-json", stats,
            LOOP]
    plain = spectool(*base, "--spec", "none", "-q")
    assert plain.returncode == 0, plain.stderr
    for spec in ("dflash", "auto"):
        r = spectool(*base, "-md", head_path, "--spec", spec)
        j = json.loads(stats.read_text())
        assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
        assert j["mode"] == "dflash" and j["n_drafted"] > 0 and j["n_accepted"] > 0 and "[dflash]" in r.stderr
    r = spectool("run", "-m", tiny["target"], "--spec", "dflash", "-n", "4", "hi")
    assert r.returncode == 2 and "a DFlash head" in r.stderr and "Traceback" not in r.stderr
    for spec, says in (("draft", "-md is a DFlash head, not a draft model"),
                       ("eagle3", "-md is a DFlash head: --spec dflash drafts with it, not --spec eagle3")):
        r = spectool("run", "-m", tiny["target"], "-md", head_path, "--spec", spec, "-n", "4", "hi")
        assert r.returncode == 2 and says in r.stderr, r.stderr
    r = spectool("bench", "-m", tiny["target"], "-md", head_path, "--greedy-only")
    assert r.returncode == 2 and "a DFlash head; bench does not measure heads yet" in r.stderr
    r = spectool("serve", "-m", tiny["target"], "-md", head_path, "--spec", "dflash", "--parallel", "2",
                 timeout=120)
    assert r.returncode == 2 and "--parallel above 1 drafts by prompt lookup only" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_serve_drafts_with_the_head(tiny, head_path):
    """`spectool serve -md HEAD --spec dflash` answers a greedy completion with plain decoding's text, its usage
    saying the head drafted."""
    from spectool_lab.helpers import serve_drafts_with_head

    serve_drafts_with_head(tiny["target"], head_path, "dflash", LOOP)


def test_p_min_cuts_the_block_where_llama_cpps_draft_dflash_does(tiny, speculative_simple, tmp_path):
    """With --draft-p-min (llama.cpp's --spec-draft-p-min) a draft ends before the first block position whose top
    token's probability among its ten best is below it: over a less sure head, every step's draft (some cut short)
    and acceptance equal llama-speculative-simple's."""
    from spectool_lab import llamacpp
    from spectool_lab.helpers import tokens_of
    from spectool_lab.tinymodels import write_dflash_head

    from spectool.core.controller import Controller
    from spectool.drafters.dflash import Dflash, DflashContext
    from spectool.generate.loop import GenerationConfig, speculative_generate
    from spectool.llama.engine import Model

    unsure = write_dflash_head(tmp_path, sure=0.6, name="unsure.gguf")
    theirs = llamacpp.draft_dflash(speculative_simple, tiny["target"], unsure, LOOP, 40, n_draft=3, p_min=0.6)
    with Model(tiny["target"], n_ctx=512, n_threads=2) as m:
        head = DflashContext(m, unsure)
        try:
            drafter, proposed, propose = Dflash(head, p_min=0.6, n_max=3), [], Dflash.propose
            drafter.propose = lambda *a: proposed.append(propose(drafter, *a)) or proposed[-1]
            g = GenerationConfig(m, drafter, max_tokens=40, controller=Controller(k_max=3, k_min=3, adaptive=False))
            steps = list(speculative_generate(g, m.tokenize(LOOP)))
            plain = tokens_of(GenerationConfig(m, None, max_tokens=40), m.tokenize(LOOP))
        finally:
            head.close()
    ours = [list(d.tokens) for d in proposed]
    n = min(len(theirs), len(ours)) - 3  # near the end each tool cuts its drafts to its own budget
    assert n >= 10 and [t.draft for t in theirs[:n]] == ours[:n]
    assert {len(d) for d in ours[:n]} >= {1, 3}  # p_min cut some drafts, not others
    assert [t for s in steps for t in s.tokens] == plain
    theirs_out = [t for s in theirs for t in s.draft[: s.accepted] + [s.last]]
    k = min(len(theirs_out), len(plain))  # its last step may run past the budget by its drafts
    assert k >= 30 and theirs_out[:k] == plain[:k]
    accepted = [s.accepted for s in steps if s.drafted]
    theirs_accepted = [t.accepted for t in theirs if t.draft]
    m = min(len(accepted), len(theirs_accepted)) - 3
    assert m >= 10 and accepted[:m] == theirs_accepted[:m]
