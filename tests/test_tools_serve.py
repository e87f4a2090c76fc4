"""Tool calls through `spectool serve`, a real server over HTTP, with the official `openai` client: the whole tool
loop (a call, the tool's result sent back, the final answer), streamed and not, on tiny models with Qwen2.5's
(Hermes) and Llama 3.1's templates, `tool_choice="required"` or a named function making the random model's call
certain; llama.cpp's generic format on a template without tools (the tiny target's, and the offline chat demo's
SmolLM2 end to end); malformed tools and tool messages a 400 naming the field, the next request served."""

import json

import pytest
from spectool_lab.helpers import Server

CITIES = ["Paris", "Lyon", "Rome"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time now", "strict": True,
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=["hermes", "llama3"])
def server(request, tool_models):
    s = Server(tool_models[request.param], "-c", "2048")  # Llama 3.1's tool prompt is long in a tiny vocabulary
    yield s
    s.stop()


def call_of(c, messages, stream, **fields):
    """The chat completion of a request; streamed through the openai client's stream helper, which puts the
    tool_calls deltas together."""
    ask = dict(model="tiny", messages=messages, tools=[WEATHER, TIME], max_tokens=160, temperature=0, **fields)
    if not stream:
        return c.chat.completions.create(**ask)
    with c.chat.completions.stream(**ask) as s:
        return s.get_final_completion()


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_clients_whole_tool_loop(server, stream):
    c = server.client()
    r = call_of(c, ASK, stream, tool_choice="required")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content, choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    assert args == {} if call.function.name == "get_time" else args["city"] in CITIES
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"}]
    # the answer: the random model writes text to the budget (the stream helper would refuse a cut-off answer
    # when tools are strict, so the stream is read chunk by chunk)
    ask = dict(model="tiny", messages=messages, tools=[WEATHER, TIME], max_tokens=16, temperature=0)
    if stream:
        chunks = list(c.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        finish, usage = chunks[-1].choices[0].finish_reason, chunks[-1].usage
        assert not any(ch.choices[0].delta.tool_calls for ch in chunks if ch.choices)
    else:
        final = c.chat.completions.create(**ask)
        text, finish, usage = final.choices[0].message.content, final.choices[0].finish_reason, final.usage
        assert not final.choices[0].message.tool_calls
    assert finish in ("stop", "length") and text
    assert usage.prompt_tokens > r.usage.prompt_tokens + 5  # the call and its result were in the prompt


@pytest.mark.parametrize("name", ["get_weather", "get_time"])
def test_a_named_function_is_the_one_called(server, name):
    r = server.client().chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER, TIME], max_tokens=160,
        tool_choice={"type": "function", "function": {"name": name}})
    assert [t.function.name for t in r.choices[0].message.tool_calls] == [name]


def test_the_stream_sends_the_call_as_openai_deltas(server):
    chunks = list(server.client().chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=160, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [t for ch in chunks if ch.choices for t in ch.choices[0].delta.tool_calls or []]
    assert [(d.index, d.type, d.function.name) for d in deltas] == [(0, "function", "get_weather")] and deltas[0].id
    assert json.loads(deltas[0].function.arguments)["city"] in CITIES
    assert not any(ch.choices[0].delta.content for ch in chunks if ch.choices)  # no call text as content
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and chunks[-1].usage.completion_tokens > 0


BAD = [  # (fields over a request with tools, the field the 400 names, a word of its message)
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]}, "tools", "strin"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools", "name"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_wether"}}}, "tool_choice", "get_wether"),
    ({"tool_choice": "always"}, "tool_choice", "required"),
    ({"grammar": 'root ::= "yes" | "no"'}, "tools", "grammar"),
    ({"messages": ASK + [{"role": "tool", "content": "sunny"}]}, "messages", "tool_call_id"),
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"arguments": "{}"}}]}]}, "messages", "name"),
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": {}}}]}]}, "messages", "JSON"),
]


def test_malformed_tools_are_a_400_naming_the_field_and_the_next_request_is_served(server):
    for fields, name, word in BAD:
        for stream in (False, True):
            status, text = server.request("POST", "/v1/chat/completions", {
                "messages": ASK, "tools": [WEATHER], "max_tokens": 8, "stream": stream, **fields})
            err = json.loads(text)["error"]
            assert status == 400 and err["param"] == name and word in err["message"], (fields, text)
            assert "Traceback" not in text
    r = server.client().chat.completions.create(model="tiny", messages=ASK, max_tokens=8)
    assert r.choices[0].message.content


def parse_with_tools(c, stream: bool, **fields):
    """The openai client's parse (or stream) of a request with tools and a pydantic response_format, as the
    OpenAI Agents SDK and pydantic-ai send them: the reply is a Forecast (the client validates it) or a call."""
    from typing import Literal

    import openai
    from pydantic import BaseModel

    class Forecast(BaseModel):
        city: Literal["Paris", "Lyon", "Rome"]
        sky: Literal["sunny", "rain"]

    class GetWeather(BaseModel):
        city: Literal["Paris", "Lyon", "Rome"]

    ask = dict(model="tiny", messages=ASK, tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")],
               response_format=Forecast, max_tokens=160, temperature=0, **fields)
    if not stream:
        return c.chat.completions.parse(**ask).choices[0].message, Forecast
    with c.chat.completions.stream(**ask) as s:
        return s.get_final_completion().choices[0].message, Forecast


def answered_or_called(msg, Forecast) -> bool:
    if msg.tool_calls:
        (call,) = msg.tool_calls
        return call.function.name == "get_weather" and call.function.parsed_arguments.city in CITIES
    return isinstance(msg.parsed, Forecast)  # the client's own validation of the content


@pytest.mark.parametrize("stream", [False, True])
def test_tools_with_a_response_format_give_an_answer_in_it_or_a_call(server, tiny, stream):
    """Under `auto` the reply is an answer in the response_format or a call, on each format (Hermes, Llama 3 and
    the generic one, the tiny target's); under `required` a call. It was a 400."""
    s = Server(tiny["target"])
    try:
        for c in (server.client(), s.client()):
            msg, Forecast = parse_with_tools(c, stream)
            assert answered_or_called(msg, Forecast), msg
            msg, Forecast = parse_with_tools(c, stream, tool_choice="required")
            assert msg.tool_calls and answered_or_called(msg, Forecast), msg
    finally:
        s.stop()


def test_a_template_without_tools_gets_the_generic_json_format(tiny):
    """The tiny target's template knows no tools: the call is a JSON object the grammar holds it to."""
    s = Server(tiny["target"])
    try:
        for stream in (False, True):
            r = call_of(s.client(), ASK, stream, tool_choice="required")
            (call,) = r.choices[0].message.tool_calls
            assert r.choices[0].finish_reason == "tool_calls" and call.function.name in ("get_weather", "get_time")
    finally:
        code, err = s.stop()
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def smollm2_server(smollm2):
    s = Server(smollm2)
    yield s
    s.stop()


@pytest.mark.realmodel
@pytest.mark.parametrize("stream", [False, True])
def test_the_chat_demo_runs_the_tool_loop_in_the_generic_format(smollm2_server, stream):
    """SmolLM2's template knows no tools: described in the system message, the reply a JSON call or answer, the
    whole loop through the openai client."""
    c = smollm2_server.client()
    if not stream:
        r = call_of(c, ASK, stream, tool_choice="auto")  # the model's choice: either way it parses
        msg = r.choices[0].message
        assert (msg.tool_calls and msg.tool_calls[0].function.name in ("get_weather", "get_time")) or (
            msg.content and not msg.content.lstrip().startswith("{")), msg
    r = call_of(c, ASK, stream, tool_choice="required")
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"}]
    final = c.chat.completions.create(model="demo", messages=messages, tools=[WEATHER, TIME], tool_choice="none",
                                      max_tokens=48, temperature=0)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
