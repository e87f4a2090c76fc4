"""`spectool serve` as a real server process on 127.0.0.1, with the official `openai` client as the client."""

import json
import threading
import time

import openai
import pytest
from spectool_lab.helpers import Server, other_addresses, refuses, spectool


@pytest.fixture(scope="module")
def server(tiny):
    s = Server(tiny["target"])
    yield s
    s.stop()


def test_models_chat_and_completions_through_the_openai_client(server):
    c = server.client()
    ids = [m.id for m in c.models.list().data]
    assert ids == [server_model_id(server)]
    messages = [{"role": "user", "content": "Say something about foxes."}]
    r = c.chat.completions.create(model=ids[0], messages=messages, max_tokens=24)
    text = r.choices[0].message.content
    assert text and r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    spec = r.usage.model_extra["speculative"]
    assert {"drafted", "accepted", "acceptance_rate", "tokens_per_second"} <= set(spec) and spec["mode"] == "lookup"
    stream = c.chat.completions.create(model=ids[0], messages=messages, max_tokens=24, stream=True)
    pieces = [ch.choices[0].delta.content or "" for ch in stream if ch.choices]
    assert "".join(pieces) == text and len([p for p in pieces if p]) > 1  # greedy: the same text, in pieces
    r = c.completions.create(model=ids[0], prompt="The quick brown fox", max_tokens=16)
    assert r.choices[0].text and r.choices[0].finish_reason in ("length", "stop")
    joined = "".join(ch.choices[0].text for ch in c.completions.create(
        model=ids[0], prompt="The quick brown fox", max_tokens=16, stream=True))
    assert joined == r.choices[0].text


def server_model_id(server):
    return json.loads(server.request("GET", "/v1/models")[1])["data"][0]["id"]


def test_a_resent_conversation_prefills_only_what_is_new(server):
    """Agents resend the whole conversation each turn: the KV cache keeps the longest common prefix."""
    c, model = server.client(), server_model_id(server)
    messages = [{"role": "system", "content": "You answer briefly. " * 20},
                {"role": "user", "content": "Name a colour."}]
    first = c.chat.completions.create(model=model, messages=messages, max_tokens=8)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Another one?"}]
    second = c.chat.completions.create(model=model, messages=messages, max_tokens=8)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1 and cached < second.usage.prompt_tokens


def test_a_greedy_completion_equals_spectool_run(server, tiny):
    prompt = "the dog the fox the dog the fox the"
    r = server.client().completions.create(model=server_model_id(server), prompt=prompt, max_tokens=30,
                                           temperature=0)
    out = spectool("run", "-m", tiny["target"], "-c", "1024", "-t", "2", "-n", "30", "-q", prompt, timeout=300)
    text = r.choices[0].text
    assert out.returncode == 0 and out.stdout in (text, text + "\n")  # run ends its output with a newline


def test_four_concurrent_clients_are_all_answered(server):
    answers = [None] * 4

    def ask(i):
        answers[i] = server.client().completions.create(model=server_model_id(server), prompt=f"Story {i}:",
                                                         max_tokens=12).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(a for a in answers)


def test_a_client_that_leaves_mid_stream_stops_its_generation(tiny):
    s = Server(tiny["target"], "--spec", "none", "-c", "4096")
    try:
        # greedy, this prompt loops without an end-of-generation token: 4000 tokens would take about 6 s
        conn, r = _stream(s.port, {"prompt": "the dog the fox the dog the fox the dog the", "max_tokens": 4000})
        assert r.status == 200 and r.readline().startswith(b"data: ")
        conn.close()  # one piece, then hang up
        deadline = time.time() + 60
        while s.metric("requests_cancelled_total") == 0 and time.time() < deadline:
            time.sleep(0.1)
        assert s.metric("requests_cancelled_total") == 1
        assert s.metric("completion_tokens_total") < 4000  # stopped well short of the budget
    finally:
        s.stop()


def test_errors_are_openai_shaped_with_the_right_status(server):
    for method, path, body, raw, status, code in [
        ("POST", "/v1/completions", None, b"{not json", 400, "invalid_json"),
        ("POST", "/v1/completions", {"max_tokens": 4}, None, 400, "invalid_prompt"),
        ("POST", "/v1/chat/completions", {"messages": []}, None, 400, "invalid_messages"),
        ("POST", "/v1/completions", {"prompt": "word " * 2000}, None, 400, "context_length_exceeded"),
        ("POST", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, None, 400, "invalid_temperature"),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]}]}, None, 400,
         "unsupported_content"),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 7}]}, None, 400,
         "invalid_messages"),
        ("GET", "/v1/nothing", None, None, 404, "not_found"),
    ]:
        got, text = server.request(method, path, body, raw=raw)
        err = json.loads(text)["error"]
        assert got == status and err["code"] == code and err["message"] and "Traceback" not in text, (path, text)
    _, text = server.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "x"}}]}]})
    assert "input_audio" in json.loads(text)["error"]["message"]  # the refused part is named


def test_content_parts_and_any_model_name_get_a_normal_answer(server):
    """What editors and chat UIs send: content as an array of text parts, and a model name of their own. The
    parts read as their texts joined by newlines (as llama-server joins them), so the answer equals the one to
    the same text as a string; the response names the served model."""
    c = server.client()
    served = c.models.list().data[0].id
    parts = [{"type": "text", "text": "Say something"}, {"type": "text", "text": "about foxes."}]
    a = c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": parts}], max_tokens=12,
                                  temperature=0)
    b = c.chat.completions.create(model=served, max_tokens=12, temperature=0,
                                  messages=[{"role": "user", "content": "Say something\nabout foxes."}])
    assert a.model == served and a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.content and a.usage.prompt_tokens == b.usage.prompt_tokens
    r = c.completions.create(model="made-up", prompt="The quick brown fox", max_tokens=4)
    assert r.model == served and r.choices[0].text


def test_an_api_key_is_required_when_set_and_the_default_is_loopback(tiny):
    s = Server(tiny["target"], "--api-key", "s3cret")
    try:
        assert s.request("GET", "/v1/models")[0] == 401
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert [m.id for m in s.client("s3cret").models.list().data]
        assert s.request("GET", "/health")[0] == 200
        # bound to 127.0.0.1 only: another address of this machine is refused
        assert other_addresses() and all(refuses(addr, s.port) for addr in other_addresses())
    finally:
        code, err = s.stop()
    assert code == 143 and "127.0.0.1" in err and "warning" not in err and "Traceback" not in err  # SIGTERM
    open_server = Server(tiny["target"], "--host", "0.0.0.0")
    try:
        assert open_server.request("GET", "/health")[0] == 200
        assert not any(refuses(addr, open_server.port) for addr in other_addresses())  # the check above can fail
    finally:
        code, err = open_server.stop()
    assert "warning: serving on 0.0.0.0 without --api-key" in err


def _stream(port, body):
    """A streamed completion opened on its own connection: (connection, response)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def test_a_full_queue_answers_503_and_sigterm_lets_the_stream_finish(tiny):
    s = Server(tiny["target"], "--queue", "1", "--spec", "none", "-c", "4096")  # (the last -c wins)
    try:
        # greedy, this prompt loops without an end-of-generation token: 2000 tokens take about 3 s here (plain
        # decoding), far within uvicorn's 30 s of graceful shutdown below even on a loaded machine (4000 tokens
        # once ran past it there)
        long = {"prompt": "the dog the fox the dog the fox the dog the", "max_tokens": 2000}
        conn, first = _stream(s.port, long)  # generating
        assert first.readline().startswith(b"data: ")
        waiting = threading.Thread(target=s.request, args=("POST", "/v1/completions", {"prompt": "a", "max_tokens": 4}))
        waiting.start()  # waits for its turn
        time.sleep(0.5)
        status, text = s.request("POST", "/v1/completions", {"prompt": "b", "max_tokens": 4})
        assert status == 503 and json.loads(text)["error"]["code"] == "queue_full"
        s.proc.terminate()  # SIGTERM while the first response streams: it finishes, then the server stops
        rest = b""
        while line := first.readline():  # up to the close (uvicorn ends a stream cut by shutdown without the
            rest += line                 # last empty chunk, so read lines, not the chunked body)
        rest = rest.decode()
        assert rest.rstrip().endswith("data: [DONE]") and '"finish_reason": "length"' in rest
        conn.close()
        waiting.join(timeout=60)
    finally:
        code, err = s.stop()
    assert code == 143 and "Traceback" not in err


def test_a_seeded_request_gives_the_same_text_every_time_and_on_any_server(server, tiny):
    """The same seeded, sampled request, on a server started without --seed, twice with other requests between,
    and once more on a fresh server: the same text each time. The session layer gives seeded sampling an untimed
    controller (session.generation), as it gives `spectool run --seed`, so k depends only on the tokens."""
    body = dict(prompt="the dog the fox the dog the fox the dog the", max_tokens=48, temperature=0.8, seed=1234)
    c, model = server.client(), server_model_id(server)
    first = c.completions.create(model=model, **body).choices[0].text
    c.completions.create(model=model, prompt="Once upon a time", max_tokens=24, temperature=0.8)  # unseeded
    c.completions.create(model=model, prompt="the cat the hat the cat", max_tokens=24)  # greedy
    again = c.completions.create(model=model, **body).choices[0].text
    other = c.completions.create(model=model, **{**body, "seed": 99}).choices[0].text
    s = Server(tiny["target"])
    try:
        elsewhere = s.client().completions.create(model=model, **body).choices[0].text
    finally:
        s.stop()
    assert first and first == again == elsewhere
    assert other != first  # the seed is what fixes the text


def test_fields_the_server_does_not_honour_are_refused_by_name(server):
    """`n` > 8, `top_logprobs` without `logprobs: true`, and tools in a (text) completion are not done here: a 400
    that names the field, never a 200 with fewer choices or free text. Values that ask nothing pass.
    (response_format is honoured: test_grammar_serve.py; tools in chat: test_tools_serve.py; logprobs:
    test_logprobs.py.)"""
    c, model = server.client(), server_model_id(server)
    messages = [{"role": "user", "content": "Name a colour."}]
    for extra, name in (({"n": 9}, "n"), ({"top_logprobs": 2}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=model, messages=messages, max_tokens=4, **extra)
        assert e.value.body["param"] == name and f"'{name}'" in e.value.body["message"]
    for extra, name in (({"echo": True}, "echo"), ({"tools": [{"type": "function", "function": {"name": "f"}}]},
                                                    "tools"), ({"tool_choice": "required"}, "tool_choice")):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=model, prompt="hi", max_tokens=4, extra_body=extra)
        assert e.value.body["param"] == name
    r = c.chat.completions.create(model=model, messages=messages, max_tokens=4, n=1, logprobs=False,
                                  response_format={"type": "text"})
    assert r.choices[0].message.content is not None
