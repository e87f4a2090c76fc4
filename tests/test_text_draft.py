"""A draft model with another vocabulary, drafting through text (drafters/text.py), on the generated tiny models:
the foreign model's ordinary tokens are the target's in another order, so its ids mean other texts. Its text
becomes the target's tokens as the target's tokenizer writes them; greedy output is plain decoding's and sampled
output the target's distribution (chi-square, with a negative control); a draft that is the target itself,
through text, has its drafts accepted."""

import pytest
from exactness import N_RUNS, SAMPLING, chi2_rejects, exact_joint, sample_joint, wrong_acceptance
from spectool_lab.helpers import tokens_of

from spectool.core.controller import Controller
from spectool.core.stats import Stats
from spectool.drafters.text import TextDraft, following, whole
from spectool.generate.loop import GenerationConfig
from spectool.llama.engine import Model

TEXTS = ["The quick brown fox", "def add(a, b):\n    return a + b\n", "the dog the fox the dog the"]


@pytest.fixture(scope="module")
def foreign(tiny):
    with Model(tiny["foreign"], n_ctx=1024, n_threads=2) as m:
        yield m


@pytest.fixture(scope="module")
def itself(tiny):
    """The target as its own draft model, a second context: through text, it drafts the target's greedy text."""
    with Model(tiny["target"], n_ctx=1024, n_threads=2) as m:
        yield m


def test_a_text_becomes_the_target_s_tokens_whole(target, foreign):
    """following() gives tokens whose text is the text itself, after any anchor, where the anchor's last token
    and the text merge too (a word split between them); whole() keeps only whole characters."""
    for text in ["brown fox", "own fox jumps", "\n    return a", " b):\n"]:
        for anchor in ["The quick ", "The quick br", ""]:
            for vocab in (target, foreign):
                assert vocab.detokenize(following(vocab, anchor, text)) == text, (anchor, text)
    assert whole("héllo".encode()[:2]) == "h" and whole("héllo".encode()[:3]) == "hé"
    assert foreign.tokenize("the dog", add_special=False) != target.tokenize("the dog", add_special=False)


def greedy(model, drafter, prompt, n=40, stats=None):
    return tokens_of(GenerationConfig(model, drafter, controller=Controller(k_max=4, adaptive=False),
                                      max_tokens=n), prompt, stats)


@pytest.mark.parametrize("which", ["foreign", "itself"])
def test_greedy_output_is_plain_decoding_s(target, foreign, itself, which):
    """Through text, with drafts of 4 every step: each prompt's output is plain decoding's, token for token, and
    some drafts are accepted. (The tiny target's text is byte soup that its own tokenizer writes with other
    tokens, so the target through text drafts poorly here: the real models below show acceptance.)"""
    draft = {"foreign": foreign, "itself": itself}[which]
    st = Stats()
    for text in TEXTS:
        prompt = target.tokenize(text)
        assert greedy(target, TextDraft(draft, target), prompt, stats=st) == greedy(target, None, prompt)
    assert st.n_drafted > 0 and (which == "foreign" or st.n_accepted > 0)


@pytest.fixture(scope="module")
def gemma(gemma_q4):
    with Model(gemma_q4, n_ctx=1024, n_threads=2) as m:
        yield m


@pytest.mark.parametrize("which", ["gemma itself", "smollm2"])
def test_real_drafts_through_text_are_accepted(gemma, gemma_q4, smollm2, which):
    """Real models: Gemma 3 270M drafting for itself through text has nearly all its drafts accepted (its greedy
    text, written in its own tokens as its tokenizer writes them), and SmolLM2 135M (49k tokens, another family)
    drafting for Gemma (262k) has some accepted on a plain English answer; the output is plain decoding's."""
    path = gemma_q4 if which == "gemma itself" else smollm2
    prompt = gemma.tokenize("Question: What is the capital of France, and what river runs through it?\nAnswer:")
    st = Stats()
    with Model(path, n_ctx=1024, n_threads=2) as draft:
        got = greedy(gemma, TextDraft(draft, gemma), prompt, n=48, stats=st)
    assert got == greedy(gemma, None, prompt, n=48)
    assert st.n_accepted > (0.8 if which == "gemma itself" else 0.1) * st.n_drafted, (st.n_accepted, st.n_drafted)


def test_the_draft_s_cache_follows_the_history_s_text(target, foreign):
    """Whatever the history does between steps (grows by a token or many, drops drafted tokens, starts anew), the
    draft's cache then holds its text in the draft's own tokens, and what the draft proposed is gone."""
    drafter = TextDraft(foreign, target)
    words = target.tokenize("def add(a, b):\n    return a + b\n\ndef greet(name): print(name)", add_special=False)
    bos = target.tokenize("")
    for n in (4, 5, 9, 30, 7, 8, 31, 2, 31):
        history = bos + words[:n]
        drafter.propose(history, 3, SAMPLING, None)  # drafts, then
        drafter.propose(history, 0, SAMPLING, None)  # only follows the history
        assert foreign.detokenize(foreign.tokens) == target.detokenize(history), n


def test_sampled_tokens_follow_the_target_distribution(target, itself):
    """At temperature 1, drafts of 3 through text at the first step (the target's own greedy text, so that drafts
    are accepted and rejected at every position): the first three tokens' joint distribution is the target's."""
    prompt = target.tokenize("The quick brown fox")
    st = Stats()
    counts = sample_joint(target, lambda: TextDraft(itself, target), prompt, stats=st)
    assert min(st.accepted_per_position) > 0 and st.n_accepted < st.n_drafted, st.accepted_per_position
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, prompt, SAMPLING), N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"


def test_a_wrong_acceptance_rule_is_caught(target, itself, monkeypatch):
    """The same test rejects drafts through text accepted always."""
    import spectool.generate.loop as loop

    monkeypatch.setattr(loop, "accept_sampled", wrong_acceptance("accept always"))
    prompt = target.tokenize("The quick brown fox")
    counts = sample_joint(target, lambda: TextDraft(itself, target), prompt)
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, prompt, SAMPLING), N_RUNS)
    assert rejects, f"chi2 {stat:.1f} <= {crit:.1f}: the test cannot tell a wrong rule"


def test_a_server_drafts_through_text(tiny):
    """`spectool serve -md` with a draft of another vocabulary: greedy completions are the plain server's, drafted
    by the draft model through text (usage's by_source), with no refusal."""
    from spectool_lab.helpers import Server

    texts = {}
    for name, args in {"plain": ("--spec", "none"), "text": ("-md", str(tiny["foreign"]), "--spec", "draft")}.items():
        server = Server(tiny["target"], *args)
        try:
            r = server.client().completions.create(model="tiny", prompt=TEXTS[1], max_tokens=32, temperature=0)
            texts[name], usage = r.choices[0].text, r.usage.model_extra["speculative"]
        finally:
            server.stop()
    assert texts["text"] == texts["plain"]
    assert usage["mode"] == "draft" and usage["by_source"].get("draft", 0) > 0, usage
