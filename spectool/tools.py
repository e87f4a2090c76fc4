"""Tool calls in chat completions: a request's `tools` and `tool_choice` checked, the conversation's tool messages
made ready for the model's chat template, the grammar that makes a call certain, and the model's text read back
as OpenAI `tool_calls`, whole or streamed.

The call format is found in the template's text, as llama.cpp's common/chat.cpp finds it: Hermes `<tool_call>`
JSON (Qwen2.5, Qwen3), Llama 3.x's bare JSON, Mistral's `[TOOL_CALLS]`, DeepSeek R1's and GLM 4.5's own markers,
and for a template that knows no tools (or none at all) llama.cpp's generic format: the tools described in a
system message and every reply a JSON object, a call (`{"tool_call": {name, arguments}}`) or an answer
(`{"response": "..."}`). Special tokens render as no text (vocab.Facts.piece), so a format's markers that are
special tokens are optional when the text is read back.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Callable

GENERIC_PROMPT = ("You can call these tools (JSON schemas of their arguments):\n{tools}\n\n"
                  "Reply with a JSON object: either {{\"tool_call\": {{\"name\": <tool name>, \"arguments\": "
                  "<arguments object>}}}} to call a tool, or {{\"response\": <your reply as a string>}} to answer.")
NATIVE_PROMPT = "You can call these tools (JSON schemas of their arguments):\n{tools}\n\nTo call one, write:\n{example}"
EXAMPLES = {"deepseek_r1": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n"
                           "{\"argument\": \"value\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}
# each format's opening of a call: where streamed text is held back, and where a reply's content ends
OPENINGS = {"hermes": "<tool_call>", "glm45": "<tool_call>", "mistral": "[TOOL_CALLS]",
            "deepseek_r1": "<｜tool▁calls▁begin｜>", "llama3": "<|python_tag|>"}
R1_CALL = re.compile(r"(?:<｜tool▁call▁begin｜>)?function(?:<｜tool▁sep｜>)?\s*([^\n`]+?)\s*\n```json\n(.*?)\n```"
                     r"(?:<｜tool▁call▁end｜>)?", re.S)
GLM_CALL = re.compile(r"<tool_call>\s*([^\n<]+?)\s*\n(.*?)</tool_call>", re.S)
GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def detect(template: str | None) -> str:
    """The tool-call format of a chat template, by the markers its text writes (chat.cpp's way)."""
    t = template or ""
    if "<arg_key>" in t and "<tool_call>" in t:
        return "glm45"
    if "<｜tool▁calls▁begin｜>" in t:
        return "deepseek_r1"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<tool_call>" in t:
        return "hermes"
    if "<|start_header_id|>" in t and "ipython" in t:
        return "llama3"
    return "generic"


class ToolError(ValueError):
    """A request's tools, tool_choice or tool messages are malformed: `param` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass
class Tools:
    """A request's tools in the format of the model's template: `choice` is auto, none, required or a function's
    name."""

    format: str
    tools: list[dict]
    choice: str = "auto"
    describe: bool = False  # the template does not read `tools`: they go in a system message
    ids: list[str] = field(default_factory=list)

    @property
    def named(self) -> dict[str, dict]:
        return {t["function"]["name"]: t["function"] for t in self.tools}

    @property
    def constrained(self) -> bool:
        """Whether the reply is held to a grammar: always but under `none` (auto: a lazy one, see grammar)."""
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether the reply is all a call (required, named) or JSON (the generic format): nothing to stream
        before its end."""
        return self.choice not in ("none", "auto") or self.format == "generic"

    def grammar(self, model):
        """The Grammar of the reply: a call of one of the tools (the named one), its markers included. Under `auto`
        a lazy one, as llama.cpp's grammar triggers: any text up to a call's opening, then the call; the generic
        format's `auto` allows a call or the JSON answer."""
        if not self.constrained:
            return None
        from spectool.core.grammar import Grammar, lark_json

        fns = [self.named[self.choice]] if self.choice in self.named else list(self.named.values())
        if self.format == "generic":
            call = {"type": "object", "properties": {"tool_call": {"anyOf": [_call_schema(f) for f in fns]}},
                    "required": ["tool_call"]}
            answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
            return Grammar.json_schema(call if self.choice != "auto" else {"anyOf": [call, answer]})

        def lit(text: str) -> str:  # a special token by its id: it has no text to match
            ids = model.tokenize(text, add_special=False, parse_special=True)
            return f"<[{ids[0]}]>" if len(ids) == 1 and not model.piece(ids[0]) else json.dumps(text)

        calls = "calls: " + " | ".join(_call_rule(self.format, f, lit, lark_json) for f in fns) + "\n"
        opening = OPENINGS.get(self.format) if self.format != "llama3" else None
        if self.choice != "auto":
            return Grammar.lark(f"start: {lit(opening) if opening else ''} calls\n" + calls)
        if opening is None:  # Llama 3.x: a reply that opens with "{" is a call
            return Grammar.lark("start: TEXT | WS calls\nTEXT: /(?s:.*)/ & ~/[ \\t\\n]*\\{(?s:.*)/\n"
                                "WS: /[ \\t\\n]*/\n" + calls)
        if lit(opening).startswith("<["):  # a special token ends the free text
            return Grammar.lark(f"start: TEXT | TEXT {lit(opening)} calls\nTEXT: /(?s:.*)/\n" + calls)
        o = re.escape(opening)  # the text up to the opening's first occurrence, then the call
        return Grammar.lark(f"start: TEXT | OPEN calls\nTEXT: /(?s:.*)/ & ~/(?s:.*{o}.*)/\n"
                            f"OPEN: /(?s:.*){o}/ & ~/(?s:.*{o}.+)/\n" + calls)

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, OpenAI tool_calls) of a whole reply; text that holds no call is all content."""
        if self.choice == "none":
            return text, []
        found = _parse(self.format, text)
        if found is None:
            return text, []
        content, calls = found
        out = []
        for i, (name, args, cid) in enumerate(calls):
            if i >= len(self.ids):
                self.ids.append(cid or f"call_{uuid.uuid4().hex[:24]}")
            out.append({"id": self.ids[i], "type": "function",
                        "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}})
        return content or None, out

    def message(self, text: str) -> tuple[dict, bool]:
        """The assistant message of a reply, and whether it calls tools."""
        content, calls = self.parse(text)
        msg = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        return msg, bool(calls)

    def streamer(self) -> Stream:
        return Stream(self)


def _call_schema(fn: dict) -> dict:
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": fn["parameters"]},
            "required": ["name", "arguments"]}


def _call_rule(fmt: str, fn: dict, lit: Callable[[str], str], lark_json: Callable[[dict], str]) -> str:
    """A Lark expansion of one call of `fn` in format `fmt` after its opening (OPENINGS), markers included."""
    name, params = fn["name"], fn["parameters"]
    if fmt == "hermes":
        return f'"\\n" {lark_json(_call_schema(fn))} "\\n" {lit("</tool_call>")}'
    if fmt == "llama3":
        return lark_json({"type": "object", "properties": {"name": {"const": name}, "parameters": params},
                          "required": ["name", "parameters"]})
    if fmt == "mistral":
        item = {**_call_schema(fn), "properties": {**_call_schema(fn)["properties"],
                                                   "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}}}
        return lark_json({"type": "array", "items": item, "minItems": 1, "maxItems": 1})
    if fmt == "deepseek_r1":
        return (f'{lit("<｜tool▁call▁begin｜>")} "function" {lit("<｜tool▁sep｜>")} '
                f'{json.dumps(name + chr(10) + "```json" + chr(10))} {lark_json(params)} "\\n```" '
                f'{lit("<｜tool▁call▁end｜>")} {lit("<｜tool▁calls▁end｜>")}')
    # glm45: its arguments are key/value pairs, not JSON: the keys the schema lists, values up to the next tag
    keys = " | ".join(json.dumps(k) for k in params.get("properties", {})) or '""'
    pair = f'"<arg_key>" ({keys}) "</arg_key>\\n<arg_value>" /[^<]*/ "</arg_value>\\n"'
    return f'{json.dumps(name + chr(10))} ({pair})* {lit("</tool_call>")}'


def _parse(fmt: str, text: str) -> tuple[str, list[tuple[str, object, str | None]]] | None:
    """(content, [(name, arguments, id or None)]) of the calls in `text`, None when there are none."""
    decode = json.JSONDecoder().raw_decode
    if fmt == "generic":
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        raw = obj.get("tool_calls") or ([obj["tool_call"]] if isinstance(obj.get("tool_call"), dict) else [])
        calls = [(c["name"], c.get("arguments", {}), c.get("id")) for c in raw
                 if isinstance(c, dict) and isinstance(c.get("name"), str)]
        if calls:
            return "", calls
        return (obj["response"], []) if isinstance(obj.get("response"), str) else None
    if fmt == "hermes":
        calls, start = [], text.find("<tool_call>")
        if start < 0:
            return None
        for piece in text[start:].split("<tool_call>")[1:]:
            try:
                obj, _ = decode(piece.lstrip())
            except ValueError:
                return None
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return None
            calls.append((obj["name"], obj.get("arguments", {}), None))
        return text[:start].rstrip(), calls
    if fmt in ("llama3", "mistral"):
        marker = OPENINGS[fmt]
        start = text.find(marker)
        body, content = (text[start + len(marker):], text[:start]) if start >= 0 else (text, "")
        try:
            obj, _ = decode(body.lstrip())
        except ValueError:
            return None
        items = obj if isinstance(obj, list) else [obj]
        key = "parameters" if fmt == "llama3" else "arguments"
        calls = [(c["name"], c.get(key, c.get("arguments", {})), c.get("id") if fmt == "mistral" else None)
                 for c in items if isinstance(c, dict) and isinstance(c.get("name"), str)]
        return (content.rstrip(), calls) if calls and len(calls) == len(items) else None
    if fmt == "deepseek_r1":
        found = list(R1_CALL.finditer(text))
        if not found:
            return None
        start = text.find(OPENINGS[fmt])
        content = text[:start if 0 <= start < found[0].start() else found[0].start()]
        try:
            return content.rstrip(), [(m.group(1), json.loads(m.group(2)), None) for m in found]
        except ValueError:
            return None
    found = list(GLM_CALL.finditer(text))  # glm45
    if not found:
        return None
    return text[:found[0].start()].rstrip(), [
        (m.group(1), {k.strip(): _glm_value(v) for k, v in GLM_ARG.findall(m.group(2))}, None) for m in found]


def _glm_value(v: str):
    try:
        return json.loads(v)
    except ValueError:
        return v


class Stream:
    """A streamed reply as chat-completion deltas: text that cannot start a call streams as content at once; from
    a call's opening (or text that may become one) it is held, and read as calls at the end, each sent whole in
    one delta (index, id, type, name and arguments), as the openai client's stream helpers accept."""

    def __init__(self, tools: Tools):
        self.tools, self.text, self.sent, self.held = tools, "", 0, tools.forced

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        if self.held:
            return []
        if self.tools.choice == "none":
            return self._content(len(self.text))
        opening = OPENINGS.get(self.tools.format, "")
        at = self.text.find(opening) if opening else -1
        bare = self.tools.format in ("llama3", "mistral") and not self.sent  # a call may open the reply bare
        if at < 0 and bare and self.text.lstrip()[:1] in ("{", "["):
            at = 0
        if at >= 0:
            self.held = True
            return self._content(at, strip=True)
        if bare and not self.text.strip():
            return []
        keep = next((n for n in range(min(len(opening), len(self.text)), 0, -1)
                     if opening.startswith(self.text[-n:])), 0)  # text that may be the opening's start
        return self._content(len(self.text) - keep, strip=True)

    def _content(self, end: int, strip: bool = False) -> list[dict]:
        out = self.text[self.sent:end]
        if strip:
            out = out.rstrip()  # whitespace before a call is not content
        self.sent += len(out)
        return [{"content": out}] if out else []

    def end(self) -> tuple[list[dict], bool]:
        """The deltas still to send once the reply is complete, and whether it called tools."""
        content, calls = self.tools.parse(self.text)
        if not calls:
            rest = (content or "")[self.sent:] if (content or "").startswith(self.text[:self.sent]) else ""
            return ([{"content": rest}] if rest else []), False
        deltas = [{"content": content[self.sent:]}] if content and len(content) > self.sent else []
        return deltas + [{"tool_calls": [{"index": i, **c}]} for i, c in enumerate(calls)], True


def read(body: dict, template: str | None) -> Tools | None:
    """The request's tools and tool_choice in the template's format, None when it offers none; a ToolError naming
    the field for anything malformed: a tool whose parameters the grammar library refuses as a JSON schema, a
    tool_choice naming no tool."""
    from spectool.core.grammar import Grammar, GrammarError

    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise ToolError("tool_choice", f"'tool_choice' is {json.dumps(choice)[:60]} but the request has no tools")
        return None
    if not isinstance(tools, list):
        raise ToolError("tools", "'tools' must be a list of {\"type\": \"function\", \"function\": {...}} objects")
    checked = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolError("tools", f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                                     "\"parameters\": {...}}}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        try:
            Grammar.json_schema(params)
        except GrammarError as e:
            raise ToolError("tools", f"'tools[{i}].function.parameters' is not a usable JSON schema: {e}") from None
        checked.append({"type": "function", "function": {**fn, "parameters": params}})
    names = [t["function"]["name"] for t in checked]
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names:
            raise ToolError("tool_choice", f"'tool_choice' names {json.dumps(name)}, which is not one of the tools "
                                           f"({', '.join(names)})")
        choice = name
    elif choice is None:
        choice = "auto"
    elif choice not in ("auto", "none", "required"):
        raise ToolError("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                       "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    fmt = detect(template)
    return Tools(fmt, checked, choice, describe=fmt == "generic" or "tools" not in (template or ""))


def template_messages(messages: list[dict], content: Callable[[dict, int], str], template: str | None,
                      tools: Tools | None) -> list[dict]:
    """The request's messages as the template reads them: a tool result with its `tool_call_id`, an assistant's
    `tool_calls` with their arguments as objects (templates write them with tojson) and null content as "". For
    the generic format (or a template that does not read `tools`), the tools are described in the system message,
    and calls and results are written as JSON text in ordinary user and assistant turns."""
    fmt = tools.format if tools else detect(template)
    plain = fmt == "generic"
    out: list[dict] = []
    for i, m in enumerate(messages):
        role, calls = m["role"], m.get("tool_calls")
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]:
                raise ToolError("messages", f"'messages[{i}]' is a tool result without a 'tool_call_id'")
            text = content(m, i)
            if plain:
                result = json.dumps({"tool_response": {"tool_call_id": m["tool_call_id"], "content": text}})
                if out and out[-1].get("tool_result"):  # results in a row: one user turn (roles alternate)
                    out[-1]["content"] += "\n" + result
                else:
                    out.append({"role": "user", "content": result, "tool_result": True})
            else:
                out.append({"role": "tool", "content": text, "tool_call_id": m["tool_call_id"]}
                           | ({"name": m["name"]} if isinstance(m.get("name"), str) else {}))
        elif role == "assistant" and calls:
            parsed = [_call(c, i, j) for j, c in enumerate(calls if isinstance(calls, list) else [None])]
            text = "" if m.get("content") is None else content(m, i)
            if plain:
                out.append({"role": "assistant", "content": json.dumps(
                    {"tool_call": {"name": parsed[0]["function"]["name"],
                                   "arguments": parsed[0]["function"]["arguments"]}} if len(parsed) == 1 else
                    {"tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                    for c in parsed]})})
            else:
                out.append({"role": "assistant", "content": text, "tool_calls": parsed})
        else:
            out.append({"role": role, "content": content(m, i)})
    for m in out:
        m.pop("tool_result", None)
    if tools and tools.describe and tools.choice != "none":
        listed = json.dumps([t["function"] for t in tools.tools], indent=2)
        described = GENERIC_PROMPT.format(tools=listed) if plain else NATIVE_PROMPT.format(
            tools=listed, example=EXAMPLES.get(fmt, ""))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + described}
        elif "System role not supported" in (template or "") and out and out[0]["role"] == "user":
            out[0] = {**out[0], "content": described + "\n\n" + out[0]["content"]}  # Gemma 2's: no system turn
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def _call(c, i: int, j: int) -> dict:
    """An assistant message's tool call checked, its arguments (a JSON string) as an object."""
    where = f"messages[{i}].tool_calls[{j}]"
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ToolError("messages", f"'{where}' must be {{\"type\": \"function\", \"id\": ..., \"function\": "
                                    "{\"name\": ..., \"arguments\": \"<JSON text>\"}}")
    args = fn.get("arguments", "{}")
    try:
        if not isinstance(args, str):
            raise ValueError
        value = json.loads(args)
    except ValueError:
        raise ToolError("messages", f"'{where}.function.arguments' must be a string of JSON (as OpenAI sends it)") \
            from None
    return {"id": c.get("id", ""), "type": "function", "function": {"name": fn["name"], "arguments": value}}
