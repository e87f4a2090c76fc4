"""Fill-in-the-middle (/infill as the editors send it, `suffix` through the official `openai` client), /tokenize and
/detokenize, and `n` choices: a real `spectool serve` process on generated tiny models."""

import json

import openai
import pytest
from spectool_lab.helpers import Server

# llama.vscode's autocomplete request (src/llama-server.ts, createRequestPayload): its fields and defaults
PREFIX = "def add(a, b):\n    return a + b\n\ndef greet(name):\n"
SUFFIX = "\n    return name\n\nfor i in range(10):\n    total = add(total, i)\n"


def vscode_request(prefix=PREFIX, suffix=SUFFIX, chunks=(), prompt="    print(", n_predict=16, **more) -> dict:
    return {"input_prefix": prefix, "input_suffix": suffix, "input_extra": list(chunks), "prompt": prompt,
            "n_predict": n_predict, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, **more}


def chunk(text, filename="util.py"):  # llama.vscode's extra-context chunk
    return {"text": text, "time": 1733000000, "filename": filename}


@pytest.fixture(scope="module")
def fim(fim_path):
    # -c 1024 less a batch (512) and twice -n: 384 tokens of extra context; a fixed draft length, so that what
    # prompt lookup drafts depends on the tokens only, not on this machine's measured costs
    s = Server(fim_path, "-n", "64", "--draft-max", "8", "--draft-min", "8")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def plain(tiny):
    """The default tiny model: no FIM tokens in its vocabulary."""
    s = Server(tiny["target"])
    yield s
    s.stop()


def post(server, path, body):
    status, text = server.request("POST", path, body)
    return status, json.loads(text)


def stream(server, path, body) -> list[dict]:
    """The `data:` objects of a streamed answer (llama-server's /infill sends no [DONE])."""
    status, text = server.request("POST", path, {**body, "stream": True})
    assert status == 200
    lines = [line for line in text.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines) and "[DONE]" not in text
    return [json.loads(line[6:]) for line in lines]


def n_tokens(server, text) -> int:
    return len(post(server, "/tokenize", {"content": text})[1]["tokens"])


def test_infill_as_llama_vscode_sends_it_streamed_and_not(fim):
    status, r = post(fim, "/infill", vscode_request(chunks=[chunk("def sub(a, b):\n    return a - b\n")]))
    assert status == 200 and r["stop"] is True and r["content"] and r["tokens_predicted"] == 16
    assert r["stop_type"] == "limit" and r["timings"]["predicted_n"] == 16
    assert r["tokens_evaluated"] > n_tokens(fim, PREFIX) + n_tokens(fim, SUFFIX)  # both are in the prompt
    events = stream(fim, "/infill", vscode_request(chunks=[chunk("def sub(a, b):\n    return a - b\n")]))
    *pieces, last = events
    assert len(pieces) > 1 and all(e["stop"] is False for e in pieces)
    assert "".join(e["content"] for e in pieces) == r["content"]  # greedy: the same text, in pieces
    assert last["stop"] is True and last["tokens_predicted"] == 16 and last["content"] == ""
    assert last["timings"]["cache_n"] > 0  # the same prompt again: from the KV cache


@pytest.fixture(scope="module")
def fim_parallel(fim_path):
    """The FIM server with two slots (--parallel 2), each sequence the one-sequence server's 1024 tokens."""
    s = Server(fim_path, "-n", "64", "--draft-max", "8", "--draft-min", "8", "-c", "2048", "--parallel", "2")
    yield s
    s.stop()


@pytest.mark.parametrize("server", ["fim", "fim_parallel"])
def test_the_editors_warm_up_request_fills_the_cache(server, request):
    """llama.vscode sends n_predict 0 with the new extra context so the next completion finds it cached; with
    --parallel, in the slot the completion then takes (the one holding its prefix)."""
    fim = request.getfixturevalue(server)
    extra = [chunk("class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n", "point.py")]
    post(fim, "/infill", vscode_request(chunks=[chunk("x = 1\n")]))  # something else in the cache first
    status, r = post(fim, "/infill", vscode_request(prefix="", suffix="", prompt="", chunks=extra, n_predict=0,
                                                    samplers=[]))
    assert status == 200 and r["content"] == "" and r["tokens_predicted"] == 0
    status, r = post(fim, "/infill", vscode_request(chunks=extra))
    assert status == 200 and r["timings"]["cache_n"] >= n_tokens(fim, extra[0]["text"])


def test_prompt_lookup_drafts_from_the_suffix_and_the_extra_context(fim):
    """The tiny FIM model writes the same text after any prompt (tinymodels.write_fim_model): that text put in the
    suffix or in input_extra is echoed, and prompt lookup drafts it from there."""
    body = vscode_request(prefix="def greet(name):\n", suffix="\n    return name\n", prompt="", n_predict=32)
    base = post(fim, "/infill", body)[1]
    echoed = base["content"]
    in_suffix = post(fim, "/infill", {**body, "input_suffix": echoed + body["input_suffix"]})[1]
    in_extra = post(fim, "/infill", {**body, "input_extra": [chunk(echoed)]})[1]
    for r in (in_suffix, in_extra):
        assert r["content"] == echoed
        assert r["timings"]["draft_n_accepted"] > base["timings"]["draft_n_accepted"]


def test_suffix_through_the_openai_client_is_the_infill_of_prompt_and_suffix(fim):
    c = fim.client()
    r = c.completions.create(model="any", prompt=PREFIX, suffix=SUFFIX, max_tokens=16)
    infill = post(fim, "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 16})[1]
    assert r.choices[0].text == infill["content"] and r.usage.completion_tokens == 16
    assert r.usage.prompt_tokens == infill["tokens_evaluated"]
    joined = "".join(ch.choices[0].text for ch in c.completions.create(model="any", prompt=PREFIX, suffix=SUFFIX,
                                                                         max_tokens=16, stream=True))
    assert joined == r.choices[0].text
    plain = c.completions.create(model="any", prompt=PREFIX, max_tokens=16)  # no suffix: a plain completion
    assert plain.usage.prompt_tokens < r.usage.prompt_tokens


def test_a_long_prefix_keeps_its_end_as_llama_server_truncates(fim):
    """The prefix keeps its last 3/4 of a batch (at -c 1024, half the context: 384 tokens), the suffix its first
    quarter less two (126), and the repo-level header and the BOS, FIM_PRE, FIM_SUF and FIM_MID tokens come on
    top."""
    long_prefix = "total = add(total, i)\n" * 200
    status, r = post(fim, "/infill", {"input_prefix": long_prefix, "input_suffix": SUFFIX * 20, "n_predict": 4})
    assert status == 200 and n_tokens(fim, long_prefix) > 1000
    header = n_tokens(fim, "<|repo_name|>myproject\n<|file_sep|>filename\n")
    assert r["tokens_evaluated"] == 384 + 126 + 4 + header


OK = {"input_prefix": "int main() {\n", "input_suffix": "}\n"}


@pytest.mark.parametrize("body, param", [
    ({"input_suffix": "}\n"}, "input_prefix"),
    ({"input_prefix": "int main() {\n"}, "input_suffix"),
    ({**OK, "input_suffix": ["}"]}, "input_suffix"),
    ({**OK, "input_extra": [{}]}, "input_extra"),  # llama-server's test_invalid_input_extra_req cases
    ({**OK, "input_extra": [{"filename": "ok"}]}, "input_extra"),
    ({**OK, "input_extra": [{"filename": 123, "text": "abc"}]}, "input_extra"),
    ({**OK, "input_extra": [{"filename": 123, "text": 456}]}, "input_extra"),
    ({**OK, "input_extra": {"text": "abc"}}, "input_extra"),
    ({**OK, "prompt": 5}, "prompt"),
    ({**OK, "n_predict": "16"}, "n_predict"),
    ({**OK, "n": 2}, "n"),
    ({**OK, "temperature": -1}, "temperature"),
])
def test_bad_infill_requests_are_400s_naming_the_field(fim, body, param):
    status, r = post(fim, "/infill", body)
    assert status == 400 and r["error"]["param"] == param
    assert post(fim, "/infill", {**OK, "n_predict": 2})[0] == 200  # and the next is served


def test_fim_on_a_model_without_fim_tokens_is_a_400(plain):
    status, r = post(plain, "/infill", {"input_prefix": "def f():\n", "input_suffix": "\n"})
    assert status == 400 and r["error"]["param"] == "input_suffix" and "FIM_PRE" in r["error"]["message"]
    c = plain.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="any", prompt="def f():\n", suffix="\n", max_tokens=4)
    assert e.value.body["param"] == "suffix"
    with pytest.raises(openai.BadRequestError) as e:  # a chat completion has no suffix, as OpenAI's has none
        c.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                  extra_body={"suffix": "\n"})
    assert e.value.body["param"] == "suffix"
    assert c.completions.create(model="any", prompt="def f():\n", max_tokens=4).choices[0].text  # served after


# -- /tokenize and /detokenize ------------------------------------------------------------------------------------
def test_tokenize_and_detokenize_round_trip_as_llama_cpp_tokenizes(fim, fim_path):
    import llama_cpp

    vocab = llama_cpp.Llama(str(fim_path), vocab_only=True, verbose=False)
    content = "This is a test string with unicode 媽 and emoji 🤗 <|fim_prefix|>"
    tokens = post(fim, "/tokenize", {"content": content})[1]["tokens"]
    assert tokens == vocab.tokenize(content.encode(), add_bos=False, special=True)
    assert tokens[-1] == vocab.tokenize(b"<|fim_prefix|>", add_bos=False, special=True)[0]  # read as the token
    assert post(fim, "/tokenize", {"content": content, "parse_special": False})[1]["tokens"] == vocab.tokenize(
        content.encode(), add_bos=False, special=False)
    with_bos = post(fim, "/tokenize", {"content": content, "add_special": True})[1]["tokens"]
    assert with_bos == [vocab.token_bos(), *tokens]
    assert post(fim, "/detokenize", {"tokens": tokens})[1]["content"] == content
    assert vocab.detokenize(tokens, special=True).decode() == content
    pieces = post(fim, "/tokenize", {"content": content, "with_pieces": True})[1]["tokens"]
    assert [p["id"] for p in pieces] == tokens
    as_bytes = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert as_bytes.decode() == content and any(isinstance(p["piece"], list) for p in pieces)  # emoji: bytes
    mixed = post(fim, "/tokenize", {"content": ["def", tokens[-1], " add"], "add_special": True})[1]["tokens"]
    assert mixed[0] == vocab.token_bos() and mixed[-2] == tokens[-1]


def test_bad_tokenize_and_detokenize_bodies_are_400s(fim):
    for path, body, param in (("/detokenize", {"tokens": [1, -3]}, "tokens"),
                              ("/detokenize", {"tokens": "ab"}, "tokens"),
                              ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
                              ("/tokenize", {"content": 5}, "content"),
                              ("/tokenize", {"content": "a", "with_pieces": "yes"}, "with_pieces")):
        status, r = post(fim, path, body)
        assert status == 400 and r["error"]["param"] == param
    assert post(fim, "/detokenize", {"tokens": []})[1] == {"content": ""}


# -- n ----------------------------------------------------------------------------------------------------------
def test_n_greedy_choices_are_identical_and_usage_sums_them(plain):
    c = plain.client()
    one = c.completions.create(model="any", prompt="The quick brown fox", max_tokens=12)
    three = c.completions.create(model="any", prompt="The quick brown fox", max_tokens=12, n=3)
    assert [ch.index for ch in three.choices] == [0, 1, 2]
    assert [ch.text for ch in three.choices] == [one.choices[0].text] * 3
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert three.usage.prompt_tokens == one.usage.prompt_tokens


def test_n_seeded_choices_reproduce_and_differ_each_with_its_own_seed(plain):
    """Choice i of a request with `seed` s is sampled with seed s + i: the same as n=1 with that seed."""
    c = plain.client()
    messages = [{"role": "user", "content": "Tell me about the fox."}]
    body = dict(model="any", messages=messages, max_tokens=16, temperature=1.0, seed=7)
    first = [ch.message.content for ch in c.chat.completions.create(n=3, **body).choices]
    again = [ch.message.content for ch in c.chat.completions.create(n=3, **body).choices]
    assert first == again and len(set(first)) > 1
    assert c.chat.completions.create(**{**body, "seed": 8}).choices[0].message.content == first[1]
    streamed = {}
    for ch in c.chat.completions.create(n=3, stream=True, **body):
        for choice in ch.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert [streamed[i] for i in range(3)] == first


def test_n_out_of_range_is_a_400_naming_it(plain):
    c = plain.client()
    for n in (0, 9, -1):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="any", prompt="hi", max_tokens=2, n=n)
        assert e.value.body["param"] == "n"
    status, r = post(plain, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "n": 2.5})
    assert status == 400 and r["error"]["param"] == "n"


def test_the_fim_tokens_are_read_from_the_gguf_and_their_end_tokens_end_generation(fim_path, tiny):
    """What /infill stands on: llama.cpp reads tokenizer.ggml.fim_*_token_id, and counts FIM_PAD, FIM_REP and
    FIM_SEP as end-of-generation (so a completion stops there); the default tiny model has none."""
    from spectool.llama.engine import Model

    with Model(fim_path, n_ctx=256, n_threads=2) as m:
        fim = m.fim_tokens()
        assert [m.piece(fim[k], special=True).decode() for k in ("pre", "suf", "mid", "pad", "rep", "sep")] == [
            "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
        assert [m.is_eog(fim[k]) for k in ("pre", "suf", "mid", "pad", "rep", "sep")] == [False] * 3 + [True] * 3
    with Model(tiny["target"], n_ctx=256, n_threads=2) as m:
        assert m.fim_tokens() == {}


def llama_server_indent_cut(tokens: list[str], n_indent: int) -> str:
    """The text llama-server keeps under `n_indent`: its process_token loop over these token texts, transcribed
    (tools/server/server-context.cpp of the vendored llama.cpp: last_nl_pos advances one newline a token, the
    line there checked first), with empty tokens after them so its checks catch up with the last lines."""
    generated, last_nl, has_nl = "", 0, False
    for tok in [*tokens, *[""] * (len(tokens) + 2)]:
        generated += tok
        if has_nl and n_indent > 0:
            if last_nl > 0:
                pos, n = last_nl, 0
                while pos < len(generated) and generated[pos] in " \t":
                    n, pos = n + 1, pos + 1
                if pos < len(generated) and n < n_indent:
                    return generated[:pos]
            found = generated.find("\n", last_nl)
            if found != -1:
                last_nl = found + 1
        has_nl = has_nl or "\n" in tok
    return generated


def test_n_indent_cuts_where_llama_servers_loop_cuts():
    """infill.Limits against the transcription of llama-server's loop, on random pieces of indented text
    (each piece a token, or several tokens of one speculative step, which must not change where it cuts)."""
    import random

    from spectool.server.infill import Limits

    rng = random.Random(11)
    parts = [" ", "  ", "\t", "\n", "\n    ", "\n  ", "a", "b(", "x\n", "    y", "\n\n"]
    cut_somewhere = 0
    for _ in range(400):
        tokens = [rng.choice(parts) for _ in range(rng.randrange(1, 14))]
        n_indent = rng.randrange(1, 5)
        want = llama_server_indent_cut(tokens, n_indent)
        steps, i = [], 0
        while i < len(tokens):  # the tokens a step at a time, 1 to 3 a step
            k = rng.randrange(1, 4)
            steps.append("".join(tokens[i:i + k]))
            i += k
        limits = Limits(n_indent=n_indent)
        got = "".join(limits.cut(piece) for piece in steps)
        assert got == want, (tokens, n_indent)
        assert limits.reached == (want != "".join(tokens))
        cut_somewhere += limits.reached
    assert cut_somewhere > 100  # the random texts exercise the cut, not only the pass-through


def test_infill_n_indent_and_t_max_predict_ms_end_the_answer(fim):
    """The editors' limits on /infill, through the server: a grammar writes indented lines (greedy: the same text
    each time); n_indent 4 ends the answer before the first line indented less (its indentation kept), streamed
    or not, with stop_type "limit"; t_max_predict_ms ends it after a newline once the time is up; neither set
    (or 0) leaves it whole. A bad value is a 400 naming the field."""
    grammar = 'root ::= "a" ("\\n    b" [0-9]){3} "\\n  c\\n" ("x\\n"){12}'
    ask = vscode_request(prompt="", n_predict=64, grammar=grammar, n_indent=0, t_max_predict_ms=0)
    status, whole = post(fim, "/infill", ask)
    assert status == 200 and whole["content"].startswith("a\n    b") and whole["stop_type"] == "eos"
    text = whole["content"]
    status, r = post(fim, "/infill", {**ask, "n_indent": 4})
    assert status == 200 and r["stop_type"] == "limit"
    assert r["content"] == text[:text.index("\n  c") + 3] and r["content"].endswith("\n  ")
    assert r["tokens_predicted"] < whole["tokens_predicted"]
    *pieces, last = stream(fim, "/infill", {**ask, "n_indent": 4})
    assert "".join(e["content"] for e in pieces) == r["content"] and last["stop_type"] == "limit"
    status, r = post(fim, "/infill", {**ask, "n_indent": 2})  # every line indented 2 or more, until the x lines
    assert r["content"] == text[:text.index("\nx") + 1] and r["stop_type"] == "limit"
    status, r = post(fim, "/infill", {**ask, "t_max_predict_ms": 1})
    assert r["stop_type"] == "limit" and r["content"].endswith("\n") and text.startswith(r["content"])
    assert len(r["content"]) < len(text)
    for name, value in (("n_indent", -1), ("n_indent", "4"), ("n_indent", 2**31), ("t_max_predict_ms", -2),
                        ("t_max_predict_ms", 1.5), ("t_max_predict_ms", 10**309)):  # (past a float's range)
        status, r = post(fim, "/infill", {**ask, name: value})
        assert status == 400 and r["error"]["param"] == name, (name, value, r)
