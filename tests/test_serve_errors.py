"""What the fourth probe (issue 58) found wrong in `spectool serve`'s answers, on real servers over HTTP: a grammar
that names a token the model lacks is a 400 naming the field when the request is parsed (it was a 500 from the
generation, and on --parallel a slot lost for good), on both servers, streamed or not; every 500 leaves a line on
stderr (test_serve_hardening.py); `--queue 0` serves an idle server and refuses only what would wait."""

import http.client
import json
import threading
import time

import pytest
from spectool_lab.helpers import Server, free_port, spectool

# each names a token the tiny model's 635-token vocabulary lacks: an id past its end, an id in range of a larger
# vocabulary (SmolLM2's 49152), a special token it has not got
BAD_GRAMMARS = ["start: <[99999999]>", "start: <[49152]>", "start: <|no_such_token|>"]
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"prompt": "The quick brown fox", "max_tokens": 4}


@pytest.fixture(scope="module")
def servers(tiny):
    one, two = Server(tiny["target"]), Server(tiny["target"], "-c", "2048", "--parallel", "2")
    yield one, two
    for s in (one, two):
        _, err = s.stop()
        assert "Traceback" not in err, err


def test_a_grammar_naming_a_token_the_model_lacks_is_a_400_naming_the_field(servers):
    """Item 2: on the one-sequence server and on --parallel 2, chat and completions, streamed or not, each bad
    grammar is a 400 with `param` "grammar" that says what is wrong; then as many requests as there are slots, at
    once, are served (on --parallel the bad requests had taken both slots for good)."""
    for server in servers:
        for grammar in BAD_GRAMMARS:
            for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
                for stream in (False, True):
                    status, answer = server.request("POST", path, {**body, "grammar": grammar, "stream": stream})
                    assert status == 400, (path, grammar, stream, answer)
                    error = json.loads(answer)["error"]
                    assert error["param"] == "grammar" and "'grammar' was refused" in error["message"], error
                    assert "too large" in error["message"] or "unknown special token" in error["message"], error
        out: list = [None] * 2
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, server.request(
            "POST", "/v1/completions", {**COMPLETION, "grammar": "start: <[5]> <[6]>"}))) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert [status for status, _ in out] == [200, 200], out


def test_an_infill_grammar_naming_a_token_the_model_lacks_is_a_400(fim_path):
    s = Server(fim_path)
    try:
        status, answer = s.request("POST", "/infill", {"input_prefix": "def f(", "input_suffix": ")\n",
                                                       "n_predict": 4, "grammar": "start: <[99999999]>"})
        assert status == 400 and json.loads(answer)["error"]["param"] == "grammar", answer
    finally:
        _, err = s.stop()
    assert "Traceback" not in err and "error:" not in err, err


@pytest.mark.parametrize("flag", ["--grammar", "--grammar-file"])
def test_a_grammar_flag_naming_a_token_the_model_lacks_is_one_line_before_anything_runs(tiny, tmp_path, flag):
    """The command line's grammar is checked against the vocabulary once the model is loaded: `run` says which flag
    (it said the library's words and exit 1), and `serve` does not start (it served a 500 to every request)."""
    grammar = tmp_path / "g.lark"
    grammar.write_text("start: <[99999999]>")
    value = str(grammar) if flag == "--grammar-file" else grammar.read_text()
    for command in (["run", "-m", tiny["target"], "-n", "4", flag, value, "hi"],
                    ["serve", "-m", tiny["target"], "--port", free_port(), flag, value]):
        r = spectool(*command, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].startswith(f"error: {flag}") and "too large" in lines[0], r.stderr
        assert r.stdout == ""


def test_queue_0_serves_an_idle_server_and_refuses_only_what_would_wait(tiny):
    """Item 9: `--queue 0` is no waiting room (every request 503'd on an idle server): a request finds the slot
    free and is served; while a stream runs, the next is a 503; once it ends, the next is served."""
    s = Server(tiny["target"], "--queue", "0", "--spec", "none", "-c", "4096")
    try:
        for _ in range(2):
            status, answer = s.request("POST", "/v1/completions", COMPLETION)
            assert status == 200, answer
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "the dog the fox the dog the fox the dog the", "max_tokens": 4000, "stream": True}),
            {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and b"data:" in r.readline()
        status, answer = s.request("POST", "/v1/completions", COMPLETION)
        assert status == 503 and json.loads(answer)["error"]["code"] == "queue_full", answer
        conn.close()
        deadline = time.time() + 10
        while (status := s.request("POST", "/v1/completions", COMPLETION)[0]) == 503 and time.time() < deadline:
            time.sleep(0.1)
        assert status == 200
    finally:
        _, err = s.stop()
    assert "Traceback" not in err
