"""The session layer: typed options to a ready GenerationConfig, as every command builds it (real tiny models)."""

from dataclasses import replace

import pytest

from spectool_lab.helpers import tokens_of

from spectool.core.evidence import Source
from spectool.core.stats import Stats
from spectool.core.verify import Sampling
from spectool.session import Hooks, Options, Mode, UserError, open_session
from spectool.generate.loop import GenerationConfig, speculative_generate


def test_a_session_generates_as_its_options_say(tiny, target):
    """Every option reaches the generation, seen in what it generates: with --top-k 1 a sampled run at any
    temperature is greedy under the same repeat penalty (exact under speculation), so a session's text equals plain
    greedy decoding with that penalty built by hand, and differs from it without the penalty or the top-k; each step
    drafts between --draft-min and --draft-max tokens (fewer only where the token budget ends), from the draft
    model (hybrid); -n bounds the text."""
    def by_hand(penalty: float, prompt: list[int]) -> list[int]:
        return tokens_of(GenerationConfig(target, None, Sampling(temp=0.0, repeat_penalty=penalty), max_tokens=40),
                         prompt)

    # a prompt that echoes the tiny model's own greedy text, so that its greedy continuation repeats a recent token
    # and the repeat penalty changes it
    start = target.tokenize("The quick brown fox")
    prompt = start + by_hand(1.0, start)[:20] + start

    o = Options(model=str(tiny["target"]), model_draft=str(tiny["draft"]), spec=Mode.hybrid, temp=0.5, top_k=1,
                repeat_penalty=1.3, draft_max=6, draft_min=2, max_tokens=40, ctx_size=1024, threads=2, seed=3,
                gpu_layers="0", gpu_layers_draft="0")  # on the CPU, as `target` is, on a GPU host too
    with open_session(o) as s:
        assert s.mode == "hybrid" and s.draft_name == str(tiny["draft"]) and not s.notices
        st = Stats()
        steps = list(speculative_generate(s.gen, prompt, st))
    tokens = [t for step in steps for t in step.tokens]
    assert tokens == by_hand(1.3, prompt) != by_hand(1.0, prompt) and len(tokens) == 40
    made = 0
    for step in steps:
        assert min(2, 40 - made - 1) <= step.drafted <= 6, (made, step.drafted)
        made += len(step.tokens)
    assert st.by_source.get(Source.draft, 0) + st.by_source.get(Source.hybrid, 0) > 0
    with open_session(replace(o, top_k=40)) as s:  # the same session but for --top-k: other text
        assert tokens_of(s.gen, prompt) != tokens
    # greedy, lookup: the same tokens as plain decoding with the shared tiny target
    with open_session(Options(model=str(tiny["target"]), spec=Mode.lookup, max_tokens=40, ctx_size=1024,
                              threads=2, gpu_layers="0")) as s:
        assert s.mode == "lookup" and tokens_of(s.gen, prompt) == by_hand(1.0, prompt)


def test_a_draft_with_another_vocabulary_drafts_through_text(tiny):
    """A draft model whose vocabulary is not the target's drafts through text (drafters/text.py), with a notice;
    asked for by name (--spec draft), it is the drafter."""
    from spectool.drafters.text import TextDraft

    o = Options(model=str(tiny["target"]), model_draft=str(tiny["foreign"]), ctx_size=256, threads=2)
    with open_session(o) as s:
        assert s.mode == "hybrid" and any("drafts through text" in n for n in s.notices)
    with open_session(Options(model=str(tiny["target"]), model_draft=str(tiny["foreign"]), spec=Mode.draft,
                              ctx_size=256, threads=2)) as s:
        assert s.mode == "draft" and isinstance(s.policy.drafter, TextDraft)


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
        n = s.draft_model.n_vocab  # the 200 likeliest tokens, and the special ones
        assert 200 <= n < s.gen.target.n_vocab and any(f"pruned to {n} tokens" in x for x in s.notices)
    assert [b for b in bars if b.startswith("loading")] == [f"loading {tiny['target'].name}",
                                                             f"loading {tiny['draft'].name}"]
    assert "preparing the draft" in bars
