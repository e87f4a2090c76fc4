"""The scripted model the agent clients' tests run (tinymodels.write_script_model): llama.cpp's greedy output is
the tool call while no tool result is in the conversation, the plain answer once one is, however far back."""

import numpy as np
import pytest

CALL = '{"name": "Bash", "arguments": {"command": "echo spectool-$((6*7))"}}'
ANSWER = "Done: the tool ran."
TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    from spectool.llama.engine import Model
    from spectool_lab.tinymodels import write_script_model

    with Model(write_script_model(tmp_path_factory.mktemp("script"), CALL, ANSWER), n_ctx=8192,
               n_threads=2) as m:
        yield m


def greedy(model, messages, tools=TOOLS) -> str:
    """The reply's text, argmax by argmax, to the end of turn (at most 40 tokens)."""
    from spectool.templates import prompt_tokens

    model.reset()
    model.eval(prompt_tokens(model, messages, tools))
    end = model.tokenize("<|im_end|>", add_special=False, parse_special=True)
    out: list[int] = []
    while len(out) < 40 and out[-1:] != end:
        out.append(int(np.argmax(model.logits())))
        model.eval(out[-1:])
    assert out[-1:] == end
    return b"".join(model.piece(t) for t in out[:-1]).decode()


def conversation(filler: int, result: bool) -> list[dict]:
    user = [{"role": "user", "content": "Run the command, please. " * filler}]
    if not result:
        return user
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "echo"}}}
    return user + [{"role": "assistant", "content": "", "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "c1", "content": "spectool-42"},
                   {"role": "user", "content": "And now, what did it print? " * filler}]


@pytest.mark.parametrize("filler", [1, 200])
def test_the_call_until_a_tool_result_then_the_answer(scripted, filler):
    assert greedy(scripted, conversation(filler, False)) == f"<tool_call>\n{CALL}\n</tool_call>"
    assert greedy(scripted, conversation(filler, True)) == ANSWER
    assert greedy(scripted, [{"role": "system", "content": "Be brief."}, *conversation(filler, False)],
                  tools=None) == f"<tool_call>\n{CALL}\n</tool_call>"  # no tools: the same text


def test_the_tool_result_is_one_token_the_prompt_never_makes_of_text(scripted):
    """`<tool_response>` is the template's token (user-defined, as in Qwen2.5's GGUF); the answer's words
    alone never switch the model."""
    assert len(scripted.tokenize("<tool_response>", add_special=False, parse_special=True)) == 1
    assert greedy(scripted, [{"role": "user", "content": "tool_response " + ANSWER}]).startswith("<tool_call>")


def test_served_its_call_is_a_tool_call_and_its_answer_text(tmp_path):
    """Through `spectool serve` under tool_choice auto: Qwen2.5's `<tool_call>` is a user-defined token, which
    llguidance counts as special, so the grammar names it by its id (a text literal masked it: the reply became the
    answer's words)."""
    from spectool_lab.helpers import Server
    from spectool_lab.tinymodels import write_script_model

    server = Server(write_script_model(tmp_path, CALL, ANSWER))
    try:
        client = server.client()
        messages = conversation(1, False)
        r = client.chat.completions.create(model="x", messages=messages, tools=TOOLS).choices[0]
        assert (r.finish_reason, r.message.content) == ("tool_calls", None)
        call = r.message.tool_calls[0]
        assert (call.function.name, call.function.arguments) == ("Bash", '{"command": "echo spectool-$((6*7))"}')
        messages += [r.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "spectool-42"}]
        r = client.chat.completions.create(model="x", messages=messages, tools=TOOLS).choices[0]
        assert (r.finish_reason, r.message.content) == ("stop", ANSWER)
    finally:
        server.stop()


def test_under_a_json_schema_it_closes_at_once(tmp_path):
    """A client's JSON schema masks the script (Claude Code's title request): the model's next choices close the
    JSON, so the answer ends in a few tokens, not at max_tokens."""
    from spectool_lab.helpers import Server
    from spectool_lab.tinymodels import write_script_model

    server = Server(write_script_model(tmp_path, CALL, ANSWER))
    try:
        schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
        r = server.client().chat.completions.create(
            model="x", messages=conversation(1, False), max_tokens=200,
            response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
        assert (r.choices[0].finish_reason, r.choices[0].message.content) == ("stop", '{"title":""}')
    finally:
        server.stop()
