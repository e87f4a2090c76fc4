"""The tool-call formats, one class per family as llama.cpp's common/chat.cpp has one parser per
format: how a chat template shows it (`shows`), how a call opens, the grammar of a reply that calls
(`grammar`), and how calls are read back from a reply (`parse`).

Hermes `<tool_call>` JSON (Qwen2.5, Qwen3), Llama 3.x's bare JSON, Mistral's `[TOOL_CALLS]`,
DeepSeek R1's and GLM 4.5's own markers, and for a template that knows no tools (or none at all)
llama.cpp's generic format: every reply a JSON object, a call (`{"tool_call": {name, arguments}}`)
or an answer (`{"response": "..."}`). Special tokens render as no text (vocab.Facts.piece), so a
format's markers that are special tokens are optional when the text is read back.
"""

from __future__ import annotations

import json
import re
from typing import Callable, ClassVar, NamedTuple

from spectool.core.grammar import Grammar, lark_json

# text -> its Lark literal (a special token by its id: it has no text to match)
Literal = Callable[[str], str]


class Call(NamedTuple):
    """A call read back from a reply: the function's name, its arguments (an object, or JSON text)
    and the id the model gave it (None: none)."""

    name: str
    arguments: object
    id: str | None = None


def call_schema(fn: dict) -> dict:
    """The JSON schema of {"name": fn's name, "arguments": its parameters}."""
    return {"type": "object",
            "properties": {"name": {"const": fn["name"]}, "arguments": fn["parameters"]},
            "required": ["name", "arguments"]}


def first_json(text: str) -> object:
    """The JSON value at the start of `text` (after whitespace); ValueError where there is none."""
    obj, _ = json.JSONDecoder().raw_decode(text.lstrip())
    return obj


class Format:
    """A family whose calls open with a marker (`opening`) after any text: the reply under `auto` is
    text, or text up to the opening and then calls; under `required` (or a named function), calls
    alone."""

    name: ClassVar[str]
    opening: ClassVar[str] = ""  # where streamed text is held back, and a reply's content ends
    example: ClassVar[str] = ""  # how to write a call, for a template that does not read `tools`
    bare: ClassVar[bool] = False  # a call may open a reply without its opening

    @staticmethod
    def shows(template: str) -> bool:
        raise NotImplementedError

    def call(self, fn: dict, lit: Literal) -> str:
        """A Lark expansion of one call of `fn` after the opening, markers included."""
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str, list[Call]] | None:
        """(content, the calls) of a whole reply, None where it holds none."""
        raise NotImplementedError

    def grammar(self, fns: list[dict], auto: bool, lit: Literal,
                answer: dict | None = None) -> Grammar:
        """The grammar of a reply: a call of one of `fns`, or under `auto` any text up to a call's
        opening and then the call (as llama.cpp's grammar triggers); with an `answer` schema (the
        request's response_format), under `auto` an answer in it or a call."""
        calls = "calls: " + " | ".join(self.call(f, lit) for f in fns) + "\n"
        opening = lit(self.opening)
        if not auto:
            return Grammar.lark(f"start: {opening} calls\n" + calls)
        if answer is not None:
            return Grammar.lark(f"start: answer | {opening} calls\nanswer: {lark_json(answer)}\n"
                                + calls)
        if opening.startswith("<["):  # a special token ends the free text
            return Grammar.lark(f"start: TEXT | TEXT {opening} calls\nTEXT: /(?s:.*)/\n" + calls)
        o = re.escape(self.opening)  # the text up to the opening's first occurrence, then the call
        return Grammar.lark(f"start: TEXT | OPEN calls\nTEXT: /(?s:.*)/ & ~/(?s:.*{o}.*)/\n"
                            f"OPEN: /(?s:.*){o}/ & ~/(?s:.*{o}.+)/\n" + calls)


class Hermes(Format):
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Qwen2.5, Qwen3)."""

    name, opening = "hermes", "<tool_call>"

    @staticmethod
    def shows(template: str) -> bool:
        return "<tool_call>" in template

    def call(self, fn: dict, lit: Literal) -> str:
        return f'"\\n" {lark_json(call_schema(fn))} "\\n" {lit("</tool_call>")}'

    def parse(self, text: str) -> tuple[str, list[Call]] | None:
        start = text.find(self.opening)
        if start < 0:
            return None
        calls = []
        for piece in text[start:].split(self.opening)[1:]:
            try:
                obj = first_json(piece)
            except ValueError:
                return None
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return None
            calls.append(Call(obj["name"], obj.get("arguments", {})))
        return text[:start].rstrip(), calls


class Llama3(Format):
    """Llama 3.x: `{"name": ..., "parameters": {...}}`, bare or after `<|python_tag|>`; a reply that
    opens with "{" is a call."""

    name, opening, bare = "llama3", "<|python_tag|>", True
    key: ClassVar[str] = "parameters"  # the arguments' key in a call

    @staticmethod
    def shows(template: str) -> bool:
        return "<|start_header_id|>" in template and "ipython" in template

    def call(self, fn: dict, lit: Literal) -> str:
        return lark_json({"type": "object", "properties": {"name": {"const": fn["name"]},
                                                           "parameters": fn["parameters"]},
                          "required": ["name", "parameters"]})

    def grammar(self, fns: list[dict], auto: bool, lit: Literal,
                answer: dict | None = None) -> Grammar:
        calls = "calls: " + " | ".join(self.call(f, lit) for f in fns) + "\n"
        if not auto:
            return Grammar.lark("start: calls\n" + calls)
        if answer is not None:  # both JSON: Tools.parse reads a call only where it names a tool
            return Grammar.lark(f"start: answer | WS calls\nanswer: {lark_json(answer)}\n"
                                "WS: /[ \\t\\n]*/\n" + calls)
        return Grammar.lark("start: TEXT | WS calls\nTEXT: /(?s:.*)/ & ~/[ \\t\\n]*\\{(?s:.*)/\n"
                            "WS: /[ \\t\\n]*/\n" + calls)

    def parse(self, text: str) -> tuple[str, list[Call]] | None:
        start = text.find(self.opening)
        body, content = ((text[start + len(self.opening):], text[:start]) if start >= 0
                         else (text, ""))
        try:
            obj = first_json(body)
        except ValueError:
            return None
        items = obj if isinstance(obj, list) else [obj]
        calls = [self.read(c) for c in items if isinstance(c, dict)
                 and isinstance(c.get("name"), str)]
        return (content.rstrip(), calls) if calls and len(calls) == len(items) else None

    def read(self, c: dict) -> Call:
        return Call(c["name"], c.get(self.key, c.get("arguments", {})))


class Mistral(Llama3):
    """`[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abcdefghi"}]`: the model's own id,
    which its template checks."""

    name, opening, key = "mistral", "[TOOL_CALLS]", "arguments"

    @staticmethod
    def shows(template: str) -> bool:
        return "[TOOL_CALLS]" in template

    def call(self, fn: dict, lit: Literal) -> str:
        schema = call_schema(fn)
        item = {**schema, "properties": {**schema["properties"],
                                         "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}}}
        return lark_json({"type": "array", "items": item, "minItems": 1, "maxItems": 1})

    grammar = Format.grammar

    def read(self, c: dict) -> Call:
        return Call(c["name"], c.get("arguments", {}), c.get("id"))


class DeepSeekR1(Format):
    """DeepSeek R1's markers around each call: `function<｜tool▁sep｜>NAME`, then its arguments in a
    json block."""

    name, opening = "deepseek_r1", "<｜tool▁calls▁begin｜>"
    example = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n"
               "{\"argument\": \"value\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    CALL = re.compile(
        r"(?:<｜tool▁call▁begin｜>)?function(?:<｜tool▁sep｜>)?\s*([^\n`]+?)\s*\n```json\n(.*?)\n```"
        r"(?:<｜tool▁call▁end｜>)?",
        re.S,
    )

    @staticmethod
    def shows(template: str) -> bool:
        return "<｜tool▁calls▁begin｜>" in template

    def call(self, fn: dict, lit: Literal) -> str:
        head = json.dumps(fn["name"] + "\n```json\n")
        return (f'{lit("<｜tool▁call▁begin｜>")} "function" {lit("<｜tool▁sep｜>")} {head} '
                f'{lark_json(fn["parameters"])} "\\n```" {lit("<｜tool▁call▁end｜>")} '
                f'{lit("<｜tool▁calls▁end｜>")}')

    def parse(self, text: str) -> tuple[str, list[Call]] | None:
        found = list(self.CALL.finditer(text))
        if not found:
            return None
        start = text.find(self.opening)
        content = text[:start if 0 <= start < found[0].start() else found[0].start()]
        try:
            return content.rstrip(), [Call(m.group(1), json.loads(m.group(2))) for m in found]
        except ValueError:
            return None


class Glm45(Format):
    """GLM 4.5: `<tool_call>NAME` and its arguments as key/value pairs, not JSON: the keys the
    schema lists, values up to the next tag."""

    name, opening = "glm45", "<tool_call>"
    CALL = re.compile(r"<tool_call>\s*([^\n<]+?)\s*\n(.*?)</tool_call>", re.S)
    ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)

    @staticmethod
    def shows(template: str) -> bool:
        return "<arg_key>" in template and "<tool_call>" in template

    def call(self, fn: dict, lit: Literal) -> str:
        keys = " | ".join(json.dumps(k) for k in fn["parameters"].get("properties", {})) or '""'
        pair = f'"<arg_key>" ({keys}) "</arg_key>\\n<arg_value>" /[^<]*/ "</arg_value>\\n"'
        return f'{json.dumps(fn["name"] + chr(10))} ({pair})* {lit("</tool_call>")}'

    def parse(self, text: str) -> tuple[str, list[Call]] | None:
        found = list(self.CALL.finditer(text))
        if not found:
            return None
        calls = [Call(m.group(1), {k.strip(): value(v) for k, v in self.ARG.findall(m.group(2))})
                 for m in found]
        return text[:found[0].start()].rstrip(), calls


def value(v: str) -> object:
    """A GLM argument's value: JSON where it reads as JSON, else the text itself."""
    try:
        return json.loads(v)
    except ValueError:
        return v


class Generic(Format):
    """llama.cpp's generic format, for a template that knows no tools: every reply a JSON object, a
    call or an answer."""

    name = "generic"
    PROMPT = ("You can call these tools (JSON schemas of their arguments):\n{tools}\n\nReply "
              "with a JSON object: either {{\"tool_call\": {{\"name\": <tool name>, "
              "\"arguments\": <arguments object>}}}} to call a tool, or {{\"response\": "
              "<your reply as a string>}} to answer.")

    @staticmethod
    def shows(template: str) -> bool:
        return True

    def grammar(self, fns: list[dict], auto: bool, lit: Literal,
                answer: dict | None = None) -> Grammar:
        call = {"type": "object",
                "properties": {"tool_call": {"anyOf": [call_schema(f) for f in fns]}},
                "required": ["tool_call"]}
        if not auto:
            return Grammar.json_schema(call)
        # the answer's definitions move to the root, where its refs ("#/$defs/...") point
        answer = {"type": "string"} if answer is None else answer
        defs = {k: answer[k] for k in ("$defs", "definitions") if k in answer}
        reply = {"type": "object", "required": ["response"], "properties": {
            "response": {k: v for k, v in answer.items() if k not in defs}}}
        return Grammar.json_schema({"anyOf": [call, reply], **defs})

    def parse(self, text: str) -> tuple[str, list[Call]] | None:
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        raw = obj.get("tool_calls") or ([obj["tool_call"]] if isinstance(obj.get("tool_call"), dict)
                                        else [])
        calls = [Call(c["name"], c.get("arguments", {}), c.get("id")) for c in raw
                 if isinstance(c, dict) and isinstance(c.get("name"), str)]
        if calls:
            return "", calls
        if "response" not in obj:
            return None
        answer = obj["response"]  # a string, or JSON in the request's response_format
        return (answer if isinstance(answer, str) else json.dumps(answer)), []


# in the order templates are recognised: GLM's before Hermes's (both write <tool_call>), the generic
# one last
FAMILIES: tuple[Format, ...] = (Glm45(), DeepSeekR1(), Mistral(), Hermes(), Llama3(), Generic())
FORMATS = {f.name: f for f in FAMILIES}


def detect(template: str | None) -> str:
    """The tool-call format of a chat template, by the markers its text writes (chat.cpp's way)."""
    return next(f.name for f in FAMILIES if f.shows(template or ""))
