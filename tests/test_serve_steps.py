"""The stream's opt-in `draft_steps` (issue 60 item 2), on a real `spectool serve` over the tiny model: with it,
each streamed chunk says what drafted its text, and the steps add up to the usage the server reports; without
it, the stream is the one OpenAI's client has always read, chunk for chunk and byte for byte in its framing."""

import http.client
import json

import pytest
from spectool_lab.helpers import Server

CHAT = {"messages": [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. The quick"}],
        "max_tokens": 60, "temperature": 0}


@pytest.fixture(scope="module")
def server(tiny):
    s = Server(tiny["target"], "--draft-min", "1")  # lookup drafts wherever it offers a token
    yield s
    _, err = s.stop()
    assert "Traceback" not in err and "error:" not in err, err


def raw_stream(port, body) -> list[str]:
    """The `data:` lines of a streamed chat completion, as sent."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    text = r.read().decode()
    conn.close()
    return [line for line in text.split("\n\n") if line.startswith("data: ")]  # (not keep-alive comments)


def shape(value):
    """A chunk's keys, nested, without its values (by_source names the sources that drafted: they may differ)."""
    if isinstance(value, dict):
        return {k: "dict" if k == "by_source" else shape(v) for k, v in value.items()}
    return [shape(v) for v in value] if isinstance(value, list) else type(value).__name__


def text(objects) -> str:
    return "".join(o["choices"][0]["delta"].get("content") or "" for o in objects)


def test_without_the_field_the_stream_is_openais(server):
    """No chunk carries `draft_step`, each is `data: ` and json.dumps of an object with OpenAI's keys only, and
    `draft_steps: false` sends the same stream; the official client reads no extra field in any chunk, and its
    text is the whole answer's."""
    plain, off = raw_stream(server.port, CHAT), raw_stream(server.port, {**CHAT, "draft_steps": False})
    assert plain[-1] == "data: [DONE]" and "draft_step" not in "".join(plain)
    objects = [json.loads(line.removeprefix("data: ")) for line in plain[:-1]]
    assert all(line == "data: " + json.dumps(obj) for line, obj in zip(plain, objects))
    assert all(set(obj) <= {"id", "object", "created", "model", "choices", "usage"} for obj in objects)
    # (a step's length is the controller's choice, which learns from each request: the pieces may differ)
    again = [json.loads(line[6:]) for line in off[:-1]]
    assert [shape(o) for o in again] == [shape(o) for o in objects[:1]] + [shape(o) for o in objects[1:2]] * (
        len(again) - 2) + [shape(objects[-1])] and text(again) == text(objects)
    client = server.client()
    chunks = list(client.chat.completions.create(model="m", stream=True, **CHAT))
    assert all(not c.model_extra and not c.choices[0].delta.model_extra for c in chunks if c.choices)
    whole = client.chat.completions.create(model="m", **CHAT).choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole


def test_with_the_field_each_chunk_says_what_drafted_it_and_the_steps_add_up(server):
    """Every chunk after the role's carries its step: source, drafted, accepted, tokens, draft_chars, the rejected
    drafts' text; summed, they are the usage's drafted, accepted and completion tokens, and the text is the answer
    without the field."""
    client = server.client()
    chunks = list(client.chat.completions.create(model="m", stream=True, extra_body={"draft_steps": True}, **CHAT))
    steps = [(c.choices[0].delta.content or "", c.model_extra["draft_step"]) for c in chunks
             if c.model_extra and "draft_step" in c.model_extra]
    usage = chunks[-1].usage
    spec = usage.model_extra["speculative"]
    assert sum(s["drafted"] for _, s in steps) == spec["drafted"] > 0
    assert sum(s["accepted"] for _, s in steps) == spec["accepted"] > 0
    assert sum(s["tokens"] for _, s in steps) == usage.completion_tokens
    assert all(0 <= s["draft_chars"] <= len(text) and s["accepted"] <= s["drafted"] for text, s in steps)
    assert {s["source"] for _, s in steps} <= {"none", "lookup", "corpus"} and any(s["draft_chars"] for _, s in steps)
    assert all(isinstance(s["rejected"], str) and (s["rejected"] == "") == (s["accepted"] == s["drafted"])
               for _, s in steps)  # the refused drafts' text
    whole = client.chat.completions.create(model="m", **CHAT).choices[0].message.content
    assert "".join(text for text, _ in steps) == whole


def test_the_field_is_true_or_false(server):
    status, body = server.request("POST", "/v1/chat/completions", {**CHAT, "stream": True, "draft_steps": "yes"})
    assert status == 400 and "'draft_steps' must be true or false" in json.loads(body)["error"]["message"]


def test_completions_stream_the_steps_too(server):
    """/v1/completions' text_completion chunks carry draft_step as chat's do, and add up to the usage."""
    chunks = list(server.client().completions.create(model="m", prompt=CHAT["messages"][0]["content"], max_tokens=40,
                                                     temperature=0, stream=True, extra_body={"draft_steps": True}))
    steps = [c.model_extra["draft_step"] for c in chunks if c.model_extra and "draft_step" in c.model_extra]
    spec = chunks[-1].usage.model_extra["speculative"]
    assert steps and sum(s["drafted"] for s in steps) == spec["drafted"]
    assert sum(s["tokens"] for s in steps) == chunks[-1].usage.completion_tokens
