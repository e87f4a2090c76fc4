"""Stopping: at a stop string (also inside a step's accepted run, and in the count of generated tokens), at an
end-of-generation token, when the context is full, and on an interruption, without losing held-back text; and a
draft that ends where the generation would (at a stop string or an end-of-generation token it holds)."""

from spectool_lab.helpers import tokens_of

from spectool.core.controller import Controller
from spectool.generate.loop import GenerationConfig, generate_text, speculative_generate
from spectool.core.stats import Stats
from spectool.drafters.draft_model import DraftModel
from spectool.drafters.lookup import PromptLookup
from spectool.llama.engine import Model


def test_stop_string_inside_an_accepted_run(target):
    prompt = target.tokenize("The quick brown fox")
    plain = GenerationConfig(target, None, max_tokens=80)
    full = "".join(text for text, _ in generate_text(plain, prompt))
    stop = full[30:34]
    assert stop and full.index(stop) >= 1
    st = Stats()
    g = GenerationConfig(target, PromptLookup(), max_tokens=80, controller=Controller(k_max=8, adaptive=False))
    text = "".join(t for t, _ in generate_text(g, prompt, stop=[stop], stats=st))
    assert text == full[: full.index(stop)]
    assert st.finish_reason == "stop"


def ends_at(monkeypatch, target, eog: int) -> None:
    """`target`'s vocabulary with `eog` an end-of-generation token (Model.is_eog, Model.first_eog)."""
    monkeypatch.setattr(target, "is_eog", lambda t: t == eog)
    monkeypatch.setattr(target, "first_eog", lambda tokens: next((i for i, t in enumerate(tokens) if t == eog),
                                                                 len(tokens)))


def test_end_of_generation_token_stops(target, draft, monkeypatch):
    """A token the vocabulary marks as end-of-generation (Model.is_eog, Model.first_eog) ends the output before
    it, finish reason "stop", also where the target accepted it as a drafted token in the middle of a step."""
    prompt = target.tokenize("The quick brown fox")
    plain = tokens_of(GenerationConfig(target, None, max_tokens=30), prompt)
    eog = plain[10]
    # a vocabulary in which plain decoding's 11th token ends generation
    ends_at(monkeypatch, target, eog)
    for drafter in (PromptLookup(), DraftModel(draft)):
        st = Stats()
        g = GenerationConfig(target, drafter, max_tokens=30, controller=Controller(k_max=4, adaptive=False))
        steps = list(speculative_generate(g, prompt, st))
        assert [t for step in steps for t in step.tokens] == plain[: plain.index(eog)] and st.finish_reason == "stop"
    assert steps[-1].accepted > len(steps[-1].tokens)  # the draft model's end came inside its accepted run


def test_context_full(tiny):
    with Model(tiny["target"], n_ctx=64) as m:
        prompt = m.tokenize("The quick brown fox jumps over the lazy dog.")
        st = Stats()
        g = GenerationConfig(m, PromptLookup(), max_tokens=500, controller=Controller(k_max=8, adaptive=False))
        out = tokens_of(g, prompt, st)
        assert st.finish_reason == "context"
        assert len(prompt) + len(out) == m.n_ctx + 1  # the last token needs no cache slot
        with Model(tiny["target"], n_ctx=64) as ref:
            plain = tokens_of(GenerationConfig(ref, None, max_tokens=500), prompt)
        assert out == plain


def test_a_stop_string_ends_the_count_of_generated_tokens(target):
    """Tokens of a step that come after its stop string are neither output nor counted."""
    prompt = target.tokenize("The quick brown fox")
    plain = tokens_of(GenerationConfig(target, None, max_tokens=80), prompt)
    full = target.detokenize(plain)
    stop = full[40:44]
    first = full.index(stop)
    j = next(j for j in range(1, len(plain) + 1) if stop in target.detokenize(plain[:j]))
    st = Stats()
    g = GenerationConfig(target, PromptLookup(), max_tokens=80, controller=Controller(k_max=16, adaptive=False))
    steps = list(generate_text(g, prompt, stop=[stop], stats=st))
    assert "".join(t for t, _ in steps) == full[:first]
    assert st.n_generated == sum(len(s.tokens) for _, s in steps) == j and st.finish_reason == "stop"


def test_an_interruption_keeps_the_text_held_back_for_a_stop_string(target):
    """While a stop string might still match, its start is held back; Ctrl-C must not lose that text."""
    prompt = target.tokenize("The quick brown fox")
    plain = tokens_of(GenerationConfig(target, None, max_tokens=60), prompt)
    full = target.detokenize(plain)
    never = full[5:] + "\x07"  # matches from character 5 on, never completes: everything after is held back
    steps = iter(range(10))
    g = GenerationConfig(target, None, max_tokens=60)
    out = list(generate_text(g, prompt, stop=[never], interrupted=lambda: next(steps) >= 9))
    text = "".join(t for t, _ in out)
    assert out[-1][1].finish_reason == "interrupted" and len(out) == 11
    assert text == target.detokenize(plain[:10]) and len(text) > 5



def last_step(target, prompt, drafter, stop=None, k_max=16, ctl=None):
    """The last step of a greedy generation of drafts of `k_max` (under `stop` strings), and its text."""
    ctl = ctl or Controller(k_max=k_max, adaptive=False)
    steps = list(generate_text(GenerationConfig(target, drafter, max_tokens=80, controller=ctl), prompt,
                               stop=stop or []))
    return steps[-1][1], "".join(t for t, _ in steps)


def test_a_draft_ends_where_its_stop_string_would(target, monkeypatch):
    """A draft that holds a stop string ends with the token that completes it (Loop.ended): whatever follows would
    be cut from the output. The text is plain decoding's up to the stop; without the cut (the negative control),
    the last step verifies drafts past it. (The tiny target loops here, as test_tree's LOOP says, and lookup drafts
    the loop.)"""
    import spectool.generate.loop as loop

    prompt = target.tokenize("the dog the fox the dog the fox the dog the fox the dog the")
    plain = tokens_of(GenerationConfig(target, None, max_tokens=80), prompt)
    full = target.detokenize(plain)
    # four turns of the loop, as its text first holds them (a loop of 2 tokens here)
    period, at = next((p, a) for a in range(len(plain)) for p in (1, 2, 3, 4)
                      if plain[a: a + 8 * p] == plain[a: a + p] * 8)
    stop = target.detokenize(plain[at: at + 4 * period])
    last, text = last_step(target, prompt, PromptLookup(), [stop])
    assert text == full[: full.index(stop)] and last.finish_reason == "stop"
    # all of the last draft was accepted and ends at the stop: the step's tokens are the draft
    assert last.drafted == last.accepted == len(last.tokens) > 1, last
    monkeypatch.setattr(loop.Loop, "ended", lambda self, d, keys: d)
    uncut, text = last_step(target, prompt, PromptLookup(), [stop])
    assert text == full[: full.index(stop)] and uncut.drafted > len(uncut.tokens), uncut


def test_a_draft_ends_at_its_first_end_of_generation_token(target, draft, monkeypatch):
    """A draft ends with its first end-of-generation token (nothing may follow it: Loop.ended), here a token plain
    decoding makes, made end-of-generation, which the draft model drafts; the time it took is charged to all 8 tokens
    drawn; without the cut, the last step verifies drafts past it."""
    import spectool.generate.loop as loop

    prompt = target.tokenize("The quick brown fox")
    plain = tokens_of(GenerationConfig(target, None, max_tokens=30), prompt)
    eog = plain[10]
    ends_at(monkeypatch, target, eog)

    class Heard(Controller):  # what the drafting time is charged to: every token drawn, the cut ones too
        def observe_draft(self, keys, seconds):
            self.charged = len(keys)
            super().observe_draft(keys, seconds)

    ctl = Heard(k_max=8, adaptive=False)
    last, text = last_step(target, prompt, DraftModel(draft), ctl=ctl)
    assert text == target.detokenize(plain[:10]) and last.finish_reason == "stop"
    assert last.drafted == last.accepted == len(last.tokens) + 1 > 1, last  # (the end drafted, nothing after)
    assert ctl.charged == 8 > last.drafted
    monkeypatch.setattr(loop.Loop, "ended", lambda self, d, keys: d)
    uncut, _ = last_step(target, prompt, DraftModel(draft), k_max=8)
    assert uncut.accepted > len(uncut.tokens) + 1, uncut  # (drafts past the end, accepted too)


def test_a_draft_ends_at_a_stop_string_begun_in_the_text_held_back(target):
    """The stream holds back "... a" (it could begin the stop string "ab"); a draft whose first token starts with "b"
    completes the stop string there, so it ends after that token (TextStream.ending reads the held-back text too)."""
    from spectool.generate.stream import TextStream

    stream = TextStream(target, ["ab"])
    out = stream.feed(target.tokenize("Hello xa", add_special=False))
    rest = target.tokenize("bcd efg", add_special=False)
    assert stream.pending == "a" and not out.endswith("a") and len(rest) > 1
    assert stream.ending(rest) == 1 and stream.pending == "a"
