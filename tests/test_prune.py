"""The vocabulary-pruned draft: a real GGUF rewrite loaded by llama.cpp, id mapping, and unchanged output."""

import numpy as np
import pytest

from spectool.drafters import prune
from spectool.core.controller import Controller
from spectool.drafters.draft_model import DraftModel
from spectool.drafters.hybrid import Hybrid
from spectool.drafters.lookup import PromptLookup
from spectool.llama.engine import Model
from spectool.generate.loop import GenerationConfig, speculative_generate
from spectool.core.stats import Stats

VOCAB = 400


@pytest.fixture(scope="module")
def pruned(tiny, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # the environment is left as it was found
        mp.setenv("SPECTOOL_CACHE", str(tmp_path_factory.mktemp("cache")))
        path = prune.pruned_draft(tiny["draft"], VOCAB)
        assert path == prune.cached_path(tiny["draft"], VOCAB) and prune.pruned_draft(tiny["draft"], VOCAB) == path
    with Model(path, n_ctx=1024) as m:
        yield m, prune.read_ids(path)


def test_pruned_file_keeps_specials_bytes_and_likely_tokens(pruned, draft):
    m, ids = pruned
    assert m.n_vocab == VOCAB and len(ids) == VOCAB and list(ids) == sorted(ids)
    assert set(range(5)) <= set(ids.tolist())  # specials
    info_full, info = draft.vocab_info(), m.vocab_info()
    assert sum(t.startswith(b"<0x") for t in info.texts) == 256  # byte fallback kept
    assert all(info.texts[i] == info_full.texts[int(old)] for i, old in enumerate(ids))  # texts follow the ids
    assert info.eos == int(np.flatnonzero(ids == info_full.eos)[0])


def test_pruned_embedding_rows_match_the_full_draft(pruned, draft):
    """Same weights: on a text made only of kept tokens, the pruned draft's logits are the full draft's, sliced."""
    m, ids = pruned
    text = [int(t) for t in draft.tokenize("The quick brown fox") if t in set(ids.tolist())]
    to_draft = {int(t): i for i, t in enumerate(ids)}
    m.reset()
    draft.reset()
    m.eval([to_draft[t] for t in text])
    draft.eval(text)
    np.testing.assert_allclose(m.logits(-1), draft.logits(-1)[ids], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hybrid", [False, True])
def test_greedy_output_with_a_pruned_draft_equals_plain(target, pruned, hybrid):
    m, ids = pruned
    for text in ["The quick brown fox", "def add(a, b):\n    return a + b\n"]:
        prompt = target.tokenize(text)
        plain = [t for s in speculative_generate(GenerationConfig(target, None, max_tokens=80), prompt) for t in s.tokens]
        d = DraftModel(m, ids=ids, n_target=target.n_vocab)
        st = Stats()
        g = GenerationConfig(target, Hybrid(PromptLookup(), d) if hybrid else d, max_tokens=80,
                       controller=Controller(k_max=4, adaptive=False))
        assert [t for s in speculative_generate(g, prompt, st) for t in s.tokens] == plain
        assert st.n_accepted > 0


def test_cli_draft_vocab(tiny, tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from spectool.cli import app

    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    # the CPU on a GPU host too (-ngl 0): there batched and single-token kernels may flip near-ties
    args = ["run", "-m", str(tiny["target"]), "-md", str(tiny["draft"]), "--spec", "draft", "-n", "30", "-q",
            "-ngl", "0", "-ngld", "0"]
    plain = CliRunner().invoke(app, [*args[:5], "--spec", "none", *args[7:], "The quick brown fox"])
    stats = tmp_path / "s.json"
    r = CliRunner().invoke(app, [*args, "--draft-vocab", str(VOCAB), "--stats-json", str(stats), "The quick brown fox"])
    assert r.exit_code == 0, r.output
    assert r.stdout == plain.stdout and "preparing a 400-token copy" in r.stderr
    assert json.loads(stats.read_text())["n_drafted"] > 0
    again = CliRunner().invoke(app, [*args, "--draft-vocab", str(VOCAB), "The quick brown fox"])
    assert again.exit_code == 0 and "preparing" not in again.stderr  # cached


def test_sampled_tokens_with_a_pruned_draft_follow_the_target(target, pruned):
    """At temperature > 0 the pruned draft's q lives on the target's vocabulary (zero outside the kept ids):
    rejection sampling still gives the target's distribution."""
    from exactness import N_RUNS, SAMPLING, chi2_rejects, exact_joint, sample_joint

    m, ids = pruned
    prompt = target.tokenize("The quick brown fox")
    joint = exact_joint(target, prompt, SAMPLING)
    counts = sample_joint(target, lambda: DraftModel(m, ids=ids, n_target=target.n_vocab), prompt)
    rejects, stat, crit = chi2_rejects(counts, joint, N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"
