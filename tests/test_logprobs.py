"""Log-probabilities (issue 34): each emitted token's log-probability and its top alternatives under the target's
raw distribution (the log-softmax of its logits), read from the verification rows, accepted drafts included. They
must be plain decoding's (`--spec none`) and llama.cpp's own (llama-cpp-python's Llama with logits_all, the same
tokens teacher-forced), within TOL; through `spectool serve` with the official `openai` client, chat and
completions, streamed and not, greedy and seeded; and a streamed piece carries the tokens of its own text."""

import codecs
import json

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from spectool_lab.helpers import Server  # noqa: E402
from test_verify import llama_cpp_draws  # noqa: E402

from spectool.core.controller import Controller  # noqa: E402
from spectool.core.grammar import Grammar  # noqa: E402
from spectool.drafters.builder import for_generation  # noqa: E402
from spectool.generate.loop import GenerationConfig, speculative_generate  # noqa: E402
from spectool.core.verify import Sampling  # noqa: E402
from spectool.drafters.lookup import PromptLookup  # noqa: E402
from spectool.llama.engine import Model  # noqa: E402
from spectool.llama.outputs import IDS, ROWS  # noqa: E402

# llama.cpp's logits for one position differ between a batch of k + 1 tokens and a batch of one (and the oracle's
# one batch of the whole text) by float32 summation order: up to a few 1e-4 nats on these models with flash
# attention off (1.5e-4 measured over this module, 2026-12-07), as every test here runs (the servers pinned off: see
# `servers`). With flash attention, whose kernel sums over the cache in a batch-dependent order, they reached
# 5.1e-3 over the chat prompt (TOL_FLASH: for a server left at --flash-attn auto, which may choose either kernel, as
# test_serve_apis.py's is). A token read from a neighbouring row is off by ~1 nat.
TOL, TOL_FLASH = 1e-3, 1e-2
REPEAT = "the dog the fox the dog the fox the dog the fox the"  # prompt lookup's drafts get accepted on it
SEEDED = Sampling(temp=0.7, top_k=20)
N_TOP = 5


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


class Oracle:
    """llama.cpp itself through llama-cpp-python: the log-softmax rows of every output position, the whole text
    decoded at once (logits_all)."""

    def __init__(self, path, flash_attn: bool):
        import llama_cpp

        self.llm = llama_cpp.Llama(str(path), n_ctx=1024, n_threads=2, logits_all=True, verbose=False,
                                   flash_attn=flash_attn)

    def rows(self, prompt: list[int], out: list[int]) -> np.ndarray:
        """Row i: the distribution that chose out[i]."""
        self.llm.reset()
        self.llm.eval(prompt + out)
        return log_softmax(np.array(self.llm.scores[len(prompt) - 1 : len(prompt) - 1 + len(out)]))


def assert_oracle(rows: np.ndarray, out: list[int], chosen: list[float], top: list[list[tuple[int, float]]],
                  tol: float = TOL):
    """Each token's logprob is its row's, each listed alternative's too, and they are the row's best (to TOL)."""
    assert len(chosen) == len(out) == len(top) and len(out) > 1
    got = np.array(chosen)
    assert np.abs(rows[np.arange(len(out)), out] - got).max() < tol
    shifted = rows[np.arange(1, len(out)), out[1:]] - got[:-1]  # the same check one row off would fail
    assert np.abs(shifted).max() > 50 * tol
    for row, alternatives in zip(rows, top):
        assert len(alternatives) == N_TOP
        values = [lp for _, lp in alternatives]
        assert values == sorted(values, reverse=True)
        assert all(abs(row[t] - lp) < tol for t, lp in alternatives)
        assert min(values) > np.sort(row)[-N_TOP] - tol  # no better token left out


def steps_of(g: GenerationConfig, prompt: list[int]):
    steps = list(speculative_generate(g, prompt))
    out = [t for s in steps for t in s.tokens]
    lps = [lp for s in steps for lp in s.logprobs]
    return out, lps, sum(s.accepted for s in steps)


@pytest.fixture(scope="module")
def exact_target(tiny):
    with Model(tiny["target"], n_ctx=1024, n_threads=2, flash_attn=False) as m:
        yield m


@pytest.fixture(scope="module")
def oracle(tiny):
    return Oracle(tiny["target"], flash_attn=False)


@pytest.mark.parametrize("sampling, seed", [(Sampling(), None), (SEEDED, 3)], ids=["greedy", "seeded"])
def test_logprobs_under_lookup_are_plain_decodings_and_llama_cpps(exact_target, oracle, sampling, seed):
    prompt = exact_target.tokenize(REPEAT)
    runs = {}
    for name, drafter in (("lookup", PromptLookup()), ("none", None)):
        g = GenerationConfig(exact_target, drafter, sampling=sampling, seed=seed, max_tokens=60, logprobs=N_TOP,
                       controller=Controller(k_max=4, adaptive=False))
        runs[name] = out, lps, accepted = steps_of(g, prompt)
        assert len(lps) == len(out) == 60
        assert_oracle(oracle.rows(prompt, out), out, [lp.logprob for lp in lps], [lp.top for lp in lps])
    (spec, spec_lps, accepted), (plain, plain_lps, _) = runs["lookup"], runs["none"]
    assert accepted > 0  # accepted drafts are among the tokens checked
    assert spec == plain  # seeded too: a lookup draft is kept where the target's own draw is the same
    assert all(abs(a.logprob - b.logprob) < TOL for a, b in zip(spec_lps, plain_lps))
    if seed is not None:  # and that draw is llama.cpp's own for the seed, on llama.cpp's rows
        assert llama_cpp_draws(oracle.rows(prompt, plain), sampling, seed) == plain


def test_logprobs_under_a_grammar_are_the_raw_rows(exact_target, oracle):
    """Under a grammar the reported distribution is the raw, unmasked one (as llama-server's): the tokens follow
    the grammar, their logprobs are the row's before the mask."""
    prompt = exact_target.tokenize("The quick brown fox")
    g = GenerationConfig(exact_target, for_generation(PromptLookup(), grammar=True), max_tokens=24, logprobs=N_TOP, grammar=Grammar.gbnf(
        'root ::= ("yes" | "no" | " " | "the" | "fox" | "dog")+'))
    out, lps, _ = steps_of(g, prompt)
    assert_oracle(oracle.rows(prompt, out), out, [lp.logprob for lp in lps], [lp.top for lp in lps])
    assert any(lp.top[0][0] != t for lp, t in zip(lps, out))  # the mask chose other than the raw row's best


def test_rows_are_read_only_for_a_generation_that_asks(tiny, exact_target):
    """Where llama.cpp samples in its graph, a generation without logprobs keeps its ids there (IDS: no row comes
    to the host); one with logprobs reads rows, with the same numbers as the host's."""
    prompt = exact_target.tokenize(REPEAT)
    with Model(tiny["target"], n_ctx=1024, n_threads=2, flash_attn=False, graph_sampling=True) as m:
        plain = [t for s in speculative_generate(GenerationConfig(m, PromptLookup(), max_tokens=20), prompt)
                 for t in s.tokens]
        assert m.output is IDS
        out, lps, _ = steps_of(GenerationConfig(m, PromptLookup(), max_tokens=20, logprobs=2), prompt)
        assert m.output is ROWS and out == plain
    host, host_lps, _ = steps_of(GenerationConfig(exact_target, None, max_tokens=20, logprobs=2), prompt)
    assert host == out and all(abs(a.logprob - b.logprob) < TOL for a, b in zip(lps, host_lps))


# -- through the server -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers(tiny):
    """The same model served with prompt lookup drafting 4 tokens every step, and with --spec none, both with flash
    attention off as the oracle: under `--flash-attn auto` the server times both kernels (spectool/attention.py),
    and on the tiny model their times are close enough for a run to choose either (CI, 2026-12-07, chose flash
    attention, and a row's logprobs moved by 5.1e-3 with the batch)."""
    made = {"lookup": Server(tiny["target"], "--draft-min", "4", "--draft-max", "4", "--flash-attn", "off"),
            "none": Server(tiny["target"], "--spec", "none", "--flash-attn", "off")}
    yield made
    for s in made.values():
        s.stop()


# greedy, with drafts accepted under lookup (a tiny model's text repeats itself after a while)
CHAT = {"messages": [{"role": "user", "content": "def add(a, b):\n    return a + b\n\ndef greet(name):"}],
        "logprobs": True, "top_logprobs": N_TOP}
COMPLETION = {"prompt": "The quick brown fox", "logprobs": N_TOP}


def ask(server, chat: bool, stream: bool, **fields):
    """(text, [(id or token text, logprob, {alternative: logprob}, bytes, text offset)], accepted drafts, the
    streamed pieces as (text, their tokens' records)) of a request through the openai client (chat: token ids,
    llama-server's `id`; completions: token texts and their text_offset)."""
    c = server.client()
    body = {**(CHAT if chat else COMPLETION), "max_tokens": 60, **fields}
    make = c.chat.completions.create if chat else c.completions.create
    r = make(model="tiny", stream=stream, **({"stream_options": {"include_usage": True}} if stream else {}), **body)
    choices = [(ch.choices[0] if ch.choices else None, ch.usage) for ch in r] if stream else [(r.choices[0], r.usage)]
    text, records, pieces, usage = "", [], [], None
    for choice, usage_ in choices:
        usage = usage_ or usage
        if choice is None:
            continue
        piece = (choice.delta.content or "") if chat and stream else choice.message.content if chat else choice.text
        lp = choice.logprobs
        if chat and lp is not None:
            got = [(e.model_extra["id"], e.logprob, {a.model_extra["id"]: a.logprob for a in e.top_logprobs},
                    bytes(e.bytes), None) for e in lp.content]
        elif lp is not None:
            got = [(t, v, top, t.encode(), at) for t, v, top, at in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs,
                                                                         lp.text_offset)]
            # the N best and the chosen token; tokens of the same text (parts of a character) share one key
            assert all(len(top) <= N_TOP + 1 and top[t] == v for t, v, top, _, _ in got)
        else:
            got = []
        text += piece or ""
        records += got
        pieces.append((piece or "", got))
    return text, records, usage.model_extra["speculative"]["accepted"], pieces


def same_records(a, b):
    assert [r[0] for r in a] == [r[0] for r in b] and a
    for (_, lp_a, top_a, *_), (_, lp_b, top_b, *_) in zip(a, b):
        assert abs(lp_a - lp_b) < TOL
        assert all(abs(v - top_b[k]) < TOL for k, v in top_a.items() if k in top_b)
        assert all(v < min(top_b.values()) + TOL for k, v in top_a.items() if k not in top_b)  # a near tie


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_served_logprobs_equal_spec_none_streamed_and_not(servers, chat):
    """Greedy: the same tokens with the same logprobs from the lookup server (drafts accepted) and from --spec none,
    streamed and not; the streamed records are the whole response's."""
    answers = {(name, stream): ask(s, chat, stream, temperature=0) for name, s in servers.items()
               for stream in (False, True)}
    assert answers[("lookup", False)][2] > 0
    whole = answers[("none", False)]
    for key, (text, records, _, _) in answers.items():
        assert text == whole[0], key
        same_records(records, whole[1])


def test_seeded_chat_logprobs_are_llama_cpps_and_spec_nones(tiny, servers, oracle):
    """Seeded sampling: each server's tokens, teacher-forced through llama.cpp, have the logprobs it reported (the
    two servers draw differently, so their texts part; up to there their logprobs agree)."""
    from spectool.templates import prompt_tokens

    with Model(tiny["target"], n_ctx=1024, n_threads=2) as m:
        prompt = prompt_tokens(m, CHAT["messages"])
    got = {}
    for name, s in servers.items():
        for stream in (False, True):
            text, records, accepted, _ = ask(s, True, stream, temperature=0.7, seed=5, extra_body={"top_k": 20})
            out = [r[0] for r in records]
            rows = oracle.rows(prompt, out)  # (flash attention off, as the servers run)
            assert_oracle(rows, out, [r[1] for r in records], [list(r[2].items()) for r in records], TOL)
            if stream:
                assert got[name][0] == text and [r[0] for r in got[name][1]] == out  # streamed or not
            got[name] = (text, records)
    spec, plain = got["lookup"][1], got["none"][1]
    same = next((i for i, (a, b) in enumerate(zip(spec, plain)) if a[0] != b[0]), len(spec))
    assert same > 0
    same_records(spec[:same], plain[:same])


def test_streamed_pieces_carry_their_own_tokens(servers):
    """Chat: the bytes of the tokens sent so far decode (an unfinished last character held back) to the text sent
    so far, at every piece, through the tiny model's many broken characters. Completions: each token's
    text_offset lies in the text sent up to its piece (a token may begin in the piece before its own)."""
    text, _, _, pieces = ask(servers["lookup"], True, True, temperature=0)
    assert "\n" not in text  # so no start of the chat's fallback stop strings ("\nUser:") is held back
    sent, tokens = "", b""
    for piece, records in pieces:
        sent += piece
        tokens += b"".join(r[3] for r in records)
        assert codecs.getincrementaldecoder("utf-8")(errors="replace").decode(tokens) == sent
    assert sum(1 for _, records in pieces if records) > 10 and "\ufffd" in sent
    _, _, _, pieces = ask(servers["lookup"], False, True, temperature=0)
    sent = ""
    for piece, records in pieces:
        sent += piece
        assert all(r[4] < len(sent) for r in records), (sent, records)


def test_tokens_that_only_made_a_stop_string_are_not_reported(servers):
    text, records, _, _ = ask(servers["lookup"], False, False, temperature=0)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    for stream in (False, True):
        cut, kept, _, _ = ask(servers["lookup"], False, stream, temperature=0, stop=[stop])
        assert cut == text[: text.index(stop)] and kept == records[: len(kept)]
        assert all(r[4] < len(cut) for r in kept) and records[len(kept)][4] >= len(cut)  # each kept token made
        # some of the text; the first one left out, none


BAD = [  # (endpoint, fields, the field the 400 names)
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2.5}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": "3"}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 0}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"logprobs": 1.5}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"top_logprobs": 2}, "top_logprobs"),
]


@pytest.mark.parametrize("path, fields, param", BAD)
def test_bad_logprobs_fields_are_400s_naming_the_field(servers, path, fields, param):
    s = servers["lookup"]
    body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    status, text = s.request("POST", path, {**body, "max_tokens": 4, **fields})
    assert status == 400 and json.loads(text)["error"]["param"] == param, text
    status, text = s.request("POST", path, {**body, "max_tokens": 4})
    assert status == 200 and json.loads(text)["choices"][0]["logprobs"] is None


def test_logprobs_counts(servers):
    """top_logprobs 0 and 20, logprobs 0: as many alternatives as asked (completions: and the chosen token)."""
    c = servers["lookup"].client()
    for n in (0, 20):
        r = c.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=6, logprobs=True,
                                      top_logprobs=n)
        assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
        assert all(len(e.top_logprobs) == n for e in r.choices[0].logprobs.content)
    r = c.completions.create(model="tiny", prompt=REPEAT, max_tokens=6, logprobs=0)
    lp = r.choices[0].logprobs
    assert [list(d) for d in lp.top_logprobs] == [[t] for t in lp.tokens]
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_each_of_n_choices_carries_its_own_tokens_logprobs(servers, stream):
    """`n` seeded choices (choice i with seed + i): each choice's records are what a request of n 1 with its seed
    reports, whole or streamed chunk by chunk under its own index, so no choice's tokens land in another's."""
    alone = [ask(servers["lookup"], True, False, temperature=0.7, seed=5 + i, extra_body={"top_k": 20})
             for i in range(2)]
    assert alone[0][0] != alone[1][0]
    c = servers["lookup"].client()
    r = c.chat.completions.create(model="tiny", n=2, stream=stream, temperature=0.7, seed=5, max_tokens=60,
                                  extra_body={"top_k": 20}, **{k: v for k, v in CHAT.items()})
    got = [[], []]
    for chunk in (r if stream else [r]):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                got[choice.index] += [(e.model_extra["id"], e.logprob) for e in choice.logprobs.content]
    for i in range(2):
        want = [(rec[0], rec[1]) for rec in alone[i][1]]
        assert [t for t, _ in got[i]] == [t for t, _ in want]
        assert all(abs(a - b) < TOL for (_, a), (_, b) in zip(got[i], want))
