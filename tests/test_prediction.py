"""OpenAI's Predicted Outputs: the prediction drafter (drafters/prediction.py) on the tiny model's real greedy output,
its place found again after an edit, its counts against the steps' own, and the same through `spectool serve`
(the official `openai` client's `prediction=`) and `spectool run --prediction FILE`."""

import json

import pytest
from spectool_lab.helpers import Server, spectool

from spectool.core.controller import Controller
from spectool.core.evidence import Source
from spectool.core.stats import Stats
from spectool.drafters.builder import for_generation
from spectool.drafters.lookup import PromptLookup
from spectool.drafters.prediction import Place, PredictionDrafter
from spectool.generate.loop import GenerationConfig, speculative_generate

PROMPT = "def greet(name):\n    print("
N = 80


def generate(target, prediction, base=True, k=4, grammar=None):
    """(the tokens, the Stats, the steps) of the tiny model's greedy output after PROMPT, drafted k tokens a step
    (a fixed length: every offer drafted) from `prediction` ahead of prompt lookup (`base`: or of nothing)."""
    drafter = for_generation(PromptLookup() if base else None, grammar is not None, prediction=prediction)
    g = GenerationConfig(target, drafter, max_tokens=N, controller=Controller(k_max=k, adaptive=False),
                         grammar=grammar)
    st = Stats()
    steps = list(speculative_generate(g, target.tokenize(PROMPT), st))
    return [t for s in steps for t in s.tokens], st, steps


@pytest.fixture(scope="module")
def plain(target):
    """The target's own greedy output, one token a step."""
    g = GenerationConfig(target, None, max_tokens=N)
    return [t for s in speculative_generate(g, target.tokenize(PROMPT)) for t in s.tokens]


def predictions(y):
    """Predictions of the output `y`: itself, with a stretch deleted, with one inserted, shifted, reversed, and one
    of other tokens altogether."""
    return {"exact": y, "deleted": y[:20] + y[30:], "inserted": y[:25] + [7, 8, 9, 10] + y[25:],
            "shifted": y[12:], "reversed": y[::-1], "other": [5 + t % 50 for t in range(60)]}


@pytest.mark.parametrize("base", [True, False], ids=["lookup", "nothing else"])
def test_the_output_is_the_targets_whatever_the_prediction(target, plain, base):
    for name, q in predictions(plain).items():
        assert generate(target, q, base)[0] == plain, name
    assert generate(target, None, base)[0] == plain


def test_the_counts_are_what_the_steps_drafted(target, plain):
    """Accepted: the prediction's drafted tokens that made the output; rejected: the rest of its drafted tokens,
    step by step."""
    for name, q in predictions(plain).items():
        _, st, steps = generate(target, q)
        mine = [s for s in steps if s.source is Source.prediction]
        assert st.by_source.get("prediction", 0) == sum(s.drafted for s in mine), name
        assert st.prediction_accepted == sum(min(s.accepted, len(s.tokens)) for s in mine), name
        assert st.prediction_rejected == sum(s.drafted - min(s.accepted, len(s.tokens)) for s in mine), name
        j = st.to_json()
        assert (j["accepted_prediction_tokens"], j["rejected_prediction_tokens"]) == (st.prediction_accepted,
                                                                                     st.prediction_rejected)


def test_an_exact_prediction_drafts_the_output_and_an_edited_one_finds_its_place_again(target, plain):
    _, exact, _ = generate(target, plain)
    assert exact.prediction_accepted >= 0.7 * N and exact.prediction_rejected <= 4
    # past a deleted stretch of ten tokens, and past four inserted ones, most of the output is drafted again
    for name in ("deleted", "inserted"):
        _, st, steps = generate(target, predictions(plain)[name])
        after = sum(min(s.accepted, len(s.tokens)) for s in steps[len(steps) // 2:] if s.source is Source.prediction)
        assert st.prediction_accepted >= 0.5 * N and after > 0, name
    _, wrong, _ = generate(target, predictions(plain)["other"])
    assert wrong.prediction_accepted < exact.prediction_accepted / 4


def test_a_lost_place_is_found_at_the_nearest_match_after_it_else_the_latest_before():
    d = PredictionDrafter([1, 2, 3, 9, 1, 2, 4, 9, 1, 2])
    assert d.find([7, 1, 2], 3, anchor=0) == Place(2, 2, False)  # the first [1, 2] from the start
    assert d.find([7, 1, 2], 3, anchor=3) == Place(6, 2, False)  # the nearest one ending at or after the anchor
    assert d.find([7, 1, 2], 3, anchor=7) == Place(6, 2, False)  # none after it with a token to follow: before
    assert d.find([9, 1, 2, 4], 4, anchor=0) == Place(7, 4, True)  # the longest n-gram first, however far
    assert d.find([6, 6], 2, anchor=0) is None


def test_it_drafts_under_a_grammar_too(target):
    from spectool.core.grammar import Grammar

    grammar = Grammar.gbnf('root ::= "def greet(name):" [a-z ():\\n]*')
    base, _, _ = generate(target, None, grammar=grammar)
    out, st, _ = generate(target, base, grammar=grammar)
    assert out == base and st.prediction_accepted > 0


# -- through the server and the command line --------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tiny):
    s = Server(tiny["target"], "--no-lookup-corpus", "--draft-min", "4", "--draft-max", "4")
    yield s
    s.stop()


MESSAGES = [{"role": "user", "content": "def greet(name):"}]
EDIT = [{"role": "user", "content": "Write this function again with a docstring:\n\ndef add(a, b):\n"
                                    "    total = a + b\n    print(total)\n    return total\n"}]


@pytest.mark.realmodel
def test_the_openai_clients_prediction_gives_the_same_answer_and_its_counts(gemma_f16):
    """Through the `openai` client's `prediction=`, on F16 Gemma (the tiny model's text holds bytes that are no
    UTF-8, which no prediction's text can spell), at a fixed draft length so that the drafts reproduce: the same
    answer with the answer itself as the prediction (whole, or in text parts), with another text, and streamed;
    accepted and rejected adding up to what was drafted from it. -ngl 0: two greedy runs compared (README)."""
    s = Server(gemma_f16, "--no-lookup-corpus", "--draft-min", "4", "--draft-max", "4", "-ngl", "0")
    try:
        c = s.client()
        plain = c.chat.completions.create(model="any", messages=EDIT, max_tokens=64)
        text = plain.choices[0].message.content
        assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
        parts = [{"type": "text", "text": text[:9]}, {"type": "text", "text": text[9:]}]
        for prediction, exact in ((text, True), (parts, True), ("Totally unrelated words here.", False)):
            predicted = {"type": "content", "content": prediction}
            r = c.chat.completions.create(model="any", messages=EDIT, max_tokens=64, prediction=predicted)
            details, spec = r.usage.completion_tokens_details, r.usage.model_extra["speculative"]
            assert r.choices[0].message.content == text
            assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == \
                spec["by_source"].get("prediction", 0)
            if exact:
                assert details.accepted_prediction_tokens >= r.usage.completion_tokens // 2
                assert details.rejected_prediction_tokens <= 4
            else:
                assert details.accepted_prediction_tokens <= 4
            chunks = list(c.chat.completions.create(model="any", messages=EDIT, max_tokens=64, stream=True,
                                                    stream_options={"include_usage": True},
                                                    prediction=predicted))
            assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
            assert chunks[-1].usage.completion_tokens_details == details  # the same drafts
    finally:
        s.stop()


def test_completions_take_a_prediction_and_count_as_spectool_run_does(server, tiny, tmp_path):
    """/v1/completions and `spectool run --prediction FILE` at the same fixed draft length: the same text, and
    the same accepted and rejected tokens (the server's usage, run's --stats-json)."""
    prompt = "the dog the fox the dog the fox the"
    plain = server.client().completions.create(model="any", prompt=prompt, max_tokens=30).choices[0].text
    predicted = tmp_path / "predicted.txt"
    predicted.write_text(plain[:12] + " cat" + plain[12:])
    r = server.client().completions.create(model="any", prompt=prompt, max_tokens=30,
                                           extra_body={"prediction": {"type": "content",
                                                                      "content": predicted.read_text()}})
    details = r.usage.completion_tokens_details
    assert r.choices[0].text == plain and details.accepted_prediction_tokens > 0
    stats = tmp_path / "s.json"
    out = spectool("run", "-m", tiny["target"], "-c", "1024", "-t", "2", "-n", "30", "-q", "--draft-min", "4",
                   "--draft-max", "4", "--prediction", predicted, "--stats-json", stats, prompt, timeout=300)
    assert out.returncode == 0 and out.stdout in (plain, plain + "\n")
    j = json.loads(stats.read_text())
    assert (j["accepted_prediction_tokens"], j["rejected_prediction_tokens"]) == \
        (details.accepted_prediction_tokens, details.rejected_prediction_tokens)


@pytest.mark.parametrize("prediction, param", [
    ("some text", "prediction"), ({"content": "x"}, "prediction.type"), ({"type": "text", "content": "x"},
                                                                       "prediction.type"),
    ({"type": "content"}, "prediction.content"), ({"type": "content", "content": 7}, "prediction.content"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "prediction.content"),
])
def test_a_prediction_of_another_shape_is_a_400_naming_the_field(server, prediction, param):
    for path, body in (("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "x"})):
        status, text = server.request("POST", path, {**body, "model": "any", "max_tokens": 4,
                                                     "prediction": prediction})
        error = json.loads(text)["error"]
        assert status == 400 and error["param"] == param and f"'{param}'" in error["message"], (path, text)


def test_run_with_a_prediction_file_and_a_bad_one(tiny, tmp_path):
    args = ["run", "-m", tiny["target"], "-c", "1024", "-t", "2", "-n", "24", "-q"]
    plain = spectool(*args, "def greet(name):", timeout=300)
    app = tmp_path / "app.py"
    app.write_text(plain.stdout)
    out = spectool(*args, "--prediction", app, input="def greet(name):", timeout=300)
    assert out.returncode == 0 and out.stdout == plain.stdout
    for bad, why in ((tmp_path / "missing.py", "no such file"), (tmp_path, "is a directory")):
        out = spectool(*args, "--prediction", bad, "def greet(name):", timeout=300)
        assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"error: --prediction {bad}: {why}"]


def test_a_requests_prediction_is_tokenized_once_for_all_its_choices(tiny):
    """A 5 MB prediction at n 8 took 15.8 s against 2.3 s at n 1 (issue 58): the prediction is tokenized once
    for the request, and every choice drafts from the same tokens."""
    from spectool.server.requests import parse
    from spectool.session import Options, open_session

    o = Options(model=str(tiny["target"]), ctx_size=512, threads=2)
    prediction = "def greet(name):\n    print('hello', name)\n" * 50
    with open_session(o) as s:
        target, calls = s.target, []
        tokenize = target.tokenize

        def counting(text, *args, **kwargs):
            calls.append(text == prediction)
            return tokenize(text, *args, **kwargs)

        target.tokenize = counting
        try:
            asked = parse({"prompt": PROMPT, "n": 8, "max_tokens": 4, "prediction": {"type": "content",
                                                                                    "content": prediction}},
                          False, s, o)
        finally:
            del target.tokenize
    assert len(asked.gens) == 8 and sum(calls) == 1
    assert len({id(g.drafter.prediction) for g in asked.gens}) == 1


def test_beside_one_source_s_chain_the_other_offers_its_token():
    """Draft trees (issue 59): where prompt lookup outmatches the prediction and drafts, the prediction's own token
    at each depth where it differs is a sibling (share 1/2, one follower seen once), as far as the chain keeps the
    prediction's place; where the prediction drafts, lookup's other followers are."""
    from spectool.core.protocol import Branch
    from spectool.core.verify import Sampling

    def drafted(history, seen):
        d = PredictionDrafter([1, 2, 3, 4, 5, 6, 7], PromptLookup(1, 8))
        d.start(history[:seen])
        list(d.peek(history, 4))
        draft = d.propose(history, 4, Sampling(), None)
        return draft, d.branches(history, draft.tokens, 4)

    # "70 80 90 1 2 3" was followed by 60 before: lookup's longer match drafts; after 60 the place is lost
    draft, siblings = drafted([50, 70, 80, 90, 1, 2, 3, 60, 70, 80, 90, 1, 2, 3], 1)
    assert (draft.source, draft.tokens, siblings) == (Source.lookup, [60, 70, 80, 90],
                                                      [Branch(0, 4, 0.5, Source.prediction)])
    # "1 2 3" was followed by 9 before, as long a match as the prediction's place: the prediction drafts
    draft, siblings = drafted([50, 1, 2, 3, 9, 8, 1, 2, 3], 1)
    assert (draft.source, draft.tokens[:3], siblings) == (Source.prediction, [4, 5, 6],
                                                      [Branch(0, 9, 0.5, Source.lookup)])


def test_trees_beside_a_prediction_keep_the_output_the_targets(tiny, target, plain):
    """With draft trees on (a target with a sequence for each leaf), every prediction's output is still plain
    greedy decoding's, and steps verified siblings beside the chains of both sources."""
    from spectool.core.costs import Costs
    from spectool.llama.parallel import ParallelModel

    free = Costs(unmeasured=1.0, jump_prior=0.0, slope_prior=0.0)  # every row free: each offered sibling pays
    with ParallelModel(tiny["target"], n_ctx=4 * 512, n_threads=2, n_seq_max=8, kv_unified=True) as trees:
        sources, taken = set(), 0
        for name, q in predictions(plain).items():
            g = GenerationConfig(trees, for_generation(PromptLookup(), False, prediction=q), max_tokens=N,
                                 controller=Controller(k_max=4, costs=free, timed=False), draft_tree=6)
            st = Stats()
            steps = list(speculative_generate(g, trees.tokenize(PROMPT), st))
            assert [t for s in steps for t in s.tokens] == plain, name
            sources |= {s.source for s in steps if s.branches}
            taken += st.tree_taken
        assert sources == {Source.prediction, Source.lookup} and taken > 0
