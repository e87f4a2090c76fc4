"""EAGLE-3 heads (`--spec eagle3 -md HEAD.gguf`): a generated tiny eagle3 head for the tiny target, in the real
llama.cpp, against llama.cpp's own draft-eagle3."""

import pytest

from spectool_lab.helpers import spectool


@pytest.fixture(scope="session")
def head_path(tmp_path_factory):
    """A tiny EAGLE-3 head for the tiny target (tinymodels.write_eagle3_head)."""
    from spectool_lab.tinymodels import write_eagle3_head

    return write_eagle3_head(tmp_path_factory.mktemp("eagle3"))


@pytest.fixture(scope="module")
def eagle3_target(tiny, head_path):
    from spectool.drafters.eagle3 import Eagle3Context
    from spectool.llama.engine import Model

    with Model(tiny["target"], n_ctx=1024, n_threads=2) as m:
        head = Eagle3Context(m, head_path)
        try:
            yield m, head
        finally:
            head.close()


def heads(eagle3_target):
    """The drafters that use the EAGLE-3 head, made by the session layer's factory."""
    from spectool_lab.helpers import SplitHybrid

    from spectool.drafters.builder import drafter_for
    from spectool.drafters.eagle3 import Eagle3
    from spectool.drafters.lookup import PromptLookup
    from spectool.options import Mode

    _, head = eagle3_target
    return {"eagle3": lambda: drafter_for(Mode.eagle3, None, eagle3=head)[0],
            "hybrid-eagle3": lambda: drafter_for(Mode.hybrid, None, eagle3=head)[0],
            # hands over to the head after lookup's first token: every draft mixes the two
            "hybrid-eagle3-split": lambda: SplitHybrid(PromptLookup(), Eagle3(head))}


PROMPTS = ["the dog the fox the dog the fox the dog the", "def add(a, b):\n    return a + b\n\ndef greet(name):",
           "The quick brown fox"]
LOOP = "the dog the fox the dog the fox the dog the fox the dog the"  # 24 tokens on, the target's greedy text loops


def in_the_loop(target):
    """LOOP and 24 greedy tokens after it: the target's greedy text repeats two tokens there, which the head, an
    induction head, drafts (the target's top token, at 0.36 at temperature 1)."""
    from spectool_lab.helpers import tokens_of

    from spectool.generate.loop import GenerationConfig

    prompt = target.tokenize(LOOP)
    return prompt + tokens_of(GenerationConfig(target, None, max_tokens=24), prompt)


def test_check_names_the_head_and_what_it_reads(tiny, head_path, tmp_path):
    """`spectool check TARGET HEAD` says the file is an EAGLE-3 head, which target layers it reads, and whether it
    can draft for the target; a head that reads a layer the target lacks cannot."""
    from spectool_lab.tinymodels import write_eagle3_head

    r = spectool("check", tiny["target"], head_path)
    assert r.returncode == 0, r.stderr
    assert "an EAGLE-3 head" in r.stdout and "layers 0, 1, 2 (width 64)" in r.stdout
    assert "compatible: the head drafts for the target with --spec eagle3" in r.stdout
    other = write_eagle3_head(tmp_path, layers=(0, 1, 7))
    r = spectool("check", tiny["target"], other)
    assert r.returncode == 0 and "cannot draft for the target: the head reads layer 7; the target has 3" in r.stdout


def test_a_head_for_another_target_is_refused(tiny, tmp_path):
    from spectool_lab.tinymodels import write_eagle3_head

    from spectool.drafters.eagle3 import Eagle3Context
    from spectool.llama.engine import Model, ModelLoadError

    with Model(tiny["target"], n_ctx=256, n_threads=2) as m:
        with pytest.raises(ModelLoadError, match="reads layer 7"):
            Eagle3Context(m, write_eagle3_head(tmp_path, layers=(0, 1, 7)))
        with pytest.raises(ModelLoadError, match="not an EAGLE-3 head"):
            Eagle3Context(m, tiny["draft"])


@pytest.mark.parametrize("text", PROMPTS)
@pytest.mark.parametrize("n", [2, 40])
def test_greedy_output_under_eagle3_equals_plain_decoding(eagle3_target, text, n):
    from spectool_lab.helpers import tokens_of

    from spectool.core.controller import Controller
    from spectool.core.stats import Stats
    from spectool.generate.loop import GenerationConfig

    target, _ = eagle3_target
    prompt = target.tokenize(text)
    plain = tokens_of(GenerationConfig(target, None, max_tokens=n), prompt)
    for name, make in heads(eagle3_target).items():
        for controller in (Controller(k_max=3, k_min=3, adaptive=False), Controller(k_max=8)):
            st = Stats()
            assert tokens_of(GenerationConfig(target, make(), controller=controller, max_tokens=n), prompt,
                             st) == plain, name
            assert n < 9 or st.n_drafted > 0


def test_sampled_tokens_under_eagle3_follow_the_target_distribution(eagle3_target):
    """Chi-square over 3,000 seeded runs of the joint distribution of the first three tokens, drafts of three
    tokens from the EAGLE-3 head (q: the head's own row under the same sampler chain), alone and after lookup's
    tokens (hybrid), as for the MTP head (test_mtp.py)."""
    from exactness import K_DRAFT, N_RUNS, SAMPLING, chi2_rejects, exact_joint, sample_joint

    from spectool.core.stats import Stats

    target, _ = eagle3_target
    prompt = in_the_loop(target)
    exact = exact_joint(target, prompt, SAMPLING)
    for name, make in heads(eagle3_target).items():
        if name == "hybrid-eagle3":
            continue  # lookup drafts nearly all of it here: the split hybrid below makes both draft
        st = Stats()
        counts = sample_joint(target, make, prompt, SAMPLING, stats=st)
        assert len(st.accepted_per_position) == K_DRAFT and min(st.accepted_per_position) > 0, \
            (name, st.accepted_per_position)
        assert name == "eagle3" or "hybrid" in st.by_source
        assert st.n_accepted < st.n_drafted
        rejects, stat, crit = chi2_rejects(counts, exact, N_RUNS)
        assert not rejects, f"{name}: chi2 {stat:.1f} > {crit:.1f}"


def test_a_wrong_rule_under_eagle3_is_caught(eagle3_target, monkeypatch):
    """The check above can fail: with q of the first position used at every position, it rejects."""
    import spectool.generate.loop as spec
    from exactness import N_RUNS, SAMPLING, chi2_rejects, exact_joint, sample_joint, wrong_acceptance

    target, _ = eagle3_target
    prompt = in_the_loop(target)
    monkeypatch.setattr(spec, "accept_sampled", wrong_acceptance("q[0] at every position"))
    counts = sample_joint(target, heads(eagle3_target)["eagle3"], prompt)
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, prompt, SAMPLING), N_RUNS)
    assert rejects, f"chi2 {stat:.1f} <= {crit:.1f}"


def test_spec_eagle3_through_the_command_line(tiny, head_path, tmp_path):
    """--spec eagle3 drafts from the head -md names and says so (--stats-json, the summary); auto picks the head
    when -md is one; --spec eagle3 without a head, and with --parallel above 1, is a clear one-line error."""
    import json

    stats = tmp_path / "s.json"
    # -ngl 0 on a GPU host too: there batched and single-token kernels may flip near-ties (docs/exactness.md)
    base = ["run", "-m", tiny["target"], "-n", "40", "-t", "2", "-c", "512", "-ngl", "0", "--stats-json", stats,
            PROMPTS[0]]
    plain = spectool(*base, "--spec", "none", "-q")
    assert plain.returncode == 0, plain.stderr
    for spec in ("eagle3", "auto"):
        r = spectool(*base, "-md", head_path, "--spec", spec)
        j = json.loads(stats.read_text())
        assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
        assert j["mode"] == "eagle3" and j["n_drafted"] > 0 and "[eagle3]" in r.stderr
    r = spectool("run", "-m", tiny["target"], "--spec", "eagle3", "-n", "4", "hi")
    assert r.returncode == 2 and "EAGLE-3 head" in r.stderr and "Traceback" not in r.stderr
    r = spectool("run", "-m", tiny["target"], "-md", head_path, "--spec", "draft", "-n", "4", "hi")
    assert r.returncode == 2 and "-md is an EAGLE-3 head, not a draft model" in r.stderr
    r = spectool("bench", "-m", tiny["target"], "-md", head_path, "--greedy-only")
    assert r.returncode == 2 and "does not measure heads yet" in r.stderr and "Traceback" not in r.stderr
    r = spectool("serve", "-m", tiny["target"], "-md", head_path, "--spec", "eagle3", "--parallel", "2",
                 timeout=120)
    assert r.returncode == 2 and "--parallel above 1 drafts by prompt lookup only" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="session")
def speculative_simple():
    """llama.cpp's llama-speculative-simple, built once from the vendored llama.cpp sources (see test_mtp.py)."""
    from spectool_lab import llamacpp

    return llamacpp.build(quiet=True, targets=("llama-speculative-simple",))["llama-speculative-simple"]


@pytest.mark.parametrize("text", PROMPTS[:2])
def test_the_head_drafts_and_accepts_what_llama_cpps_draft_eagle3_does(tiny, head_path, speculative_simple, text):
    """The oracle: llama.cpp's own EAGLE-3 drafting (`llama-speculative-simple -md HEAD --spec-type draft-eagle3`,
    3-token drafts, greedy) and spectool's (`--spec eagle3` with drafts fixed at 3) on the same target, head and
    prompt propose the same tokens and accept as many, step by step, and both outputs are plain decoding's. Steps
    are compared while both draft 3 tokens: near the end each tool cuts its last drafts to its own token budget."""
    drafts_as_llama_cpp(tiny["target"], head_path, text, speculative_simple)


def drafts_as_llama_cpp(target, head_path, text, speculative_simple):
    """The oracle's check (helpers.same_drafts_as_llama_cpp) of the head at `head_path` over `target`."""
    from spectool_lab import llamacpp
    from spectool_lab.helpers import same_drafts_as_llama_cpp

    from spectool.drafters.eagle3 import Eagle3, Eagle3Context
    from spectool.llama.engine import Model

    theirs = llamacpp.draft_eagle3(speculative_simple, target, head_path, text, 40, n_draft=3)
    with Model(target, n_ctx=512, n_threads=2) as m:
        head = Eagle3Context(m, head_path)
        try:
            same_drafts_as_llama_cpp(m, Eagle3(head), m.tokenize(text), theirs, min_steps=10)
        finally:
            head.close()


def test_serve_drafts_with_the_head(tiny, head_path):
    """`spectool serve -md HEAD --spec eagle3` answers a greedy completion with plain decoding's text, its usage
    saying the head drafted."""
    from spectool_lab.helpers import serve_drafts_with_head

    serve_drafts_with_head(tiny["target"], head_path, "eagle3", LOOP)


def test_a_head_reading_the_targets_last_layer_drafts_what_llama_cpp_does(tiny, head_path, speculative_simple):
    """Over the two-layer draft model as the target, the head's layer 2 is the target's output (its last hidden
    state, llama_get_embeddings_nextn, as llama.cpp reads a layer id equal to the layer count): the drafts are
    still llama.cpp's, step by step."""
    from spectool_lab import llamacpp

    from spectool.core.controller import Controller
    from spectool.drafters.eagle3 import Eagle3, Eagle3Context
    from spectool.generate.loop import GenerationConfig, speculative_generate
    from spectool.llama.engine import Model

    theirs = llamacpp.draft_eagle3(speculative_simple, tiny["draft"], head_path, LOOP, 40, n_draft=3)
    with Model(tiny["draft"], n_ctx=512, n_threads=2) as m:
        head = Eagle3Context(m, head_path)
        try:
            drafter, proposed, propose = Eagle3(head), [], Eagle3.propose
            drafter.propose = lambda *a: proposed.append(propose(drafter, *a)) or proposed[-1]
            list(speculative_generate(GenerationConfig(m, drafter, max_tokens=60, controller=Controller(
                k_max=3, k_min=3, adaptive=False)), m.tokenize(LOOP)))
        finally:
            head.close()
    n = min(len(theirs), len(proposed)) - 3  # near the end each tool cuts its drafts to its own budget
    assert n >= 15 and [t.draft for t in theirs[:n]] == [list(d.tokens) for d in proposed[:n]]


def test_a_head_with_its_own_embeddings_a_fused_norm_and_a_smaller_vocabulary_drafts_what_llama_cpp_does(
        tiny, tmp_path, speculative_simple):
    """Published heads carry more than the tiny one: token embeddings of their own (Llama 3.3 70B's), an RMSNorm on
    the fused features before fc (EAGLE-3.1's `norm_before_fc`) and a draft vocabulary mapped to the target's (d2t:
    here every token but each fifth, in reverse order). llama.cpp's graph reads each; the drafts over such a head are
    still llama.cpp's, step by step, `spectool check` knows it, and the output is plain decoding's."""
    from spectool_lab.tinymodels import write_eagle3_head

    variant = write_eagle3_head(tmp_path, variant=True)
    r = spectool("check", tiny["target"], variant)
    assert r.returncode == 0 and "compatible: the head drafts for the target with --spec eagle3" in r.stdout
    drafts_as_llama_cpp(tiny["target"], variant, LOOP, speculative_simple)


def test_a_head_on_the_hub_is_a_head(tiny, head_path, tmp_path):
    """`-md hf:OWNER/REPO/HEAD.gguf` (a local server standing in for the Hub): the file is downloaded, found to be an
    EAGLE-3 head and drafts as one (`--spec auto`), the text plain decoding's; `--spec lookup` downloads nothing."""
    import json
    import os

    from fakehub import FakeHub

    with FakeHub() as hub:
        hub.add("someone/tiny-eagle3", {"head.gguf": head_path})
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"))
        base = ["run", "-m", tiny["target"], "-n", "40", "-t", "2", "-c", "512", "-ngl", "0", LOOP]
        plain = spectool(*base, "--spec", "none", "-q", env=env)
        # a mode that drafts with no head downloads none
        r = spectool(*base, "--spec", "lookup", "-md", "hf:someone/tiny-eagle3/head.gguf", "-q", env=env)
        assert r.returncode == 0 and r.stdout == plain.stdout and not hub.gets("head.gguf"), r.stderr
        stats = tmp_path / "s.json"
        r = spectool(*base, "-md", "hf:someone/tiny-eagle3/head.gguf", "--stats-json", stats, "-q", env=env)
        assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
        j = json.loads(stats.read_text())
        assert j["mode"] == "eagle3" and j["n_drafted"] > 0, j
        assert hub.gets("head.gguf")
