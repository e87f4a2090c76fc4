"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) over the server's
chat path: a request's `system` and `messages` (text, tool_use and tool_result blocks) become a chat
completion's messages, its fields the chat request's (`to_chat`), and the chat answer, whole or
streamed, becomes a message (`message`) or the Messages stream's events (`events`); errors are in
Anthropic's shape (`error_body`).

Images, documents and server tools are a 400 naming the field; which fields are served, ignored or
refused is fields.py's declaration.
"""

from __future__ import annotations

import json
import re
import uuid
from contextlib import aclosing

from spectool.server import fields
from spectool.server.errors import RAISE_CONTEXT, ApiError, Overflow
from spectool.server.requests import load

# the fields passed to the chat request as they are
PASSED = {*fields.passed(), "max_tokens", "temperature", "top_p", "top_k", "stream"}
# Anthropic's error type for each status (its API's errors page); 503 is its 529's meaning,
# overloaded
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
               429: "rate_limit_error",
               503: "overloaded_error"}


def error_body(e: ApiError) -> dict:
    """An error in Anthropic's shape: {type: error, error: {type, message}}; a prompt longer than
    the context in Anthropic's words, which Claude Code reads to compact its conversation."""
    message = e.message if not isinstance(e, Overflow) else (
        f"prompt is too long: {e.n_prompt} tokens > {e.n_ctx} maximum {RAISE_CONTEXT}")
    return {"type": "error",
            "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": message}}


def bad(param: str, message: str, code: str = "invalid_request") -> ApiError:
    return ApiError(400, f"'{param}' {message}", code=code, param=param)


def to_chat(body: dict, ignored: list[str] | None = None) -> dict:
    """The chat completion request a Messages request asks for (OpenAI's chat shape), else a 400
    naming the field (`max_tokens` and a non-empty `messages` are required, as Anthropic's API
    requires them); the fields that asked nothing are added to `ignored` (fields.py)."""
    (ignored if ignored is not None else []).extend(fields.check("messages", body))
    if body.get("max_tokens") is None:
        raise bad("max_tokens", "is required")
    chat = {k: body[k] for k in PASSED if k in body}
    turns = combined(messages(body.get("messages")))
    if not turns:
        raise bad("messages", "holds no user or assistant turn")
    chat["messages"] = system(body.get("system"), folded(body["messages"])) + turns
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise bad("stop_sequences", "must be a list of strings")
        chat["stop"] = stop
    if body.get("tools") is not None:
        chat["tools"] = tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat |= tool_choice(body["tool_choice"])
    if body.get("output_config") is not None:
        chat |= output_format(body["output_config"])
    return chat


def system(value, more: list[str]) -> list[dict]:
    """`system` and the `system` turns' texts (`more`) as one system message."""
    texts = ([] if value is None else [system_text(value, "system")]) + more
    return [{"role": "system", "content": "\n".join(texts)}] if texts else []


def system_text(value, at: str) -> str:
    """A system prompt: a string, or text blocks joined as Anthropic joins them."""
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                       and isinstance(b.get("text"), str) for b in value):
        value = "\n".join(b["text"] for b in value)
    if not isinstance(value, str):
        raise bad(at, "must be a string or a list of text blocks")
    return value


def folded(turns: list[dict]) -> list[str]:
    """The texts of the `system` turns among the messages (Claude Code sends one beside the
    top-level `system`): they join the system prompt, as a chat template wants it first."""
    return [system_text(m.get("content"), f"messages[{i}].content")
            for i, m in enumerate(turns) if m.get("role") == "system"]


def messages(value) -> list[dict]:
    """Anthropic's user and assistant turns as chat messages: text blocks as text parts, an
    assistant's tool_use blocks as its tool_calls, a user's tool_result blocks as tool messages
    (before its text, as Anthropic requires them first). Thinking blocks of earlier turns are
    dropped: this server returns none."""
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        raise bad("messages", "must be a non-empty list of {role, content} objects")
    out: list[dict] = []
    for i, m in enumerate(value):
        role, content, at = m.get("role"), m.get("content"), f"messages[{i}]"
        if role == "system":  # (folded into the system prompt)
            continue
        if role not in ("user", "assistant"):
            raise bad(f"{at}.role", "must be user, assistant or system")
        # Anthropic continues such a turn: not done here
        if role == "assistant" and i == len(value) - 1:
            raise bad(f"{at}.role",
                      "is assistant in the last message: continuing a prefilled answer is not "
                                    "supported; end with a user turn", "unsupported_prefill")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
            raise bad(f"{at}.content", "must be a string or a list of content blocks")
        texts, calls, results = [], [], []
        for j, b in enumerate(content):
            kind = b.get("type")
            if kind == "text" and isinstance(b.get("text"), str):
                texts.append({"type": "text", "text": b["text"]})
            elif kind == "tool_use" and role == "assistant":
                calls.append({"id": str(b.get("id", "")), "type": "function", "function": {
                    "name": str(b.get("name", "")), "arguments": json.dumps(b.get("input", {}))}})
            elif kind == "tool_result" and role == "user":
                results.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")),
                                "content": result_text(b.get("content"),
                                                       f"{at}.content[{j}].content")})
            elif kind not in ("thinking", "redacted_thinking"):
                raise bad(f"{at}.content[{j}]",
                          f"is a block of type {json.dumps(kind)[:40]}; this server takes text, "
                          "tool_use and tool_result blocks only", "unsupported_content")
        out += results
        if texts or calls:
            out.append({"role": role, "content": texts or "",
                        **({"tool_calls": calls} if calls else {})})
    return out


def combined(turns: list[dict]) -> list[dict]:
    """Consecutive user turns as one, and consecutive assistant turns, as Anthropic combines them
    (a `system` turn taken out between two user turns leaves them side by side): chat templates
    want the roles to alternate."""
    out: list[dict] = []
    for m in turns:
        last = out[-1] if out else None
        if last is None or last["role"] != m["role"] or m["role"] == "tool" or last.get(
                "tool_calls"):
            out.append(m)
            continue
        last["content"] = text_parts(last["content"]) + text_parts(m["content"])
        if m.get("tool_calls"):
            last["tool_calls"] = m["tool_calls"]
    return out


def text_parts(content: str | list[dict]) -> list[dict]:
    return content if isinstance(content, list) else [{"type": "text", "text": content}] * bool(
        content)


def result_text(content, at: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         for b in content):
        return "\n".join(str(b.get("text", "")) for b in content)
    raise bad(at, "must be a string or a list of text blocks (this server reads text "
                  "only)", "unsupported_content")


def tools(value) -> list[dict]:
    """Client tools ({name, description, input_schema}) as chat function tools; server tools (web
    search, code execution, bash, the text editor, ...) run on Anthropic's side and are refused."""
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise bad("tools", "must be a list of tool objects")
    out = []
    for i, t in enumerate(value):
        if t.get("type", "custom") != "custom":
            raise bad(f"tools[{i}].type",
                      f"is {json.dumps(t.get('type'))[:40]}: this server runs no server tools; "
                      "give client tools {name, description, input_schema}", "unsupported_tool")
        out.append({"type": "function",
                    "function": {"name": t.get("name"), "description": t.get("description", ""),
                                                      "parameters": t.get("input_schema")}})
    return out


def renamed(e: ApiError) -> ApiError:
    """A chat request's error in the Messages API's terms: a tool's `function.parameters` is its
    `input_schema`."""
    def ours(text: str) -> str:
        return re.sub(r"tools\[(\d+)\]\.function\.parameters", r"tools[\1].input_schema", text)

    e.message, e.param = ours(e.message), e.param and ours(e.param)
    return e


def tool_choice(value) -> dict:
    """{type: auto | any | tool (with name) | none} as the chat request's tool_choice, and
    disable_parallel_tool_use as its parallel_tool_calls."""
    kind = value.get("type") if isinstance(value, dict) else None
    kind = kind if isinstance(kind, str) else ""  # (any JSON type)
    choice: str | dict | None = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool" and isinstance(value.get("name"), str):
        choice = {"type": "function", "function": {"name": value["name"]}}
    if choice is None:
        raise bad("tool_choice",
                  'must be {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": ...} or '
                                 f'{{"type": "none"}} (it was sent as {json.dumps(value)[:60]})')
    parallel = {"parallel_tool_calls": False} if value.get("disable_parallel_tool_use") else {}
    return {"tool_choice": choice, **parallel}


def output_format(value) -> dict:
    """output_config's `format` ({type: json_schema, schema}) as the chat request's response_format;
    its `effort` is a hint to Anthropic's models, ignored."""
    f = value.get("format") if isinstance(value, dict) else None
    if not isinstance(value, dict) or set(value) - {"format", "effort"} or f is not None and not (
            isinstance(f, dict) and f.get("type") == "json_schema"
            and isinstance(f.get("schema"), dict)):
        raise bad("output_config",
                  'must be {"format": {"type": "json_schema", "schema": {...}}, "effort": ...}')
    return {} if f is None else {"response_format": {"type": "json_schema", "json_schema": {
        "name": "output", "schema": f["schema"]}}}


# -- the answer
# --------------------------------------------------------------------------------------------------
def stop(finish: str, stats, body: dict) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) in Anthropic's words, from the chat finish_reason and the stop
    string that ended the generation (Stats.stop_string), where it was one of the request's."""
    if finish == "length":
        return "max_tokens", None
    if finish == "tool_calls":
        return "tool_use", None
    matched = getattr(stats, "stop_string", None)
    if matched is not None and matched in (body.get("stop_sequences") or []):
        return "stop_sequence", matched
    return "end_turn", None


def usage(chat_usage: dict) -> dict:
    """Anthropic's usage: input_tokens are those not read from the cache
    (cache_read_input_tokens)."""
    cached = chat_usage["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": chat_usage["prompt_tokens"] - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": chat_usage["completion_tokens"],
            # spectool's own, as on chat: drafted, accepted, ...
            "speculative": chat_usage.get("speculative")}


def tool_use(call: dict) -> dict:
    f = call.get("function") or {}
    try:
        arguments = json.loads(f.get("arguments") or "{}")
    except ValueError:
        arguments = {}
    return {"type": "tool_use", "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
            "name": f.get("name", ""),
            "input": arguments if isinstance(arguments, dict) else {}}


def message(server, body: dict, mid: str, chat: dict, stats) -> dict:
    choice = chat["choices"][0]
    text, calls = choice["message"].get("content") or "", choice["message"].get("tool_calls") or []
    reason, sequence = stop(choice["finish_reason"], stats, body)
    content = ([{"type": "text", "text": text}] if text or not calls
               else []) + [tool_use(c) for c in calls]
    return {"id": mid, "type": "message", "role": "assistant", "model": server.model_id,
            "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(chat["usage"])}


class Blocks:
    """The content blocks of a Messages stream, as the chat deltas open them: each block's type by
    index, and the block of each tool call (by its index in the chat deltas)."""

    def __init__(self):
        self.types: list[str] = []
        self.calls: dict[int, int] = {}

    def start(self, block: dict) -> list[str]:
        """The last block stopped, and `block` started."""
        out = [event("content_block_stop", index=len(self.types) - 1)] if self.types else []
        self.types.append(block["type"])
        return out + [event("content_block_start", index=len(self.types) - 1, content_block=block)]

    def delta(self, delta: dict) -> list[str]:
        """A chat delta's text and tool-call arguments, in their blocks."""
        out = []
        if delta.get("content"):
            if not self.types or self.types[-1] != "text":
                out += self.start({"type": "text", "text": ""})
            out.append(event("content_block_delta", index=len(self.types) - 1,
                             delta={"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or []:
            index = call.get("index", 0)
            if index not in self.calls:
                function = {**(call.get("function") or {}), "arguments": "{}"}
                out += self.start(tool_use({**call, "function": function}))
                self.calls[index] = len(self.types) - 1
            piece = (call.get("function") or {}).get("arguments")
            if piece:
                out.append(event("content_block_delta", index=self.calls[index],
                                 delta={"type": "input_json_delta", "partial_json": piece}))
        return out

    def stop(self) -> list[str]:
        """The last block stopped (an empty text block first, where none was opened)."""
        out = [] if self.types else self.start({"type": "text", "text": ""})
        return out + [event("content_block_stop", index=len(self.types) - 1)]


def event(kind: str, **fields) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


async def events(server, body: dict, mid: str, reply, chunks):
    """The Messages stream, from the chat answer's chunks: message_start, a ping, each content block
    (text, with text_delta; tool_use, with input_json_delta) started, its deltas and stopped,
    message_delta with the stop reason and usage, message_stop; or an error event where generation
    failed."""
    blocks = Blocks()
    yield event("message_start", message={
        "id": mid, "type": "message", "role": "assistant", "model": server.model_id, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": reply.n_prompt, "output_tokens": 0}})
    yield event("ping")
    async with aclosing(chunks):  # a stream closed early stops the generation
        async for chunk in chunks:
            if "error" in chunk:
                yield event("error",
                            error=error_body(ApiError(500, chunk["error"]["message"]))["error"])
                return
            choice = chunk["choices"][0]
            for e in blocks.delta(choice.get("delta") or {}):
                yield e
            if choice.get("finish_reason") is not None:
                for e in blocks.stop():
                    yield e
                reason, sequence = stop(choice["finish_reason"], reply.stats, body)
                yield event("message_delta",
                            delta={"stop_reason": reason, "stop_sequence": sequence},
                            usage=usage(chunk["usage"]))
                yield event("message_stop")


async def answer(server, request):
    """POST /v1/messages: the request's body translated, run on the chat path, the answer translated
    back."""
    from starlette.responses import JSONResponse

    body, ignored = load(await server.body(request)), list[str]()
    chat = to_chat(body, ignored)
    server.ignored.add("messages", ignored)
    try:
        reply = await server.start(request, chat, True)
    except ApiError as e:
        raise renamed(e) from None
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    if reply.stream:  # (kept alive by pings, as Anthropic's stream is)
        return server.stream(events(server, body, mid, reply, server.chunks(reply)), event("ping"))
    chat = await server.whole(reply)
    return JSONResponse(message(server, body, mid, chat, reply.stats))


async def count_tokens(server, request):
    """POST /v1/messages/count_tokens: the prompt's tokens, as the request would be rendered."""
    import asyncio

    from starlette.responses import JSONResponse

    body = {k: v for k, v in load(await server.body(request)).items() if k != "stream"}
    try:
        n = len((await asyncio.to_thread(server.parse_request,
                                         to_chat({"max_tokens": 1, **body}), True)).tokens)
    except Overflow as e:  # counted all the same: a client counts to know whether it fits
        n = e.n_prompt
    except ApiError as e:
        raise renamed(e) from None
    return JSONResponse({"input_tokens": n})
