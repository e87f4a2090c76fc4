"""Models with MTP (NextN) heads: a generated tiny glm4moe model with one NextN block, in the real llama.cpp."""

from spectool_lab.helpers import spectool


def test_check_reports_a_models_mtp_heads(mtp_path, tiny):
    """`spectool check MODEL` says what a file is, MTP heads included (llama_model_n_layer_nextn); with a draft it
    still says whether the draft can draft for the target."""
    r = spectool("check", mtp_path)
    assert r.returncode == 0 and "1 MTP head (NextN layers)" in r.stdout, r.stderr
    r = spectool("check", tiny["target"], tiny["draft"])
    assert r.returncode == 0 and r.stdout.count("no MTP heads") == 2 and "compatible" in r.stdout


def test_the_trunk_of_an_mtp_model_decodes_as_any_model(mtp_path):
    """The NextN block is not part of the trunk: loaded without it, the model has its trunk's layers and greedy
    speculation over it (prompt lookup) gives plain decoding's text."""
    from spectool_lab.helpers import tokens_of

    from spectool.core.controller import Controller
    from spectool.drafters.lookup import PromptLookup
    from spectool.llama.engine import Model
    from spectool.generate.loop import GenerationConfig

    with Model(mtp_path, n_ctx=512, n_threads=2) as m:
        assert m.architecture == "glm4moe" and m.n_nextn == 1 and m.n_offloadable == 3  # 2 blocks + output
        prompt = m.tokenize("The quick brown fox jumps over the lazy dog. The quick brown fox")
        plain = tokens_of(GenerationConfig(m, None, max_tokens=40), prompt)
        assert tokens_of(GenerationConfig(m, PromptLookup(), controller=Controller(k_max=8), max_tokens=40),
                         prompt) == plain


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def mtp_target(mtp_path):
    from spectool.drafters.mtp import MtpContext
    from spectool.llama.engine import Model

    with Model(mtp_path, n_ctx=1024, n_threads=2, load_mtp=True) as m:
        head = MtpContext(m)
        try:
            yield m, head
        finally:
            head.close()


def heads(mtp_target):
    """The drafters that use the MTP head, made by the session layer's factory."""
    from spectool.options import Mode
    from spectool.drafters.builder import drafter_for

    from spectool_lab.helpers import SplitHybrid

    from spectool.drafters.mtp import Mtp
    from spectool.drafters.lookup import PromptLookup

    _, head = mtp_target
    return {"mtp": lambda: drafter_for(Mode.mtp, None, mtp=head)[0],
            "hybrid-mtp": lambda: drafter_for(Mode.hybrid, None, mtp=head)[0],
            # hands over to the head after lookup's first token: every draft mixes the two
            "hybrid-mtp-split": lambda: SplitHybrid(PromptLookup(), Mtp(head))}


PROMPTS = ["The quick brown fox", "def add(a, b):\n    return a + b\n\ndef greet(name):",
           "the dog the fox the dog the fox the dog the"]


@pytest.mark.parametrize("text", PROMPTS)
@pytest.mark.parametrize("n", [2, 9, 80])  # at n = 1 there is no room for a draft
def test_greedy_output_under_mtp_equals_plain_decoding(mtp_target, text, n):
    from spectool_lab.helpers import tokens_of

    from spectool.core.controller import Controller
    from spectool.generate.loop import GenerationConfig
    from spectool.core.stats import Stats

    target, _ = mtp_target
    prompt = target.tokenize(text)
    plain = tokens_of(GenerationConfig(target, None, max_tokens=n), prompt)
    for name, make in heads(mtp_target).items():
        for controller in (Controller(k_max=3, k_min=3, adaptive=False), Controller(k_max=8)):
            st = Stats()
            assert tokens_of(GenerationConfig(target, make(), controller=controller, max_tokens=n), prompt, st) == plain, \
                name
            assert n < 9 or st.n_drafted > 0


def test_sampled_tokens_under_mtp_follow_the_target_distribution(mtp_target):
    """Chi-square over 3,000 seeded runs of the joint distribution of the first three tokens, drafts of three
    tokens from the MTP head (q: the head's own row under the same sampler chain), alone and after lookup's
    tokens (hybrid), as for the other drafters (test_speculative.py)."""
    from exactness import K_DRAFT, N_RUNS, SAMPLING, chi2_rejects, exact_joint, sample_joint

    from spectool.core.stats import Stats

    from spectool_lab.helpers import tokens_of

    from spectool.generate.loop import GenerationConfig

    target, _ = mtp_target
    prompt = target.tokenize("the dog the fox the dog the fox the dog the fox the dog the")
    prompt += tokens_of(GenerationConfig(target, None, max_tokens=24), prompt)  # inside its greedy loop: lookup drafts
    exact = exact_joint(target, prompt, SAMPLING)  # ends at end-of-generation: 5.8% of the mass after this prompt
    for name, make in heads(mtp_target).items():
        if name == "hybrid-mtp":
            continue  # lookup drafts nearly all of it here: the split hybrid below makes both draft
        st = Stats()
        counts = sample_joint(target, make, prompt, SAMPLING, stats=st)
        assert len(st.accepted_per_position) == K_DRAFT and min(st.accepted_per_position) > 0, \
            (name, st.accepted_per_position)
        assert name == "mtp" or "hybrid" in st.by_source
        assert st.n_accepted < st.n_drafted
        rejects, stat, crit = chi2_rejects(counts, exact, N_RUNS)
        assert not rejects, f"{name}: chi2 {stat:.1f} > {crit:.1f}"


def test_a_wrong_rule_under_mtp_is_caught(mtp_target, monkeypatch):
    """The check above can fail: with q of the first position used at every position, it rejects."""
    import spectool.generate.loop as spec
    from exactness import N_RUNS, SAMPLING, chi2_rejects, exact_joint, sample_joint, wrong_acceptance

    target, _ = mtp_target
    monkeypatch.setattr(spec, "accept_sampled", wrong_acceptance("q[0] at every position"))
    prompt = target.tokenize("the dog the fox the dog the fox the dog the fox the dog the")
    counts = sample_joint(target, heads(mtp_target)["mtp"], prompt)
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, prompt, SAMPLING), N_RUNS)
    assert rejects, f"chi2 {stat:.1f} <= {crit:.1f}"


def test_spec_mtp_through_the_command_line(mtp_path, tiny, tmp_path):
    """--spec mtp drafts from the target's heads and says so (--stats-json, the summary); auto picks the heads
    when the target has them and no -md is given; a target without heads is a clear error."""
    import json

    stats = tmp_path / "s.json"
    # -ngl 0 on a GPU host too: there batched and single-token kernels may flip near-ties (docs/exactness.md)
    base = ["run", "-m", mtp_path, "-n", "40", "-t", "2", "-c", "512", "-ngl", "0", "--stats-json", stats,
            "The quick brown fox"]
    plain = spectool(*base, "--spec", "none", "-q")
    assert plain.returncode == 0, plain.stderr
    for spec in ("mtp", "auto"):
        r = spectool(*base, "--spec", spec)
        j = json.loads(stats.read_text())
        assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
        assert j["mode"] == "mtp" and j["n_drafted"] > 0 and "[mtp]" in r.stderr
    r = spectool("run", "-m", tiny["target"], "--spec", "mtp", "-n", "4", "hi")
    assert r.returncode == 2 and "MTP heads" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture(scope="session")
def speculative_simple():
    """llama.cpp's llama-speculative-simple, built once from the llama.cpp sources vendored in the installed
    llama-cpp-python's sdist (tests/llamacpp.py: a few minutes on 2 cores, cached in ~/.cache/spectool-bench)."""
    from spectool_lab import llamacpp

    return llamacpp.build(quiet=True, targets=("llama-speculative-simple",))["llama-speculative-simple"]


@pytest.mark.parametrize("text", PROMPTS[:2])
def test_the_mtp_head_drafts_and_accepts_what_llama_cpps_draft_mtp_does(mtp_path, speculative_simple, text):
    """The oracle: llama.cpp's own MTP drafting (`llama-speculative-simple --spec-type draft-mtp`, 3-token drafts,
    greedy) and spectool's (`--spec mtp` with drafts fixed at 3) on the same model and prompt propose the same
    tokens and accept as many, step by step, and both outputs are plain decoding's. Steps are compared while both
    draft 3 tokens: near the end each tool cuts its last drafts to its own token budget."""
    from spectool_lab import llamacpp
    from spectool_lab.helpers import same_drafts_as_llama_cpp

    from spectool.drafters.mtp import Mtp, MtpContext
    from spectool.llama.engine import Model

    theirs = llamacpp.draft_mtp(speculative_simple, mtp_path, text, 40, n_draft=3)
    with Model(mtp_path, n_ctx=512, n_threads=2, load_mtp=True) as m:
        head = MtpContext(m)
        try:
            same_drafts_as_llama_cpp(m, Mtp(head), m.tokenize(text), theirs, min_steps=15)
        finally:
            head.close()
