"""What `spectool serve` reads from a request body: its JSON checked field by field, its prompt as tokens, and the
Generation it asks for (its fields over the server's options), or an ApiError that names what was wrong.

A field this server does not honour is a 400 that names it (UNHONOURED), never ignored; the numeric fields are
checked by their declarations in options.py, as the command line's are. What the output must be comes from
OpenAI's `response_format` or llama-server's `json_schema` and `grammar` fields (request_grammar), at most one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from spectool.options import Options, UserError, in_request, request_options
from spectool.serve_logprobs import requested as requested_logprobs
from spectool.session import Session, generation

if TYPE_CHECKING:
    from spectool.core.grammar import Grammar
    from spectool.core.speculative import Generation
    from spectool.llama.engine import Model

# request fields this server does not honour, and the values that ask nothing of it: anything else is a 400 that
# names the field (a client that asked for three samples or tools is told, not sent free text)
UNHONOURED = {
    "n": (None, 1), "best_of": (None, 1),
    "echo": (None, False), "suffix": (None, ""), "logit_bias": (None, {}), "tools": (None, []),
    "tool_choice": (None, "none", "auto"), "functions": (None, []), "function_call": (None, "none", "auto"),
    "audio": (None,), "modalities": (None, ["text"]),
}


class ApiError(Exception):
    """An answer other than 200, in OpenAI's error shape."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}


def invalid(name: str, message: str) -> ApiError:
    return ApiError(400, f"'{name}' {message}", code=f"invalid_{name}", param=name)


def unhonoured(body: dict) -> None:
    for name, fine in UNHONOURED.items():
        value = body.get(name)
        if not any(value == ok and type(value) is type(ok) for ok in fine):
            raise ApiError(400, f"'{name}' is not supported by this server (it was sent as {json.dumps(value)[:60]}); "
                                "leave it out", code="unsupported_field", param=name)


def stream_and_stop(body: dict) -> tuple[bool, list[str]]:
    """The request's `stream` (true or false) and `stop` (a string or a list of strings) by their types, else a 400
    naming the field; the numeric fields are checked by their declarations (options.request_options)."""
    stream, stop = body.get("stream"), body.get("stop")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream", f"must be true or false (it was sent as {json.dumps(stream)[:60]})")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid("stop", "must be a string or a list of strings")
    return bool(stream), [s for s in stop if s]


def parse(raw: bytes, chat: bool, session: Session, options: Options) -> tuple[Generation, list[int], list[str], bool]:
    """(Generation for this request, prompt tokens, stop strings, stream) from its body: a chat completion's
    messages or a completion's prompt, the request's fields over the server's `options`."""
    try:  # (Python reads NaN and Infinity too: the field that holds one is named by request_options)
        body = json.loads(raw)
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    unhonoured(body)
    stream, more = stream_and_stop(body)
    target = session.gen.target
    tokens, stop = chat_prompt(body, target) if chat else completion_prompt(body, target)
    if chat and body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    if len(tokens) >= target.n_ctx:
        raise ApiError(400, f"the prompt has {len(tokens)} tokens but the context holds {target.n_ctx}",
                       code="context_length_exceeded")
    grammar = request_grammar(body) or session.gen.grammar  # the request's, else the server's default
    try:  # the request's fields over the server's options, by their declarations (options.py), as `run` does
        gen = generation(session, request_options(options, body), grammar)
    except UserError as e:
        if e.option is None:
            raise
        name, message = in_request(e)
        raise ApiError(400, message, code=f"invalid_{name}", param=name) from None
    gen.logprobs = requested_logprobs(body, chat, target.n_vocab)  # serve_logprobs.py
    return gen, tokens, stop + more, stream


def request_grammar(body: dict) -> Grammar | None:
    """The grammar a request asks for, None when it asks for none (then the server's default holds):
    `response_format` as OpenAI sends it (`text`; `json_object`, with a `schema` as llama-server allows; or
    `json_schema` with {name, schema, strict}; no schema: any JSON object), llama-server's `json_schema` (an
    object) or `grammar` (GBNF text; "" is none, as there). Two of them, a value of the wrong shape, or a grammar
    the library refuses: a 400 naming the field."""
    asked = []  # (field, how to make its Grammar)
    rf = body.get("response_format")
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            raise invalid("response_format", 'must be {"type": "text"}, {"type": "json_object"} or '
                          f'{{"type": "json_schema", "json_schema": {{...}}}} (it was sent as {json.dumps(rf)[:60]})')
        schema = rf.get("schema") if kind == "json_object" else None
        if kind == "json_schema":
            spec = rf.get("json_schema")
            if not isinstance(spec, dict):
                raise invalid("response_format", "needs a 'json_schema' object: {name, schema, strict}")
            if not isinstance(spec.get("strict", False), (bool, type(None))):
                raise invalid("response_format", "has a json_schema whose 'strict' is not true or false")
            schema = spec.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise invalid("response_format", "has a 'schema' that is not a JSON object")
        if kind != "text":
            asked.append(("response_format", schema))
    if body.get("json_schema") is not None:
        if not isinstance(body["json_schema"], dict):
            raise invalid("json_schema", "must be a JSON schema object")
        asked.append(("json_schema", body["json_schema"]))
    if body.get("grammar") is not None and body["grammar"] != "":
        if not isinstance(body["grammar"], str):
            raise invalid("grammar", "must be a string of GBNF grammar")
        asked.append(("grammar", body["grammar"]))
    if len(asked) > 1:
        raise invalid(asked[1][0], f"cannot be given with '{asked[0][0]}': ask for one grammar or schema")
    if not asked:
        return None
    from spectool.core.grammar import Grammar, GrammarError

    name, value = asked[0]
    try:
        if name == "grammar":
            return Grammar.gbnf(value)
        return Grammar.json_object() if value is None else Grammar.json_schema(value)
    except GrammarError as e:
        raise invalid(name, f"was refused: {e}") from None


def chat_prompt(body: dict, target: Model) -> tuple[list[int], list[str]]:
    """A chat completion's `messages` rendered with the model's chat template, as tokens, and the stop strings
    the template's absence needs (chat.FALLBACK_STOP)."""
    from spectool.chat import FALLBACK_STOP, TemplateError, prompt_tokens

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects", code="invalid_messages")
    try:
        tokens = prompt_tokens(target, [{"role": m["role"], "content": content(m, i)} for i, m in enumerate(messages)])
    except TemplateError as e:
        raise ApiError(400, str(e), code="invalid_messages", param="messages") from None
    return tokens, list(FALLBACK_STOP) if target.chat_template() is None else []


def completion_prompt(body: dict, target: Model) -> tuple[list[int], list[str]]:
    """A completion's `prompt` (a string, or a list of one) as tokens, and no stop strings of its own."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string", code="invalid_prompt")
    return target.tokenize(prompt, add_special=True, parse_special=True), []


def content(m: dict, i: int) -> str:
    """A message's content: a string, or OpenAI's array of content parts, whose text parts are joined with
    newlines as llama.cpp's server joins them (common/chat.cpp, concat_content_parts). Other parts are refused by
    type: this server reads text only."""
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list) and c and all(isinstance(part, dict) for part in c):
        other = sorted({str(part.get("type")) for part in c
                        if part.get("type") != "text" or not isinstance(part.get("text"), str)})
        if other:
            raise ApiError(400, f"messages[{i}].content has parts of type {', '.join(other)}; this server takes "
                                "text parts only", code="unsupported_content")
        return "\n".join(part["text"] for part in c)
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", code="invalid_messages")
