"""What a careless or hostile client sends `spectool serve` (issue 31, items 2-7), through real HTTP clients
(http.client, raw sockets) on a real port, keep-alive included: a 400 naming the field, never a 500, a
traceback or a hang; limits on the body; disconnects seen; the API key."""

import contextlib
import http.client
import json
import socket
import threading
import time

import pytest
from spectool_lab.helpers import Server, free_port, spectool

# greedy, this prompt loops without an end-of-generation token (test_serve: 4000 tokens take about 6 s here)
LOOP = "the dog the fox the dog the fox the dog the"
BIG_BODY = 6_000_000  # --max-body-bytes of the shared server: room for the large prompt of the /health test


@pytest.fixture(scope="module")
def server(tiny):
    s = Server(tiny["target"], "--max-body-bytes", BIG_BODY, "--body-timeout", "2")
    yield s
    _, err = s.stop()
    assert "Traceback" not in err and "error:" not in err, err  # nothing on the server's side went wrong


def post(conn: http.client.HTTPConnection, body, path="/v1/completions", headers=None):
    """POST on `conn` (kept open): (status, parsed JSON, the response's headers)."""
    conn.request("POST", path, body if isinstance(body, (str, bytes)) else json.dumps(body),
                 {"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    return r.status, json.loads(r.read()), r


def raw(port: int, data: bytes, wait: float = 30) -> tuple[bytes, float]:
    """`data` sent on a fresh connection, then everything the server sends until it closes the connection:
    (that, seconds until it closed). A server that keeps the connection open fails the test after `wait`."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):  # socket.timeout (an OSError) after `wait` seconds of silence
            got += chunk
    return got, time.monotonic() - t0


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


FORMER_500S = [  # issue 31 item 2: each was a 500 ("internal error: TypeError", OverflowError, ...)
    ('{"prompt": "hi", "stop": 123}', "stop"),
    ('{"prompt": "hi", "stop": true}', "stop"),
    ('{"prompt": "hi", "max_tokens": 1e400}', "max_tokens"),
    ('{"prompt": "hi", "max_tokens": NaN}', "max_tokens"),
    ('{"prompt": "hi", "temperature": NaN}', "temperature"),
    ('{"prompt": "hi", "temperature": -Infinity}', "temperature"),
    ('{"prompt": "hi", "seed": -5}', "seed"),
    ('{"prompt": "hi", "top_p": 1e400}', "top_p"),
]
WRONG_TYPES = [  # item 4: each was taken as something else ("no" streamed, {"a": 1} stopped at "a")
    ('{"prompt": "hi", "stream": "no"}', "stream"),
    ('{"prompt": "hi", "stream": 0}', "stream"),
    ('{"prompt": "hi", "stop": {"a": 1}}', "stop"),
    ('{"prompt": "hi", "stop": ["a", 1]}', "stop"),
    ('{"prompt": "hi", "max_tokens": 2.5}', "max_tokens"),
    ('{"prompt": "hi", "seed": "7"}', "seed"),
]


def test_bad_values_are_400s_naming_the_field_on_one_kept_alive_connection(server):
    """Items 2 and 4, and 3: every bad request, each followed by a good one, on one keep-alive connection; the
    socket never changes (http.client would reconnect on its own after a close)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    good = {"prompt": "The quick brown fox", "max_tokens": 4}
    status, body, _ = post(conn, good)
    sock = conn.sock
    assert status == 200 and sock is not None
    for text, field in FORMER_500S + WRONG_TYPES:
        status, body, r = post(conn, text)
        assert status == 400 and body["error"]["param"] == field and f"'{field}'" in body["error"]["message"], text
        assert r.getheader("connection") != "close"
        status, body, _ = post(conn, good)
        assert status == 200 and body["choices"][0]["text"] and conn.sock is sock, text
    # the right types still work: false does not stream, a list of strings stops
    status, body, _ = post(conn, {**good, "stream": False, "stop": ["zzz", "qqq"], "seed": 0})
    assert status == 200 and body["object"] == "text_completion" and conn.sock is sock
    status, body, _ = post(conn, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stop": "x",
                                  "stream": None}, path="/v1/chat/completions")
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant" and conn.sock is sock
    conn.close()


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def ref_chain(n: int) -> dict:
    """A schema whose $refs run n deep."""
    defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(n)}
    return {"$defs": {**defs, f"d{n}": {"type": "string"}}, "$ref": "#/$defs/d0"}


def with_guidance(value) -> list[tuple[str, dict, str]]:
    """`x-guidance` as `value` in each place a schema is taken: (path, body, the field the 400 names)."""
    schema = {"type": "object", "x-guidance": value}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return [("/v1/chat/completions", {**CHAT, "json_schema": schema}, "json_schema"),
            ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": schema}}}, "response_format"),
            ("/v1/chat/completions", {**CHAT, "tools": [tool]}, "tools"),
            ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": schema}]},
             "tools"),
            ("/v1/completions", {"prompt": "hi", "response_format": {"type": "json_object", "schema": schema}},
             "response_format")]


ISSUE_47 = [  # (path, body, the field the 400 names or None for the body, words of its message): each was a 500
    # (RecursionError, TypeError), or killed the server (llguidance's stack overflowed: $refs, rule chains)
    ("/v1/completions", "[" * 100_000, None, "nested deeper than 100 levels"),
    ("/v1/chat/completions", json.dumps(CHAT)[:-1] + ', "json_schema": {"a": ' + "[" * 3000 + "]" * 3000 + "}}",
     None, "nested deeper than 100 levels"),
    ("/v1/chat/completions", json.dumps(CHAT)[:-1] + ', "json_schema": {"a": ' + "[" * 500 + "]" * 500 + "}}",
     "json_schema", "nested deeper than"),
    ("/v1/chat/completions", {**CHAT, "json_schema": ref_chain(3000)}, "json_schema", "nested deeper than 100"),
    ("/v1/chat/completions", {**CHAT, "grammar": "root ::= r0\n" + "".join(
        f'r{i} ::= "x" r{i + 1}\n' for i in range(5000)) + 'r5000 ::= "y"'}, "grammar", "more than 1000 rules"),
    ("/v1/chat/completions", {**CHAT, "grammar": "start: %json " + json.dumps(ref_chain(3000))}, "grammar",
     "nested deeper than 100"),
    ("/v1/chat/completions", {**CHAT, "grammar": "root ::= " + "(" * 1000 + '"a"' + ")" * 1000}, "grammar",
     "deeper than 100 levels"),
    *[(path, body, field, "'x-guidance' must be a JSON object") for value in ("s", [1])
      for path, body, field in with_guidance(value)],
    # llguidance panicked (a BaseException: past every handler) cutting its message about maxLength inside the ü
    ("/v1/chat/completions", {**CHAT, "json_schema": {"type": "object", "properties": {"a": {
        "type": "string", "maxLength": [{"x" * 80 + "ü" * 10: 1}]}}}}, "json_schema", "grammar library failed"),
    ("/v1/responses", {"input": [{"role": ["user"], "content": "hi"}]}, "input[0].role", "must be user"),
    # (found by test_fuzz.py: the response repeats these, and JSON has no Infinity)
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": float("inf"),
                                                          "schema": {"type": "object"}}}}, "text", "Infinity"),
    ("/v1/responses", {"input": "hi", "parallel_tool_calls": float("nan")}, "parallel_tool_calls", "NaN"),
    # a lone surrogate (JSON can escape one; UTF-8 cannot spell it): UnicodeEncodeError where it was tokenized
    ("/v1/completions", '{"prompt": "\\ud800", "max_tokens": 2}', "prompt", "lone surrogate"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\udfff"}]}', "messages",
     "lone surrogate"),
    ("/v1/completions", '{"prompt": "hi", "\\ud800": 1}', "\\ud800", "lone surrogate"),
    ("/v1/responses", {"input": [{"role": {"a": 1}, "content": "hi"}]}, "input[0].role", "must be user"),
]


def test_what_was_a_500_or_a_crash_is_a_400_naming_the_field(server):
    """Issue 47 item 1: each case, then a good request on the same keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    for path, body, field, words in ISSUE_47:
        status, answer, r = post(conn, body, path)
        error = answer["error"]
        assert status == 400 and words in error["message"] and error["param"] == field, (path, field, answer)
        assert field is None or f"'{field}" in error["message"], error
        status, answer, _ = post(conn, {"prompt": "The quick brown fox", "max_tokens": 2})
        assert status == 200 and answer["choices"][0]["text"], (path, field)
    conn.close()


def test_a_request_body_may_nest_100_levels(server):
    """grammar.DEPTH_MAX: a body nested 100 levels (an ignored field holding 99) is served; 101 is a 400 that
    names the field and the bound."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    for levels, status in ((99, 200), (100, 400)):
        body = '{"prompt": "The quick brown fox", "max_tokens": 2, "metadata": ' + "[" * levels + "]" * levels + "}"
        got, answer, _ = post(conn, body)
        assert got == status, (levels, answer)
    assert answer["error"]["param"] == "metadata" and "100 levels" in answer["error"]["message"], answer
    conn.close()


def test_every_field_that_sizes_the_work_has_its_bound(server):
    """Issue 47 item 1, the bounds docs/serve.md states: completions' `logprobs` 0-5 (100000 made a 98 MB answer),
    `top_logprobs` 0-20, `n` 1-8; at the bound the answer has what was asked, one past it is a 400 naming the
    field. `max_tokens` has no bound of its own: the context is its bound (finish_reason "length")."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    fox = {"prompt": "The quick brown fox", "max_tokens": 3}
    chat = {**CHAT, "logprobs": True}
    for path, ok, over, field in (("/v1/completions", {**fox, "logprobs": 5}, {**fox, "logprobs": 6}, "logprobs"),
                                  ("/v1/chat/completions", {**chat, "top_logprobs": 20},
                                   {**chat, "top_logprobs": 21}, "top_logprobs"),
                                  ("/v1/completions", {**fox, "n": 8}, {**fox, "n": 9}, "n")):
        status, answer, _ = post(conn, ok, path)
        assert status == 200, answer
        choices = answer["choices"]
        if field == "logprobs":  # 5 alternatives, the chosen token among them or beside them
            assert all(5 <= len(top) <= 6 for top in choices[0]["logprobs"]["top_logprobs"]), choices
        elif field == "top_logprobs":
            assert all(len(e["top_logprobs"]) == 20 for e in choices[0]["logprobs"]["content"]), choices
        else:
            assert len(choices) == 8
        status, answer, _ = post(conn, over, path)
        assert status == 400 and answer["error"]["param"] == field, answer
    status, answer, _ = post(conn, {"prompt": LOOP, "max_tokens": 10**30})
    usage = answer["usage"]
    assert status == 200 and answer["choices"][0]["finish_reason"] == "length", answer
    # the context's 1024 tokens (helpers.Server: -c 1024), and the last one sampled that needs no room of its own
    assert usage["completion_tokens"] == 1024 - usage["prompt_tokens"] + 1, usage
    conn.close()


@contextlib.contextmanager
def in_process(tiny, server_class, said=print):
    """A `server_class` (context.Server or a subclass that injects a fault) on the tiny model, served by uvicorn in
    a thread of this process on a free port, saying its lines to `said`: a keep-alive connection to it."""
    import uvicorn

    from spectool.options import Mode, Options
    from spectool.server.app import make_app
    from spectool.session import open_session

    o = Options(model=str(tiny["target"]), ctx_size=1024, threads=2, spec=Mode.none)
    with open_session(o) as s:
        port = free_port()
        web = uvicorn.Server(uvicorn.Config(make_app(server_class(s, o, "target", None, said)), host="127.0.0.1",
                                            port=port, log_level="warning"))
        thread = threading.Thread(target=web.run, daemon=True)
        thread.start()
        try:
            deadline = time.time() + 30
            while not web.started and time.time() < deadline:
                time.sleep(0.05)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            yield conn
            conn.close()
        finally:
            web.should_exit = True
            thread.join(timeout=30)


def test_a_500_answers_and_the_connection_stays_usable(tiny, capsys):
    """Item 3: a request that fails inside the server (a fault injected into the server's own request handling,
    as no known request makes one any more) gets an OpenAI-shaped 500, and the same keep-alive connection then
    serves the next request. Before, Starlette re-raised the error to uvicorn, which logged a traceback and closed
    the connection under the client (a connection reset)."""
    from spectool.server.context import Server as App

    class Failing(App):
        def parse_request(self, raw, chat, infill=False):
            if "boom" in str(raw):
                raise RuntimeError("injected")
            return super().parse_request(raw, chat, infill)

    with in_process(tiny, Failing) as conn:
        for _ in range(2):
            status, body, _ = post(conn, {"prompt": "boom", "max_tokens": 4})
            sock = conn.sock
            assert status == 500 and body["error"]["type"] == "server_error" and sock is not None
            status, body, _ = post(conn, {"prompt": "The quick brown fox", "max_tokens": 4})
            assert status == 200 and body["choices"][0]["text"] and conn.sock is sock
    said = capsys.readouterr()  # the server says what failed (on stdout by default), one line each, no traceback
    assert said.out.splitlines() == ["error: POST /v1/completions: RuntimeError: injected"] * 2
    assert "Traceback" not in said.err


def test_a_generation_that_fails_leaves_a_line_on_stderr(tiny):
    """Issue 58 item 2's last part: a generation that fails (a fault injected into the worker, as no known request
    makes one now) answers a 500, or a stream's error event, and the server says one line for each (it said
    nothing, though the docs promise a line for every 500)."""
    from spectool.server.context import Server as App

    class Failing(App):
        def generate(self, gen, tokens, *args, **kwargs):
            if len(tokens) > 20:
                raise RuntimeError("injected\nover two lines")
            return super().generate(gen, tokens, *args, **kwargs)

    said: list[str] = []
    with in_process(tiny, Failing, said.append) as conn:
        for stream in (False, True):
            conn.request("POST", "/v1/completions", json.dumps(
                {"prompt": "the dog " * 20, "max_tokens": 4, "stream": stream}), {"Content-Type": "application/json"})
            r = conn.getresponse()
            text = r.read().decode()
            assert (r.status == 500) != stream and "injected" in text, text
    assert said == ["error: generation failed: RuntimeError: injected over two lines"] * 2, said


def test_a_client_that_leaves_a_non_streamed_request_stops_its_generation(tiny):
    """Item 5: a non-streamed request whose client hangs up after 0.5 s is cancelled (it was generated to the end,
    and the next request waited for it)."""
    s = Server(tiny["target"], "--spec", "none", "-c", "4096")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": LOOP, "max_tokens": 4000}),
                     {"Content-Type": "application/json"})
        time.sleep(0.5)
        conn.close()  # hang up before the answer
        t0 = time.monotonic()
        status, _ = s.request("POST", "/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 4})
        waited = time.monotonic() - t0
        assert status == 200
        assert s.metric("requests_cancelled_total") == 1
        assert s.metric("completion_tokens_total") < 4000  # stopped short of its 4000 tokens
        # the next request waits at most for the 0.25 s disconnect check and one step, not the other's 4000 tokens
        # (about 6 s); 3 s leaves room for a loaded 2-core machine
        assert waited < 3, waited
    finally:
        _, err = s.stop()
    assert "Traceback" not in err


def test_a_body_over_the_limit_is_a_413_and_closes_the_connection(server):
    """Item 6: a Content-Length over --max-body-bytes is refused before anything is read (the issue's 10^12 bytes
    announced, 2 sent: it held the connection open), and so is a chunked body that grows past the limit."""
    head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    got, took = raw(server.port, (head + "Content-Length: 1000000000000\r\n\r\n{}").encode())
    assert status_of(got) == 413 and b"connection: close" in got.lower() and took < 10, got
    assert b"--max-body-bytes" in got
    got, _ = raw(server.port, (head + f"Content-Length: {BIG_BODY + 1}\r\n\r\n").encode() + b" " * 1000)
    assert status_of(got) == 413
    # one byte over the limit in 4 chunks, no last chunk: the server reads every byte sent before it answers and
    # closes (bytes left unread would turn its close into a reset that can swallow the answer)
    chunks = [b" " * (BIG_BODY // 3)] * 3 + [b" " * (BIG_BODY - BIG_BODY // 3 * 3 + 1)]
    chunked = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"".join(
        b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    got, _ = raw(server.port, chunked)
    assert status_of(got) == 413 and b"body_too_large" in got


def test_the_default_body_limit_is_64_bytes_a_token_of_context(tiny):
    """--max-body-bytes 0 (the default): 64 bytes per token of context; the issue's 20 MB body was read and
    tokenized whole. Also item 7's key: SPECTOOL_API_KEY sets it, out of `ps`; /health stays open (/metrics too,
    until issue 58 put it behind the key)."""
    key = "s3cret-ключ"
    s = Server(tiny["target"], "-c", "512", env={"SPECTOOL_API_KEY": key})
    try:
        with open(f"/proc/{s.proc.pid}/cmdline", "rb") as f:
            assert key.encode() not in f.read()
        auth = {"Authorization": f"Bearer {key}".encode()}  # the key's UTF-8 bytes, as curl sends them
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        status, body, r = post(conn, json.dumps({"prompt": "x" * (64 * 512)}), headers=auth)
        assert status == 413 and "32768" in body["error"]["message"] and r.getheader("connection") == "close"
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        assert post(conn, {"prompt": "hi", "max_tokens": 2}, headers=auth)[0] == 200
        for wrong in ("s3cret-ключа", "s3cret-клю", "", "Bearer s3cret-ключ"):  # non-ASCII wrong keys: 401s
            status, body, _ = post(conn, {"prompt": "hi", "max_tokens": 2},
                                   headers={"Authorization": f"Bearer {wrong}".encode()})
            assert status == 401 and body["error"]["code"] == "invalid_api_key", wrong
        assert post(conn, {"prompt": "hi", "max_tokens": 2})[0] == 401  # no key at all
        for path, status in (("/v1/models", 401), ("/health", 200), ("/metrics", 401)):  # as llama-server's
            conn.request("GET", path)
            r = conn.getresponse()
            assert r.status == status and r.read(), path
        conn.close()
    finally:
        _, err = s.stop()
    assert "Traceback" not in err and key not in err


def test_an_empty_api_key_is_refused_before_the_model_loads(tiny):
    """Item 7: `--api-key=` turned authentication off without a word."""
    for args in (["--api-key="], ["--api-key", " "]):
        r = spectool("serve", "-m", tiny["target"], "--port", free_port(), *args, timeout=60)
        assert r.returncode == 2 and "--api-key is empty" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr and "serving" not in r.stderr


def test_a_body_that_stops_arriving_is_a_408_after_the_timeout(server):
    """Item 6: half a body and then silence held the connection open for good; now --body-timeout (2 s here)."""
    head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    got, took = raw(server.port, head.encode() + b'{"prompt": "half a bo')
    assert status_of(got) == 408 and b"--body-timeout" in got and b"connection: close" in got.lower(), got
    # 2 s, and a loaded 2-core machine's slack on top (the answer comes within ms of the deadline here)
    assert 1.9 < took < 10, took


def test_health_answers_at_once_while_a_large_prompt_is_tokenized(server):
    """Item 6: the body is parsed and tokenized in a thread, so the event loop answers /health meanwhile (it took
    4.6 s while a large body was tokenized on the loop). The 4.4 MB prompt takes about 1-2 s to tokenize on these
    2-core VMs (half of it took 1 s on a Xeon, 3 s under load, and 0.50 s on an AMD EPYC: too close to the 0.5 s
    this test asks of it), and ends in a 400: longer than the context."""
    prompt = "the quick brown fox jumps over the lazy dog " * 100_000  # 4.4 MB
    result = {}

    def big():
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        t0 = time.monotonic()
        result["status"], result["body"], _ = post(conn, {"prompt": prompt})
        result["took"] = time.monotonic() - t0
        conn.close()

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    thread = threading.Thread(target=big)
    thread.start()
    latencies = []
    while thread.is_alive():
        t0 = time.monotonic()
        conn.request("GET", "/health")
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
        latencies.append(time.monotonic() - t0)
        time.sleep(0.02)
    thread.join()
    conn.close()
    assert result["status"] == 400 and result["body"]["error"]["code"] == "context_length_exceeded"
    # measured on this 2-core VM (2026-12-01), the slowest of 40-120 polls during the ~1-3 s of tokenizing: 6-8 ms
    # with nothing else running, 28-33 ms with two busy loops beside it saturating both cores; 0.9 s (and the
    # issue's 4.6 s) before the fix. 100 ms is the issue's bound, 3x the loaded figure.
    assert max(latencies) < 0.1, (max(latencies), result["took"])
    assert result["took"] > 0.5 and len(latencies) >= 10  # the check above covered a real tokenization
