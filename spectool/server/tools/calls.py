"""Tool calls in chat completions: a request's `tools` and `tool_choice` checked (`read`), the
conversation's tool messages made ready for the model's chat template (`template_messages`), the
grammar that makes a call certain, and the model's text read back as OpenAI `tool_calls`, whole or
streamed (`Tools`, `Stream`). The formats themselves, one class per family, are in formats.py."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Callable

from spectool.core.grammar import tokenizer_for
from spectool.server.tools.formats import FORMATS, Format, Generic, detect

NATIVE_PROMPT = ("You can call these tools (JSON schemas of their arguments):\n{tools}\n\n"
                 "To call one, write:\n{example}")


class ToolError(ValueError):
    """A request's tools, tool_choice or tool messages are malformed: `param` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass
class Tools:
    """A request's tools in the format of the model's template (formats.FORMATS' name): `choice` is
    auto, none, required or a function's name."""

    format: str
    tools: list[dict]
    choice: str = "auto"
    describe: bool = False  # the template does not read `tools`: they go in a system message
    ids: list[str] = field(default_factory=list)
    parallel: bool = True  # parallel_tool_calls: false keeps a reply's first call only
    # the schema of the request's response_format: under `auto` the reply is an answer in it or a
    # call (OpenAI's reading; llama.cpp 0.3.36 drops the tools instead)
    answer: dict | None = None

    @property
    def family(self) -> Format:
        return FORMATS[self.format]

    @property
    def named(self) -> dict[str, dict]:
        return {t["function"]["name"]: t["function"] for t in self.tools}

    @property
    def constrained(self) -> bool:
        """Whether the reply is held to a grammar: always but under `none` (auto: a lazy one, see
        grammar)."""
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether the reply is all a call (required, named) or JSON (the generic format): nothing
        to stream before its end."""
        return self.choice not in ("none", "auto") or self.format == Generic.name

    def grammar(self, model):
        """The Grammar of the reply (None under `none`): a call of one of the tools (the named one),
        its markers included; under `auto` a lazy one, or with an `answer` schema the answer or a
        call (formats.Format.grammar)."""
        if not self.constrained:
            return None

        def lit(text: str) -> str:  # a special token by its id: llguidance matches no text to it
            ids = model.tokenize(text, add_special=False, parse_special=True)  # (Qwen2.5's
            special = len(ids) == 1 and tokenizer_for(model).tokenizer.is_special_token(ids[0])
            return f"<[{ids[0]}]>" if special else json.dumps(text)  # user-defined <tool_call> too)

        fns = [self.named[self.choice]] if self.choice in self.named else list(self.named.values())
        return self.family.grammar(fns, self.choice == "auto", lit, self.answer)

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, OpenAI tool_calls) of a whole reply; text that holds no call is all content."""
        found = self.family.parse(text) if self.choice != "none" else None
        if found is None:
            return text, []
        content, calls = found
        if self.answer is not None and not {c.name for c in calls} <= set(self.named):
            return text, []  # an answer whose JSON reads as a call (Llama 3's bare calls)
        calls = calls if self.parallel else calls[:1]
        out = []
        for i, call in enumerate(calls):
            if i >= len(self.ids):
                self.ids.append(call.id or f"call_{uuid.uuid4().hex[:24]}")
            arguments = (call.arguments if isinstance(call.arguments, str)
                         else json.dumps(call.arguments))
            out.append({"id": self.ids[i], "type": "function",
                        "function": {"name": call.name, "arguments": arguments}})
        return content or None, out

    def message(self, text: str) -> tuple[dict, bool]:
        """The assistant message of a reply, and whether it calls tools."""
        content, calls = self.parse(text)
        msg: dict = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        return msg, bool(calls)

    def streamer(self) -> Stream:
        return Stream(self)


class Stream:
    """A streamed reply as chat-completion deltas: text that cannot start a call streams as content
    at once; from a call's opening (or text that may become one) it is held, and read as calls at
    the end, each sent whole in one delta (index, id, type, name and arguments), as the openai
    client's stream helpers accept."""

    def __init__(self, tools: Tools):
        self.tools = tools
        self.text = ""
        self.sent = 0
        self.held = tools.forced

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        if self.held:
            return []
        if self.tools.choice == "none":
            return self.content(len(self.text))
        family = self.tools.family
        opening = family.opening
        at = self.text.find(opening) if opening else -1
        bare = family.bare and not self.sent  # a call may open the reply bare
        if at < 0 and bare and self.text.lstrip()[:1] in ("{", "["):
            at = 0
        if at >= 0:
            self.held = True
            return self.content(at, strip=True)
        if bare and not self.text.strip():
            return []
        keep = next((n for n in range(min(len(opening), len(self.text)), 0, -1)
                     # text that may be the opening's start
                     if opening.startswith(self.text[-n:])), 0)
        return self.content(len(self.text) - keep, strip=True)

    def content(self, end: int, strip: bool = False) -> list[dict]:
        out = self.text[self.sent:end]
        if strip:
            out = out.rstrip()  # whitespace before a call is not content
        self.sent += len(out)
        return [{"content": out}] if out else []

    def end(self) -> tuple[list[dict], bool]:
        """The deltas still to send once the reply is complete, and whether it called tools."""
        content, calls = self.tools.parse(self.text)
        if not calls:
            rest = (content or "")[self.sent:] if (content
                                                   or "").startswith(self.text[:self.sent]) else ""
            return ([{"content": rest}] if rest else []), False
        deltas = [{"content": content[self.sent:]}] if content and len(content) > self.sent else []
        return deltas + [{"tool_calls": [{"index": i, **c}]} for i, c in enumerate(calls)], True


def read(body: dict, template: str | None) -> Tools | None:
    """The request's tools and tool_choice in the template's format, None when it offers none; a
    ToolError naming the field for anything malformed: a tool whose parameters the grammar library
    refuses as a JSON schema, a tool_choice naming no tool."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise ToolError("tool_choice",
                            f"'tool_choice' is {json.dumps(choice)[:60]} but the request has no "
                                           "tools")
        return None
    if not isinstance(tools, list):
        raise ToolError("tools",
                        "'tools' must be a list of {\"type\": \"function\", \"function\": "
                        "{...}} objects")
    checked = [checked_tool(t, i) for i, t in enumerate(tools)]
    fmt = detect(template)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, (bool, type(None))):
        raise ToolError("parallel_tool_calls", "'parallel_tool_calls' must be true or false")
    return Tools(fmt, checked, tool_choice(choice, [t["function"]["name"] for t in checked]),
                 describe=fmt == Generic.name or "tools" not in (template or ""),
                 parallel=parallel is not False)


def checked_tool(t, i: int) -> dict:
    """tools[i] as a function tool whose parameters are a JSON schema the grammar library takes."""
    from spectool.core.grammar import Grammar, GrammarError

    fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ToolError("tools",
                        f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": "
                        "..., \"parameters\": {...}}}")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    try:
        Grammar.json_schema(params)
    except GrammarError as e:
        raise ToolError("tools",
                        f"'tools[{i}].function.parameters' is not a usable JSON schema: "
                        f"{e}") from None
    return {"type": "function", "function": {**fn, "parameters": params}}


def tool_choice(choice, names: list[str]) -> str:
    """The request's tool_choice: auto (the default), none, required, or the name of the function it
    names."""
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names:
            raise ToolError("tool_choice",
                            f"'tool_choice' names {json.dumps(name)}, which is not one of the "
                            f"tools ({', '.join(names)})")
        return name
    if choice is None:
        return "auto"
    if choice not in ("auto", "none", "required"):
        raise ToolError("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                       "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    return choice


def template_messages(messages: list[dict], content: Callable[[dict, int], str],
                      template: str | None,
                      tools: Tools | None) -> list[dict]:
    """The request's messages as the template reads them: a tool result with its `tool_call_id`, an
    assistant's `tool_calls` with their arguments as objects (templates write them with tojson) and
    null content as "". For the generic format (or a template that does not read `tools`), the tools
    are described in the system message, and calls and results are written as JSON text in ordinary
    user and assistant turns."""
    plain = (tools.format if tools else detect(template)) == Generic.name
    out: list[dict] = []
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            tool_result(out, m, i, content, plain)
        elif m["role"] == "assistant" and m.get("tool_calls"):
            out.append(assistant_calls(m, i, content, plain))
        else:
            out.append({"role": m["role"], "content": content(m, i)})
    for m in out:
        m.pop("tool_result", None)
    if tools and tools.describe and tools.choice != "none":
        described(out, tools, template)
    return out


def tool_result(out: list[dict], m: dict, i: int, content: Callable[[dict, int], str],
                plain: bool) -> None:
    """A tool message appended to `out`: as the template reads it, or in the generic format a user
    turn of JSON (results in a row: one user turn, as roles alternate)."""
    if not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]:
        raise ToolError("messages", f"'messages[{i}]' is a tool result without a 'tool_call_id'")
    text = content(m, i)
    if not plain:
        out.append({"role": "tool", "content": text, "tool_call_id": m["tool_call_id"]}
                   | ({"name": m["name"]} if isinstance(m.get("name"), str) else {}))
        return
    result = json.dumps({"tool_response": {"tool_call_id": m["tool_call_id"], "content": text}})
    if out and out[-1].get("tool_result"):
        out[-1]["content"] += "\n" + result
    else:
        out.append({"role": "user", "content": result, "tool_result": True})


def assistant_calls(m: dict, i: int, content: Callable[[dict, int], str], plain: bool) -> dict:
    """An assistant message with tool calls: as the template reads it, or in the generic format its
    JSON."""
    calls = m["tool_calls"]
    parsed = [checked_call(c, i, j)
              for j, c in enumerate(calls if isinstance(calls, list) else [None])]
    text = "" if m.get("content") is None else content(m, i)
    if not plain:
        return {"role": "assistant", "content": text, "tool_calls": parsed}
    named = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in parsed]
    return {"role": "assistant", "content": json.dumps(
        {"tool_call": named[0]} if len(named) == 1 else {"tool_calls": named})}


def described(out: list[dict], tools: Tools, template: str | None) -> None:
    """The tools described in the conversation's system message (one made where there is none)."""
    listed = json.dumps([t["function"] for t in tools.tools], indent=2)
    family = tools.family
    if family.name == Generic.name:
        text = Generic.PROMPT.format(tools=listed)
    else:
        text = NATIVE_PROMPT.format(tools=listed, example=family.example)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + text}
    elif "System role not supported" in (template or "") and out and out[0]["role"] == "user":
        # Gemma 2's: no system turn
        out[0] = {**out[0], "content": text + "\n\n" + out[0]["content"]}
    else:
        out.insert(0, {"role": "system", "content": text})


def checked_call(c, i: int, j: int) -> dict:
    """An assistant message's tool call checked, its arguments (a JSON string) as an object."""
    where = f"messages[{i}].tool_calls[{j}]"
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ToolError("messages",
                        f"'{where}' must be {{\"type\": \"function\", \"id\": ..., \"function\": "
                                    "{\"name\": ..., \"arguments\": \"<JSON text>\"}}")
    args = fn.get("arguments", "{}")
    try:
        if not isinstance(args, str):
            raise ValueError
        value = json.loads(args)
    except ValueError:
        raise ToolError("messages",
                        f"'{where}.function.arguments' must be a string of JSON (as OpenAI sends "
                                    "it)") from None
    return {"id": c.get("id", ""), "type": "function",
            "function": {"name": fn["name"], "arguments": value}}
