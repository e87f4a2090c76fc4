"""Tool-call formats (spectool/tools.py) against the real templates' text: which format a template has, a
conversation with calls and results rendered as Qwen2.5's and Llama 3.1's templates write it, the model's call text
read back as OpenAI tool_calls (each family's), the grammar of a required call accepting exactly what the template
writes, streaming that never shows a call's text as content, and malformed tools refused by field."""

import json

import pytest
from spectool_lab.tinymodels import CHAT_TEMPLATE, LLAMA31_TEMPLATE, QWEN25_TEMPLATE

from spectool.templates import render
from spectool.server.tools import ToolError, detect, read, template_messages

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city <now>",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": '{"city": "Paris", "days": 2}'}}
LOOP = [{"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
TEMPLATES = {"hermes": QWEN25_TEMPLATE, "llama3": LLAMA31_TEMPLATE}


def content(m, i):
    return m["content"]


def rendered(template, messages, tools, add_generation_prompt=True):
    t = read({"tools": tools}, template) if tools else None
    return render(template, template_messages(messages, content, template, t), add_generation_prompt=
                  add_generation_prompt, bos="<s>", tools=t.tools if t and not t.describe else None)


def test_the_format_is_found_in_the_templates_text():
    assert detect(QWEN25_TEMPLATE) == "hermes" and detect(LLAMA31_TEMPLATE) == "llama3"
    assert detect(CHAT_TEMPLATE) == "generic" and detect(None) == "generic"
    assert detect("{{ '[TOOL_CALLS][' }}") == "mistral"
    assert detect("{{'<｜Assistant｜><｜tool▁calls▁begin｜>'}}") == "deepseek_r1"
    assert detect("<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key>") == "glm45"  # GLM before Hermes


def test_qwen_renders_tools_calls_and_results_as_its_template_writes_them():
    text = rendered(QWEN25_TEMPLATE, LOOP, [WEATHER])
    assert '"description": "The weather in a city <now>"' in text  # transformers' tojson: no HTML escapes
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n") and "None" not in text


def test_llama_renders_tools_calls_and_results_as_its_template_writes_them():
    text = rendered(LLAMA31_TEMPLATE, LOOP, [WEATHER])
    assert "Environment: ipython" in text and '"name": "get_weather"' in text and "\n    " in text  # indent=4
    assert '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": ' \
           '{"city": "Paris", "days": 2}}<|eot_id|>' in text
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n" in text and "sunny, 21 C" in text


@pytest.mark.parametrize("fmt", TEMPLATES)
def test_a_call_the_template_writes_reads_back_as_the_same_call(fmt):
    """The assistant turn of a rendered call, as a model trained on the template writes it, parses to the call."""
    template = TEMPLATES[fmt]
    opening, end = {"hermes": ("<|im_start|>assistant", "<|im_end|>"),
                    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")}[fmt]
    turn = rendered(template, LOOP[:2], [WEATHER], add_generation_prompt=False).split(opening)[-1].split(end)[0]
    assert "get_weather" in turn
    msg, called = read({"tools": [WEATHER]}, template).message(turn)
    assert called and msg["content"] is None
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 2}


@pytest.mark.parametrize("fmt, text, content", [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "Let me look."),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', None),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', None),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]', None),
    ("mistral", '[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]', None),  # unrendered
    ("deepseek_r1", "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                    '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "Sure."),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", None),
    ("generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', None),
])
def test_each_familys_call_text_is_read_as_openai_tool_calls(fmt, text, content):
    from spectool.server.tools import Tools

    t = Tools(fmt, [WEATHER, TIME])
    msg, called = t.message(text)
    assert called and msg["content"] == content, msg
    assert msg["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    if fmt == "mistral":
        assert msg["tool_calls"][0]["id"] == "abcdefghi"  # the model's own id, which its template checks
    plain, called = t.message("It is sunny in Paris.")
    assert not called and plain == {"role": "assistant", "content": "It is sunny in Paris."}


def test_parallel_tool_calls_false_keeps_a_replys_first_call_only():
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    both = read({"tools": [WEATHER, TIME]}, QWEN25_TEMPLATE).message(text)[0]["tool_calls"]
    one = read({"tools": [WEATHER, TIME], "parallel_tool_calls": False}, QWEN25_TEMPLATE).message(text)[0]
    assert [c["function"]["name"] for c in both] == ["get_weather", "get_time"]
    assert [c["function"]["name"] for c in one["tool_calls"]] == ["get_weather"]


def test_the_generic_formats_answer_is_the_content():
    from spectool.server.tools import Tools

    msg, called = Tools("generic", [WEATHER]).message('{"response": "It is sunny."}')
    assert not called and msg["content"] == "It is sunny."


@pytest.mark.parametrize("fmt", TEMPLATES)
def test_the_required_grammar_takes_the_templates_call_and_nothing_else(tool_models, fmt):
    from spectool.llama.engine import Model

    with Model(tool_models[fmt], n_ctx=256, n_threads=2) as m:
        t = read({"tools": [WEATHER, TIME], "tool_choice": "required"}, m.chat_template())
        template_call = {"hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                                   "</tool_call>",
                         "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}'}[fmt]
        for text, whole in ((template_call, True), (template_call.replace("get_weather", "get_wether"), False),
                            (template_call.replace('"Paris"', "5"), False), ("It is sunny.", False)):
            c = t.grammar(m).matcher(m)
            tokens = m.tokenize(text, add_special=False, parse_special=True)
            assert (c.valid(tokens) == len(tokens) and c.push(tokens) and c.complete) == whole, text
        named = read({"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
                     m.chat_template()).grammar(m).matcher(m)
        tokens = m.tokenize(template_call, add_special=False, parse_special=True)
        assert named.valid(tokens) < len(tokens)  # the named function only


def test_a_template_without_tools_gets_them_in_the_system_message_and_calls_as_json():
    t = read({"tools": [WEATHER]}, CHAT_TEMPLATE)
    assert t.format == "generic" and t.describe and t.constrained  # auto too: a JSON call or a JSON answer
    msgs = template_messages([{"role": "system", "content": "Be brief."}, *LOOP], content, CHAT_TEMPLATE, t)
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.") and "get_weather" in \
        msgs[0]["content"] and '"tool_call"' in msgs[0]["content"]
    assert json.loads(msgs[2]["content"]) == {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris",
                                                                                                 "days": 2}}}
    assert msgs[3]["role"] == "user" and json.loads(msgs[3]["content"])["tool_response"]["content"] == "sunny, 21 C"
    text = render(CHAT_TEMPLATE, msgs, add_generation_prompt=True)
    assert "sunny, 21 C" in text and "get_weather" in text


def test_tool_choice_none_renders_the_tools_and_reads_no_calls():
    t = read({"tools": [WEATHER], "tool_choice": "none"}, QWEN25_TEMPLATE)
    assert not t.constrained and "<tools>" in rendered(QWEN25_TEMPLATE, LOOP[:1], [WEATHER])
    text = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    assert t.message(text) == ({"role": "assistant", "content": text}, False)


def stream(t, text, size):
    s = t.streamer()
    deltas = [d for i in range(0, len(text), size) for d in s.feed(text[i:i + size])]
    end, called = s.end()
    return deltas + end, called


@pytest.mark.parametrize("size", [1, 3, 100])
def test_streamed_text_before_a_call_is_content_and_the_call_comes_whole(size):
    t = read({"tools": [WEATHER]}, QWEN25_TEMPLATE)
    text = 'I will check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    deltas, called = stream(t, text, size)
    shown = "".join(d.get("content", "") for d in deltas)
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert called and shown == "I will check." and "<" not in shown
    assert [(c["index"], c["type"], c["function"]["name"]) for c in calls] == [(0, "function", "get_weather")]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"} and calls[0]["id"]
    plain = "Sunny <b>today</b>, a tool_call < 3."  # text like an opening's start is sent once it cannot be one
    deltas, called = stream(t, plain, size)
    assert not called and "".join(d["content"] for d in deltas) == plain


def test_a_bare_llama_call_streams_no_content():
    t = read({"tools": [WEATHER]}, LLAMA31_TEMPLATE)
    deltas, called = stream(t, '  {"name": "get_weather", "parameters": {"city": "Paris"}}', 2)
    assert called and not any("content" in d for d in deltas)
    deltas, called = stream(t, "  It is sunny.", 2)
    assert not called and "".join(d["content"] for d in deltas) == "  It is sunny."


BAD = [  # (request fields, messages, the field named)
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]}, None, "tools"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, None, "tools"),
    ({"tools": "get_weather"}, None, "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, None, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, None, "tool_choice"),
    ({"tool_choice": "required"}, None, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "no"}, None, "parallel_tool_calls"),
    ({}, [{"role": "tool", "content": "sunny"}], "messages"),
    ({}, [{"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"arguments": "{}"}}]}],
     "messages"),
    ({}, [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": {"city": "Paris"}}}]}], "messages"),
    ({}, [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{city: Paris"}}]}], "messages"),
]


@pytest.mark.parametrize("fields, messages, param", BAD)
def test_malformed_tools_and_tool_messages_name_the_field(fields, messages, param):
    with pytest.raises(ToolError) as e:
        t = read(fields, QWEN25_TEMPLATE)
        template_messages(messages or [], content, QWEN25_TEMPLATE, t)
    assert e.value.param == param and f"'{param}" in str(e.value)


@pytest.mark.parametrize("fmt", TEMPLATES)
def test_auto_is_a_lazy_grammar_free_text_until_a_calls_opening_then_the_call(tool_models, fmt):
    """As llama.cpp's grammar triggers: any text that opens no call, and once a call opens, a call of the tools."""
    from spectool.llama.engine import Model

    call = {"hermes": 'Let me see. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}'}[fmt]
    wrong = {"hermes": 'Let me see. <tool_call>\n{"name": "get_wether"', "llama3": '{"answer": 42}'}[fmt]
    with Model(tool_models[fmt], n_ctx=256, n_threads=2) as m:
        g = read({"tools": [WEATHER, TIME]}, m.chat_template()).grammar(m)
        for text, takes, ends in (("It is sunny, <b>21</b> C; {no call}.", True, False), (call, True, True),
                                  (wrong, False, False)):
            c = g.matcher(m)
            tokens = m.tokenize(text, add_special=False, parse_special=True)
            assert (c.valid(tokens) == len(tokens)) == takes, text
            if takes:
                assert c.push(tokens) and c.m.is_accepting() and c.complete == ends, text


PERSON = {"$defs": {"City": {"type": "string", "enum": ["Lyon", "Rome"]}}, "type": "object",
          "properties": {"name": {"type": "string"}, "city": {"$ref": "#/$defs/City"}}, "required": ["name", "city"]}


@pytest.mark.parametrize("fmt", [*TEMPLATES, "generic"])
def test_with_a_response_format_auto_is_an_answer_in_its_schema_or_a_call(tool_models, fmt):
    """OpenAI's reading of tools with a response_format (the OpenAI Agents SDK and pydantic-ai send both): under
    `auto` the reply is an answer in the schema (its $defs refs resolved, wherever the format puts it) or a call,
    and nothing else; an answer whose JSON reads as a Llama 3 call of no tool (it has a "name") is the content."""
    from spectool.llama.engine import Model
    from spectool.server.tools import Tools

    answer = '{"name": "Ann", "city": "Lyon"}'
    wrap = (lambda s: f'{{"response": {s}}}') if fmt == "generic" else (lambda s: s)
    call = {"hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
            "generic": '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'}[fmt]
    with Model(tool_models["llama3" if fmt == "llama3" else "hermes"], n_ctx=256, n_threads=2) as m:
        t = Tools(fmt, [WEATHER, TIME], answer=PERSON)
        g = t.grammar(m)
        for text, takes in ((wrap(answer), True), (call, True), (wrap('{"name": "Ann", "city": "Paris"}'), False),
                            (wrap('"It is sunny."'), False), ("It is sunny.", False)):
            c = g.matcher(m)
            tokens = m.tokenize(text, add_special=False, parse_special=True)
            assert (c.valid(tokens) == len(tokens) and c.push(tokens) and c.complete) == takes, text
        assert t.message(wrap(answer)) == ({"role": "assistant", "content": answer}, False)
        msg, called = t.message(call)
        assert called and [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"]
