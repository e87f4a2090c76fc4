"""OpenAI's Responses API (`POST /v1/responses`) over the server's chat path: a request's
`instructions` and `input` items become a chat completion's messages, its fields the chat request's
(`to_chat`), and the chat answer, whole or streamed, becomes a response object (`response`) or the
Responses stream's events (`events`).

Nothing is stored, so what needs a stored response (`previous_response_id`, `background`, item
references, `conversation`) is a 400 naming the field, as are built-in tools other than web search
and input other than text; which fields are served, ignored or refused is fields.py's declaration.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any
from contextlib import aclosing

from spectool.server import fields
from spectool.server.errors import RAISE_CONTEXT, ApiError, Overflow
from spectool.server.fields import asks_nothing
from spectool.server.requests import load

# what `include` may name: the output text's log-probabilities, and the parts of items this server
# never makes (reasoning, built-in tools' calls, images), which ask nothing
LOGPROBS = "message.output_text.logprobs"
INCLUDABLE = (LOGPROBS, "reasoning.encrypted_content", "file_search_call.results",
              "web_search_call.results", "web_search_call.action.sources",
              "message.input_image.image_url", "computer_call_output.output.image_url",
              "code_interpreter_call.outputs")
# the chat request's names for the fields mapped onto it, by the Responses names (errors name the
# latter)
RENAMED = {"max_output_tokens": "max_tokens", "input": "messages", "text.format": "response_format"}
# the fields passed to the chat request as they are
PASSED = {*fields.passed(), "temperature", "top_p", "stream", "parallel_tool_calls"}


# the fields the response object repeats (`response`): JSON's numbers only, or it could not be sent
ECHOED = {"parallel_tool_calls", "tool_choice", "tools", "text"}


def compliant(value) -> bool:
    """Whether a value is JSON as the answer is written (no NaN, no Infinity)."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def bad(param: str, message: str, code: str = "invalid_request") -> ApiError:
    return ApiError(400, f"'{param}' {message}", code=code, param=param)


def to_chat(body: dict, ignored: list[str] | None = None) -> dict:
    """The chat completion request a Responses request asks for (OpenAI's chat shape), else a 400
    naming the field in the Responses API's terms; the fields that asked nothing are added to
    `ignored` (fields.py)."""
    (ignored if ignored is not None else []).extend(fields.check("responses", body))
    for name in ECHOED & set(body):
        if not compliant(body[name]):
            raise bad(name, "holds NaN or Infinity, which JSON has not (the response repeats it)")
    chat = {k: body[k] for k in PASSED if k in body}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    chat["messages"] = messages(body)
    if body.get("tools") is not None:
        chat["tools"] = tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = tool_choice(body["tool_choice"])
    if body.get("text") is not None:
        chat |= text_format(body["text"])
    return chat | logprobs(body)


def logprobs(body: dict) -> dict:
    """`include: ["message.output_text.logprobs"]` and `top_logprobs` (0..20 alternatives) as the
    chat request's `logprobs` and `top_logprobs`: the output text's log-probabilities come back
    where `include` names them or `top_logprobs` asks for alternatives (above 0: a request that asks
    for a number of them wants them)."""
    include, top = body.get("include"), body.get("top_logprobs")
    if include is not None and (not isinstance(include, list)
                                or not all(i in INCLUDABLE for i in include)):
        raise bad("include", f"may name {' and '.join(INCLUDABLE)} (it was sent as "
                             f"{json.dumps(include)[:60]})", "unsupported_field")
    if LOGPROBS not in (include or ()) and asks_nothing(top, (None, 0)):
        return {}
    return {"logprobs": True, **({"top_logprobs": top} if top is not None else {})}


def messages(body: dict) -> list[dict]:
    """`instructions` (a system message) and `input` (a string: one user message; or a list of
    items: messages, function calls and their outputs) as chat messages. A function call joins the
    assistant message before it."""
    out: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise bad("instructions", "must be a string")
        out.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise bad("input", "must be a string or a list of input items (objects)")
    for i, item in enumerate(items):
        kind, at = item.get("type", "message"), f"input[{i}]"
        if kind == "message" and "role" in item:
            role = "system" if item["role"] == "developer" else item["role"]  # (any JSON type)
            if not isinstance(role, str) or role not in ("user", "system", "assistant"):
                raise bad(f"{at}.role", "must be user, system, developer or assistant")
            out.append({"role": role, "content": parts(item.get("content"), f"{at}.content")})
        elif kind == "function_call":
            call = {"id": text_field(item, "call_id", at), "type": "function",
                    "function": {"name": text_field(item, "name", at),
                                 "arguments": text_field(item, "arguments", at)}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": text_field(item, "call_id", at),
                        "content": output if isinstance(output, str)
                        else parts(output, f"{at}.output")})
        else:
            raise bad(f"{at}.type",
                      f"is {json.dumps(kind)[:40]}: this server takes messages, function_call and "
                      "function_call_output items (it keeps no items to refer "
                      "to)", "unsupported_input")
    return out


def text_field(item: dict, name: str, at: str) -> str:
    if not isinstance(item.get(name), str):
        raise bad(f"{at}.{name}", "must be a string")
    return item[name]


def parts(content, at: str) -> str | list[dict]:
    """A message's content (a string, or input_text / output_text parts) in the chat shape; other
    parts (images, files, audio) are refused by type: this server reads text only."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        raise bad(at, "must be a string or a list of content parts")
    for j, p in enumerate(content):
        if p.get("type") not in ("input_text", "output_text") or not isinstance(p.get("text"), str):
            raise bad(f"{at}[{j}]",
                      f"is a part of type {json.dumps(p.get('type'))[:40]}; this server takes text "
                                    "parts (input_text, output_text) only", "unsupported_content")
    return [{"type": "text", "text": p["text"]} for p in content]


def tools(value) -> list[dict]:
    """Function tools ({type: function, name, description, parameters, strict}) as chat tools, a
    namespace's among them (flattened)."""
    keys = ("name", "description", "parameters", "strict")
    return [{"type": "function", "function": {k: tool[k] for k in keys if k in tool}}
            for _, tool, _ in flattened(value)]


def flattened(value) -> list[tuple[str, dict, str | None]]:
    """The function tools of `tools`, each with its path (what errors name) and its namespace: a
    `namespace` tool's functions stand in its place (Codex groups tools so), web search is left out
    (fields.built_in_ignored), and any other built-in tool (file search, computer use, MCP, ...)
    runs on OpenAI's side and is refused. Two functions of one name are a 400."""
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise bad("tools", "must be a list of tool objects")
    out: list[tuple[str, dict, str | None]] = []
    for i, tool in enumerate(value):
        inner, space = tool.get("tools"), tool.get("name")
        if fields.built_in_ignored(tool):
            continue
        if tool.get("type") != "namespace":
            out.append((f"tools[{i}]", tool, None))
        elif isinstance(space, str) and isinstance(inner, list) and all(
                isinstance(t, dict) for t in inner):
            out += [(f"tools[{i}].tools[{j}]", t, space) for j, t in enumerate(inner)]
        else:
            raise bad(f"tools[{i}]", "is a namespace: it needs a 'name' and a list of 'tools'")
    names = [tool.get("name") for _, tool, _ in out]
    for k, (path, tool, _) in enumerate(out):
        if tool.get("type") != "function":
            raise bad(f"{path}.type",
                      f"is {json.dumps(tool.get('type'))[:40]}: this server runs no built-in "
                      "tools; give function tools", "unsupported_tool")
        if tool.get("name") in names[:k]:
            raise bad(f"{path}.name", "is the name of an earlier function too (namespaces are "
                                      "flattened here: give each function a name of its own)")
    return out


def namespaces(body: dict) -> dict[str, str]:
    """Each namespaced function's namespace, by its name (a call of it names its namespace)."""
    return {tool["name"]: space for _, tool, space in flattened(body.get("tools") or [])
            if space is not None}


def tool_choice(value):
    """auto, none, required, or {type: function, name} as the chat request's tool_choice."""
    if value in ("auto", "none", "required"):
        return value
    if (isinstance(value, dict) and value.get("type") == "function"
            and isinstance(value.get("name"), str)):
        return {"type": "function", "function": {"name": value["name"]}}
    raise bad("tool_choice",
              'must be "auto", "none", "required" or {"type": "function", "name": ...} (it was '
              'sent '
                             f"as {json.dumps(value)[:60]})")


def text_format(value) -> dict:
    """`text` ({format, verbosity}) as the chat request's response_format; verbosity is a hint,
    ignored."""
    if not isinstance(value, dict) or set(value) - {"format", "verbosity"}:
        raise bad("text", "must be {format, verbosity}")
    f = value.get("format")
    if f is None:
        return {}
    if not isinstance(f, dict) or f.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("text.format",
                  'must be {"type": "text"}, {"type": "json_object"} or {"type": '
                  '"json_schema", "name": ..., "schema": {...}} (it was sent as '
                  f'{json.dumps(f)[:60]})')
    if f["type"] != "json_schema":
        return {"response_format": {"type": f["type"]}}
    spec = {k: f[k] for k in ("name", "schema", "strict", "description") if k in f}
    return {"response_format": {"type": "json_schema", "json_schema": spec}}


def renamed(e: ApiError, body: dict) -> ApiError:
    """A chat request's error named in the Responses API's terms (max_tokens: max_output_tokens,
    a tool's `function.parameters`: its path's `parameters`, ...)."""
    if isinstance(e, Overflow):
        e.message, e.param = ("Your input exceeds the context window of this model: "
                              f"{e.n_prompt} tokens > {e.n_ctx} maximum. Please adjust your input "
                              f"and try again. {RAISE_CONTEXT}", "input")
        return e
    try:
        paths = [path for path, _, _ in flattened(body.get("tools") or [])]
    except ApiError:
        paths = []
    for name in ("message", "param"):
        setattr(e, name, getattr(e, name) and re.sub(
            r"tools\[(\d+)\]\.function\.parameters",
            lambda m: f"{paths[int(m[1])] if int(m[1]) < len(paths) else m[0]}.parameters",
            getattr(e, name)))
    for ours, theirs in RENAMED.items():
        if e.param is not None and (e.param == theirs or e.param.startswith(theirs + "[")):
            e.param = ours + e.param[len(theirs):]
        e.message = e.message.replace(f"'{theirs}'", f"'{ours}'")
        e.code = (e.code.replace(f"invalid_{theirs}", f"invalid_{ours}".replace(".", "_")) if e.code
                  else e.code)
    return e


# -- the answer
# --------------------------------------------------------------------------------------------------
def usage(chat_usage: dict) -> dict:
    n_in, n_out = chat_usage["prompt_tokens"], chat_usage["completion_tokens"]
    return {"input_tokens": n_in, "input_tokens_details": chat_usage["prompt_tokens_details"],
            "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n_in + n_out,
            # spectool's own, as on chat: drafted, accepted, ...
            "speculative": chat_usage.get("speculative")}


def message_item(mid: str, text: str, status: str = "completed",
                 logprobs: list | None = None) -> dict:
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": logprobs or []}]
            if status == "completed" else []}


def token_logprobs(choice: dict) -> list:
    """A chat choice's (or chunk's) token log-probabilities, as the Responses API lists them: each
    token's {token, logprob, bytes, top_logprobs} (and llama-server's id), none where none were
    asked for."""
    return (choice.get("logprobs") or {}).get("content") or []


class TextTokens:
    """Which tokens' log-probabilities go with a message's text: those that begin inside it, in
    order (a tool call's tokens come after the text, and are not the text's). Fed every token's
    record as they come (`seen`) and the text as it grows (`take`); `taken` holds the text's records
    so far."""

    def __init__(self, seen: list[dict] | None = None):
        self.seen: list[dict] = seen or []  # every record so far
        self.taken: list[dict] = []  # of them, those that went with the text ...
        self.spelt = 0  # ... and how many bytes of text they spell
        self.text = 0  # the text's bytes so far

    def take(self, more: str = "") -> list[dict]:
        """The records not taken yet that begin within the text, `more` its newest part."""
        self.text += len(more.encode())
        start = len(self.taken)
        while len(self.taken) < len(self.seen) and self.spelt < self.text:
            self.taken.append(record := self.seen[len(self.taken)])
            self.spelt += len(record["bytes"])
        return self.taken[start:]


def call_item(call: dict, spaces: dict[str, str], status: str = "completed") -> dict:
    """A chat tool call as a function_call item (with its function's namespace, `spaces`)."""
    f = call.get("function", {})
    space = spaces.get(f.get("name", ""))
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}",
            "call_id": call.get("id", ""),
            "name": f.get("name", ""), "arguments": f.get("arguments", "") if status == "completed"
            else "",
            "status": status, **({"namespace": space} if space is not None else {})}


def response(server, body: dict, rid: str, created: int, output: list, finish: str | None,
             chat_usage: dict | None) -> dict:
    """The response object: in progress (no finish yet), completed, or incomplete (the token budget
    ran out)."""
    status = (
        "in_progress" if finish is None else "incomplete" if finish == "length" else "completed"
    )
    return {"id": rid, "object": "response", "created_at": created, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": server.model_id, "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "top_logprobs": body.get("top_logprobs"),
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
            "text": body.get("text") or {"format": {"type": "text"}}, "store": False,
            "metadata": {},
            "usage": usage(chat_usage) if chat_usage else None}


def whole(server, body: dict, rid: str, created: int, chat: dict) -> dict:
    choice = chat["choices"][0]
    message, calls = choice["message"], choice["message"].get("tool_calls") or []
    output = [call_item(c, namespaces(body)) for c in calls]
    if message.get("content") or not calls:
        content = message.get("content") or ""
        output.insert(0, message_item(f"msg_{uuid.uuid4().hex[:24]}", content,
                                      logprobs=TextTokens(token_logprobs(choice)).take(content)))
    return response(server, body, rid, created, output, choice["finish_reason"], chat["usage"])


class Events:
    """The Responses stream of one answer, built from the chat answer's chunks (see `events`): the
    output items so far, each event numbered in turn."""

    def __init__(self, server, body: dict, rid: str, created: int):
        # (the response's own)
        self.server, self.body, self.rid, self.created = server, body, rid, created
        self.seq = 0
        self.output: list[dict] = []
        self.text: list[str] = []
        self.tokens = TextTokens()  # the message's tokens' log-probabilities, where asked for
        self.calls: dict[int, dict] = {}  # a tool call's index in the chat deltas: its item

    def event(self, kind: str, **fields) -> str:
        self.seq += 1
        data = {"type": kind, "sequence_number": self.seq - 1, **fields}
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    def response(self, finish: str | None = None, chat_usage: dict | None = None) -> dict:
        return response(self.server, self.body, self.rid, self.created, self.output, finish,
                        chat_usage)

    def message_open(self) -> bool:
        return bool(self.output) and self.output[-1]["type"] == "message" and \
            self.output[-1]["status"] == "in_progress"

    def open_message(self) -> list[str]:
        output = self.output
        output.append(message_item(f"msg_{uuid.uuid4().hex[:24]}", "", "in_progress"))
        at = {"item_id": output[-1]["id"], "output_index": len(output) - 1}
        part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [],
                                "logprobs": []}
        return [self.event("response.output_item.added", output_index=len(output) - 1,
                           item=dict(output[-1])),
                self.event("response.content_part.added", **at, content_index=0, part=part)]

    def close_message(self) -> list[str]:
        """The message item open at the end of output, done."""
        output, item = self.output, self.output[-1]
        self.tokens.take()  # (a token a stop string cut comes with no text of its own)
        part: dict[str, Any] = {"type": "output_text", "text": "".join(self.text),
                                "annotations": [],
                                "logprobs": self.tokens.taken[:]}
        at = {"item_id": item["id"], "output_index": len(output) - 1, "content_index": 0}
        item.update(message_item(item["id"], part["text"], logprobs=part["logprobs"]))
        return [self.event("response.output_text.done", **at, text=part["text"],
                           logprobs=part["logprobs"]),
                self.event("response.content_part.done", **at, part=part),
                self.event("response.output_item.done", output_index=len(output) - 1, item=item)]

    def content(self, piece: str) -> list[str]:
        """A piece of the message's text: its item opened where none is."""
        out = [] if self.output and self.output[-1]["type"] == "message" else self.open_message()
        self.text.append(piece)
        return out + [self.event("response.output_text.delta", item_id=self.output[-1]["id"],
                                 output_index=len(self.output) - 1, content_index=0, delta=piece,
                                 logprobs=self.tokens.take(piece))]

    def call(self, call: dict) -> list[str]:
        """A tool call's delta: its item added the first time (closing the message before it), its
        arguments."""
        out, c = [], self.calls.get(call.get("index", 0))
        if c is None:
            out = self.close_message() if self.message_open() else []
            c = self.calls[call.get("index", 0)] = {
                "item": call_item(call, namespaces(self.body), "in_progress")}
            self.output.append(c["item"])
            out.append(self.event("response.output_item.added", output_index=len(self.output) - 1,
                                  item=dict(c["item"])))
        piece = (call.get("function") or {}).get("arguments") or ""
        if piece:
            c["item"]["arguments"] += piece
            out.append(self.event("response.function_call_arguments.delta", item_id=c["item"]["id"],
                                  output_index=self.output.index(c["item"]), delta=piece))
        return out

    def finish(self, reason: str, chat_usage: dict | None) -> list[str]:
        """Every open item done, and the response completed or incomplete."""
        out = [] if self.output else self.open_message()
        if self.message_open():
            out += self.close_message()
        for c in self.calls.values():
            item, index = c["item"], self.output.index(c["item"])
            if item["status"] == "in_progress":
                item["status"] = "completed"
                out += [self.event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=index, arguments=item["arguments"]),
                        self.event("response.output_item.done", output_index=index, item=item)]
        final = self.response(reason, chat_usage)
        return out + [self.event(f"response.{final['status']}", response=final)]

    def chunk(self, chunk: dict) -> list[str]:
        """The events of one chat chunk."""
        choice = chunk["choices"][0]
        delta = choice.get("delta") or {}
        self.tokens.seen += token_logprobs(choice)
        out = self.content(delta["content"]) if delta.get("content") else []
        for call in delta.get("tool_calls") or []:
            out += self.call(call)
        if choice.get("finish_reason") is not None:
            out += self.finish(choice["finish_reason"], chunk.get("usage"))
        return out


async def events(server, body: dict, rid: str, created: int, chunks):
    """The Responses stream, from the chat answer's chunks: the response created and in progress,
    each output item added (a message, whose text part gets its deltas; a function call, whose
    arguments do), done, and the response completed or incomplete; or an error event where
    generation failed."""
    stream = Events(server, body, rid, created)
    first = stream.response()
    yield stream.event("response.created", response=first)
    yield stream.event("response.in_progress", response=first)
    async with aclosing(chunks):  # a stream closed early stops the generation
        async for chunk in chunks:
            if "error" in chunk:
                err = chunk["error"]
                yield stream.event("error", code=err.get("code") or err.get("type"),
                                   message=err["message"],
                                   param=None)
                return
            for e in stream.chunk(chunk):
                yield e


async def answer(server, request):
    """POST /v1/responses: the request's body translated, run on the chat path, the answer
    translated back."""
    from starlette.responses import JSONResponse

    body, ignored = load(await server.body(request)), list[str]()
    try:
        chat = to_chat(body, ignored)
        server.ignored.add("responses", ignored)
        # without max_output_tokens, the rest of the context (as at OpenAI): an agent's call is
        # never cut by the server's -n (Codex sends none)
        chat.setdefault("max_tokens", server.session.gen.target.n_ctx)
        reply = await server.start(request, chat, True)
    except ApiError as e:
        raise renamed(e, body) from None
    rid, created = f"resp_{uuid.uuid4().hex[:24]}", int(time.time())
    if reply.stream:
        return server.stream(events(server, body, rid, created, server.chunks(reply)))
    return JSONResponse(whole(server, body, rid, created, await server.whole(reply)))
