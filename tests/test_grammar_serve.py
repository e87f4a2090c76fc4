"""Structured output through `spectool serve`, a real server over HTTP: OpenAI's `response_format` (text,
json_object, json_schema), llama-server's `json_schema` and `grammar`, on both endpoints, streamed or not; a bad or
conflicting one is a 400 naming the field; a server's --grammar is the default a request's own replaces."""

import json

import pytest
from spectool_lab.helpers import Server

YES_NO = 'root ::= "yes" | "no"'
SENTENCE = "the quick brown fox jumps over the lazy dog"
COLOURS = {"type": "string", "enum": ["red", "green", "blue"]}
ENDPOINTS = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "The quick brown fox"}]},
             "/v1/completions": {"prompt": "The quick brown fox"}}


@pytest.fixture(scope="module")
def server(tiny):
    # no corpus: these tests look at one request's drafting, which earlier requests' text would change (a request
    # asked before is drafted whole from the corpus: one step, one piece, nothing left for the grammar to force)
    s = Server(tiny["target"], "--no-lookup-corpus")
    yield s
    s.stop()


def answer(server, path, body) -> tuple[str, str, dict]:
    """(text, finish reason, usage) of a request, streamed or not as `body` says."""
    if not body.get("stream"):
        status, text = server.request("POST", path, body)
        assert status == 200, text
        r = json.loads(text)
        choice = r["choices"][0]
        return choice["message"]["content"] if "message" in choice else choice["text"], choice["finish_reason"], \
            r["usage"]
    status, text = server.request("POST", path, body)
    assert status == 200, text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    pieces = [c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text") or "" for c in events]
    return "".join(pieces), events[-1]["choices"][0]["finish_reason"], events[-1]["usage"]


BAD = [  # (fields, the field the 400 names, a word of its message)
    ({"response_format": "json"}, "response_format", "type"),
    ({"response_format": {"type": "xml"}}, "response_format", "type"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": 5}}}, "response_format",
     "schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": COLOURS, "strict": "yes"}}},
     "response_format", "strict"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "strin"}}}},
     "response_format", "strin"),  # the library's reason
    ({"response_format": {"type": "json_object", "schema": {"type": "strin"}}}, "response_format", "strin"),
    ({"json_schema": "an object"}, "json_schema", "object"),
    ({"json_schema": {"type": "string", "pattern": "(?<=a)b"}}, "json_schema", "look"),  # unsupported: its reason
    ({"grammar": 5}, "grammar", "string"),
    ({"grammar": "root ::= ("}, "grammar", "refused"),
    ({"grammar": YES_NO, "json_schema": COLOURS}, "grammar", "json_schema"),
    ({"response_format": {"type": "json_object"}, "grammar": YES_NO}, "grammar", "response_format"),
    ({"response_format": {"type": "json_object"}, "json_schema": COLOURS}, "json_schema", "response_format"),
]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_bad_or_conflicting_grammar_is_a_400_naming_the_field(server, path):
    for fields, name, word in BAD:
        for stream in (False, True):
            status, text = server.request("POST", path, {**ENDPOINTS[path], **fields, "stream": stream,
                                                         "max_tokens": 8})
            err = json.loads(text)["error"]
            assert status == 400 and err["param"] == name and f"'{name}'" in err["message"], (fields, text)
            assert word in err["message"] and "Traceback" not in text, (fields, text)


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("stream", [False, True])
def test_each_way_of_asking_constrains_the_answer(server, path, stream):
    base = {**ENDPOINTS[path], "max_tokens": 32, "stream": stream}
    free, _, _ = answer(server, path, base)
    assert free not in ("yes", "no") and free.strip('"') not in COLOURS["enum"]  # the test can fail
    schema = {"type": "json_schema", "json_schema": {"name": "colour", "schema": COLOURS, "strict": True}}
    for fields, allowed in (({"grammar": YES_NO}, {"yes", "no"}),
                            ({"json_schema": COLOURS}, {'"red"', '"green"', '"blue"'}),
                            ({"response_format": schema}, {'"red"', '"green"', '"blue"'}),
                            ({"response_format": {"type": "json_object", "schema": COLOURS}},
                             {'"red"', '"green"', '"blue"'}),
                            ({"response_format": {"type": "text"}, "grammar": YES_NO}, {"yes", "no"})):
        text, finish, _ = answer(server, path, {**base, **fields})
        assert text in allowed and finish == "stop", (fields, text, finish)
    text, _, _ = answer(server, path, {**base, "response_format": {"type": "json_object"}})
    assert text.startswith("{")  # any object: the tiny model's may not close within max_tokens


def test_forced_tokens_are_counted_as_the_grammar_source_and_length_cuts_them(tiny):
    """A grammar of one sentence forces every token after the first; a fixed draft length drafts whatever is
    offered (an adaptive one may, on a busy machine, find no draft worth its batch), so they are drafted and
    counted as the grammar's. Cut by max_tokens, the text is a part of the sentence, finish "length"."""
    s = Server(tiny["target"], "--draft-min", "8", "--draft-max", "8", "--no-lookup-corpus")  # (as the fixture's)
    try:
        for stream in (False, True):
            path = "/v1/completions"
            body = {**ENDPOINTS[path], "grammar": f'root ::= "{SENTENCE}"', "max_tokens": 64, "stream": stream}
            text, finish, usage = answer(s, path, body)
            assert text == SENTENCE and finish == "stop"
            by_source = usage["speculative"]["by_source"]
            assert by_source.get("grammar", 0) > 0 and sum(by_source.values()) == usage["speculative"]["drafted"]
            text, finish, _ = answer(s, path, {**body, "max_tokens": 2})
            assert text and SENTENCE.startswith(text) and text != SENTENCE and finish == "length"
    finally:
        s.stop()


def test_the_servers_grammar_is_the_default_a_request_replaces(tiny):
    s = Server(tiny["target"], "--grammar", YES_NO)
    try:
        for path in ENDPOINTS:
            base = {**ENDPOINTS[path], "max_tokens": 16}
            assert answer(s, path, base)[0] in ("yes", "no")
            assert answer(s, path, {**base, "response_format": {"type": "text"}})[0] in ("yes", "no")
            assert answer(s, path, {**base, "grammar": 'root ::= "maybe"'})[0] == "maybe"
            assert answer(s, path, {**base, "json_schema": COLOURS, "stream": True})[0].strip('"') in COLOURS["enum"]
    finally:
        code, err = s.stop()
    assert "Traceback" not in err


# -- the real Gemma: JSON valid against its schema, and the openai client's parse() ------------------------------
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
TEXT = "Text: Alice Martin is 34 years old and lives in Lyon, where she teaches music."
QUESTION = "The person in the text as JSON with her name, age and city."


@pytest.fixture(scope="module")
def gemma_server(gemma_q4):
    s = Server(gemma_q4)
    yield s
    s.stop()


@pytest.mark.realmodel
@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("stream", [False, True])
def test_gemma_answers_json_valid_against_the_schema(gemma_server, path, stream):
    import jsonschema

    ask = {"messages": [{"role": "user", "content": f"{TEXT}\n{QUESTION}"}]} if "chat" in path else \
        {"prompt": f"{TEXT}\n{QUESTION}\nJSON:"}
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    text, finish, usage = answer(gemma_server, path, {**ask, "response_format": fmt, "max_tokens": 200,
                                                      "stream": stream})
    assert finish == "stop", (text, usage)
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.realmodel
def test_the_openai_clients_parse_returns_a_parsed_object(gemma_server):
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int
        city: str

    c = gemma_server.client()
    r = c.chat.completions.parse(model="gemma", messages=[{"role": "user", "content": f"{TEXT}\n{QUESTION}"}],
                                 response_format=Person, max_tokens=200)
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and person.name and r.choices[0].finish_reason == "stop"
