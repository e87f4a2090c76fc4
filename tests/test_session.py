"""The session layer: typed options to a ready GenerationConfig, as every command builds it (real tiny models)."""

import pytest

from spectool_lab.helpers import tokens_of

from spectool.drafters.builder import Drafting
from spectool.drafters.hybrid import Hybrid
from spectool.session import Hooks, Options, Mode, UserError, open_session
from spectool.generate.loop import GenerationConfig


def test_a_session_is_the_generation_the_options_describe(tiny, target):
    """Every option lands where the generation reads it, and a session's greedy lookup output is plain
    decoding's."""
    o = Options(model=str(tiny["target"]), model_draft=str(tiny["draft"]), spec=Mode.hybrid, temp=0.5, top_k=7,
                repeat_penalty=1.1, draft_max=6, draft_min=2, max_tokens=40, ctx_size=512, threads=2, seed=3)
    with open_session(o) as s:
        g = s.gen
        assert s.mode == "hybrid" and isinstance(s.drafter, Hybrid) and not s.notices
        assert isinstance(g.drafter, Drafting) and g.drafter.base is s.drafter  # built whole around it
        assert (g.sampling.temp, g.sampling.top_k, g.sampling.repeat_penalty) == (0.5, 7, 1.1)
        assert (g.controller.k_max, g.controller.k_min, g.max_tokens, g.seed) == (6, 2, 40, 3)
        assert not g.controller.timed  # seeded sampling keeps its choices independent of timings
        assert g.target.n_ctx == 512 and s.target_name == str(tiny["target"]) and s.draft_name == str(tiny["draft"])
    # greedy, lookup: the same tokens as plain decoding with the shared tiny target
    prompt = target.tokenize("The quick brown fox")
    plain = tokens_of(GenerationConfig(target, None, max_tokens=30), prompt)
    with open_session(Options(model=str(tiny["target"]), spec=Mode.lookup, max_tokens=30, ctx_size=1024,
                              threads=2, gpu_layers="0")) as s:  # on the CPU, as `target` is, on a GPU host too
        assert s.mode == "lookup" and tokens_of(s.gen, prompt) == plain


def test_a_draft_that_cannot_draft_falls_back_with_a_notice(tiny):
    """A draft model whose vocabulary does not match the target's: auto falls back to lookup and says why; asked
    for by name (--spec draft), it is an error."""
    o = Options(model=str(tiny["target"]), model_draft=str(tiny["foreign"]), ctx_size=256, threads=2)
    with open_session(o) as s:
        assert s.mode == "lookup" and any("does not match" in n for n in s.notices)
    with pytest.raises(UserError, match="does not match"):
        with open_session(Options(model=str(tiny["target"]), model_draft=str(tiny["foreign"]), spec=Mode.draft,
                                  ctx_size=256, threads=2)):
            pass


def test_what_needs_the_user_comes_through_hooks(tiny):
    """Progress bars and notices reach the user through the Hooks a front end gives: a bar for loading each model
    and one for preparing a pruned draft."""
    bars, lines = [], []

    class Bar:  # what Hooks.bar makes: a context manager with fraction() and update()
        def __init__(self, label, unit):
            bars.append(label)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def fraction(self, done):
            pass

        def update(self, done, total):
            pass

    o = Options(model=str(tiny["target"]), model_draft=str(tiny["draft"]), draft_vocab=200, ctx_size=256, threads=2)
    with open_session(o, Hooks(bar=Bar, say=lines.append)) as s:
        n = s.drafter.draft.model.n_vocab  # the 200 likeliest tokens, and the special ones
        assert 200 <= n < s.gen.target.n_vocab and any(f"pruned to {n} tokens" in x for x in s.notices)
    assert [b for b in bars if b.startswith("loading")] == [f"loading {tiny['target'].name}",
                                                             f"loading {tiny['draft'].name}"]
    assert "preparing the draft" in bars
