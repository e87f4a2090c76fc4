"""`spectool serve`: an OpenAI-compatible HTTP server over the session layer (Starlette on uvicorn).

One model, one sequence: requests take turns in arrival order (a bounded queue answers 503 when full), each
generation runs in a worker thread and streams its text through an asyncio queue, and a client that goes away
stops its generation at the next step. The KV cache keeps what the previous request shared with the next (its
longest common token prefix), so an agent that resends its whole conversation prefills only what is new.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from spectool.options import Options, UserError, in_request, request_options
from spectool.session import Session, generation

# request fields this server does not honour, and the values that ask nothing of it: anything else is a 400 that
# names the field (a client that asked for three samples, log-probabilities or JSON is told, not sent free text)
UNHONOURED = {
    "n": (None, 1), "best_of": (None, 1), "logprobs": (None, False, 0), "top_logprobs": (None, 0),
    "echo": (None, False), "suffix": (None, ""), "logit_bias": (None, {}), "tools": (None, []),
    "tool_choice": (None, "none", "auto"), "functions": (None, []), "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}), "audio": (None,), "modalities": (None, ["text"]),
}


def unhonoured(body: dict) -> None:
    for name, fine in UNHONOURED.items():
        value = body.get(name)
        if not any(value == ok and type(value) is type(ok) for ok in fine):
            raise ApiError(400, f"'{name}' is not supported by this server (it was sent as {json.dumps(value)[:60]}); "
                                "leave it out", code="unsupported_field", param=name)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}


@dataclass
class Totals:
    requests: int = 0
    rejected: int = 0  # 503: the queue was full
    cancelled: int = 0  # the client went away mid-generation
    prompt_tokens: int = 0
    completion_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    decode_seconds: float = 0.0

    def prometheus(self) -> str:
        lines = []
        for name, value in (("requests_total", self.requests), ("requests_rejected_total", self.rejected),
                            ("requests_cancelled_total", self.cancelled), ("prompt_tokens_total", self.prompt_tokens),
                            ("completion_tokens_total", self.completion_tokens),
                            ("drafted_tokens_total", self.drafted), ("accepted_tokens_total", self.accepted),
                            ("decode_seconds_total", round(self.decode_seconds, 6))):
            lines += [f"# TYPE spectool_{name} counter", f"spectool_{name} {value}"]
        return "\n".join(lines) + "\n"


class Server:
    def __init__(self, session: Session, options: Options, model_id: str, api_key: str | None = None,
                 queue_size: int = 8):
        self.session, self.options, self.model_id = session, options, model_id
        self.api_key, self.queue_size = api_key, queue_size
        self.turn = threading.Condition()  # one generation at a time, in arrival order (tickets)
        self.next_ticket = self.serving = 0
        self.counting = threading.Lock()
        self.waiting = 0
        self.totals = Totals()
        self.stopping = threading.Event()

    # -- requests ------------------------------------------------------------------------------------------------
    def generation(self, body: dict, chat: bool):
        """(Generation for this request, prompt tokens, stop strings), from the request's fields over the server's
        options; a field the server does not honour is a 400 naming it (UNHONOURED), never ignored."""
        from spectool.chat import FALLBACK_STOP, prompt_tokens

        unhonoured(body)
        target = self.session.gen.target
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
                raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects",
                               code="invalid_messages")
            tokens = prompt_tokens(target, [{"role": m["role"], "content": _content(m, i)}
                                            for i, m in enumerate(messages)])
            stop = list(FALLBACK_STOP) if target.chat_template() is None else []
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if not isinstance(prompt, str) or not prompt:
                raise ApiError(400, "'prompt' must be a non-empty string", code="invalid_prompt")
            tokens = target.tokenize(prompt, add_special=True, parse_special=True)
            stop = []
        more = body.get("stop") or []
        stop += [more] if isinstance(more, str) else [s for s in more if isinstance(s, str)]
        if chat and body.get("max_completion_tokens") is not None:
            body = {**body, "max_tokens": body["max_completion_tokens"]}
        if len(tokens) >= target.n_ctx:
            raise ApiError(400, f"the prompt has {len(tokens)} tokens but the context holds {target.n_ctx}",
                           code="context_length_exceeded")
        try:  # the request's fields over the server's options, by their declarations (options.py), as `run` does
            gen = generation(self.session, request_options(self.options, body))
        except UserError as e:
            if e.option is None:
                raise
            name, message = in_request(e)
            raise ApiError(400, message, code=f"invalid_{name}", param=name) from None
        return gen, tokens, stop

    def ticket(self) -> int:
        with self.turn:
            self.next_ticket += 1
            return self.next_ticket - 1

    def run(self, ticket: int, gen, tokens, stop, push, cancelled: threading.Event):
        """Generate in this (worker) thread once `ticket` is served, handing (text, None) pieces and finally
        (None, Stats) to `push`."""
        from spectool.speculative import generate_text
        from spectool.stats import Stats

        stats = Stats(mode=self.session.mode)
        with self.turn:
            self.turn.wait_for(lambda: self.serving == ticket)
        with self.counting:
            self.waiting -= 1
        try:
            if not cancelled.is_set():  # a client that left while waiting costs nothing
                for text, _ in generate_text(gen, tokens, stop, stats, lambda: cancelled.is_set() or
                                             self.stopping.is_set()):
                    if text:
                        push((text, None))
        except Exception as e:  # noqa: BLE001 - reported to the client as a 500, never a traceback
            push((None, e))
            return
        finally:
            with self.turn:
                self.serving += 1
                self.turn.notify_all()
        t = self.totals
        t.prompt_tokens += len(tokens)
        t.completion_tokens += stats.n_generated
        t.drafted += stats.n_drafted
        t.accepted += stats.n_accepted
        t.decode_seconds += stats.decode_seconds
        if cancelled.is_set():
            t.cancelled += 1
        push((None, stats))

    # -- the ASGI application ------------------------------------------------------------------------------------
    def app(self):
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
        from starlette.routing import Route

        def error(e: ApiError) -> JSONResponse:
            return JSONResponse(e.body(), status_code=e.status)

        def authorised(request: Request) -> None:
            if self.api_key and request.headers.get("authorization", "") != f"Bearer {self.api_key}":
                raise ApiError(401, "invalid API key (send 'Authorization: Bearer KEY')", "authentication_error",
                               "invalid_api_key")

        async def complete(request: Request, chat: bool):
            try:
                authorised(request)
                try:
                    body = json.loads(await request.body())
                except ValueError:
                    raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
                if not isinstance(body, dict):
                    raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
                # one model is served: any `model` names it, as with llama-server (responses name the real one)
                gen, tokens, stop = self.generation(body, chat)
                with self.counting:
                    if self.waiting >= self.queue_size:
                        self.totals.rejected += 1
                        raise ApiError(503, f"busy: {self.waiting} requests are waiting; try again later",
                                       "server_error", "queue_full")
                    self.waiting += 1
                    self.totals.requests += 1
            except ApiError as e:
                return error(e)
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()
            cancelled = threading.Event()
            worker = threading.Thread(target=self.run, daemon=True,
                                      args=(self.ticket(), gen, tokens, stop, lambda item: loop.call_soon_threadsafe(
                                          queue.put_nowait, item), cancelled))
            worker.start()
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
            created = int(time.time())
            if body.get("stream"):
                return StreamingResponse(self._events(request, queue, cancelled, rid, created, chat),
                                         media_type="text/event-stream")
            text = []
            while True:
                piece, end = await queue.get()
                if piece is not None:
                    text.append(piece)
                    continue
                if isinstance(end, Exception):
                    return error(ApiError(500, f"generation failed: {end}", "server_error"))
                return JSONResponse(self._object(rid, created, chat, "".join(text), end, len(tokens)))

        async def models(request: Request):
            try:
                authorised(request)
            except ApiError as e:
                return error(e)
            return JSONResponse({"object": "list", "data": [
                {"id": self.model_id, "object": "model", "created": 0, "owned_by": "spectool"}]})

        async def health(request: Request):
            return JSONResponse({"status": "ok"})

        async def metrics(request: Request):
            return PlainTextResponse(self.totals.prometheus(), media_type="text/plain; version=0.0.4")

        async def chat_completions(request: Request):
            return await complete(request, True)

        async def completions(request: Request):
            return await complete(request, False)

        async def http_error(request: Request, exc):
            if exc.status_code == 404:
                return error(ApiError(404, f"no such path: {request.url.path}", code="not_found"))
            return error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                  code="method_not_allowed" if exc.status_code == 405 else None))

        async def internal(request: Request, exc):
            return error(ApiError(500, f"internal error: {type(exc).__name__}", "server_error"))

        from starlette.exceptions import HTTPException

        routes = [Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                  Route("/v1/completions", completions, methods=["POST"]),
                  Route("/v1/models", models, methods=["GET"]),
                  Route("/health", health, methods=["GET"]),
                  Route("/metrics", metrics, methods=["GET"])]
        return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: internal})

    async def _events(self, request, queue, cancelled, rid, created, chat):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, finish: str | None = None, usage: dict | None = None,
                  delta: dict | None = None) -> str:
            if chat:
                delta = delta if delta is not None else {"content": text} if text is not None else {}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            obj = {"id": rid, "object": kind, "created": created, "model": self.model_id, "choices": [choice]}
            if usage is not None:
                obj["usage"] = usage
            return f"data: {json.dumps(obj)}\n\n"

        if chat:
            yield chunk(None, delta={"role": "assistant", "content": ""})
        try:
            while True:
                try:
                    piece, end = await asyncio.wait_for(queue.get(), timeout=0.25)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        cancelled.set()
                        return
                    continue
                if piece is not None:
                    yield chunk(piece)
                    continue
                if isinstance(end, Exception):
                    yield f"data: {json.dumps(ApiError(500, f'generation failed: {end}', 'server_error').body())}\n\n"
                    return
                yield chunk(None, _finish(end), self._usage(end, end.n_prompt_tokens))
                yield "data: [DONE]\n\n"
                return
        finally:
            cancelled.set()  # a client that went away (the stream closed early) stops the generation

    def _usage(self, stats, n_prompt: int) -> dict:
        cached = max(0, n_prompt - 1 - stats.n_prefilled)  # the KV cache kept them from the previous request
        return {"prompt_tokens": n_prompt, "completion_tokens": stats.n_generated,
                "total_tokens": n_prompt + stats.n_generated, "prompt_tokens_details": {"cached_tokens": cached},
                "speculative": {"mode": self.session.mode, "drafted": stats.n_drafted, "accepted": stats.n_accepted,
                                "acceptance_rate": round(stats.acceptance_rate, 4),
                                "tokens_per_second": round(stats.tokens_per_second, 3),
                                "prompt_seconds": round(stats.prompt_seconds, 6),
                                "decode_seconds": round(stats.decode_seconds, 6)}}

    def _object(self, rid, created, chat, text, stats, n_prompt) -> dict:
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(stats)}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice |= {"text": text, "logprobs": None}
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": self.model_id, "choices": [choice], "usage": self._usage(stats, n_prompt)}


def _finish(stats) -> str:
    return "length" if stats.finish_reason in ("length", "context") else "stop"


def _content(m: dict, i: int) -> str:
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


def serve(session: Session, options: Options, model_id: str, host: str, port: int, api_key: str | None,
          queue_size: int = 8, say=print) -> None:
    """Serve until Ctrl-C or SIGTERM (uvicorn's own handling: the response in progress finishes, then it stops)."""
    import uvicorn

    server = Server(session, options, model_id, api_key, queue_size)
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        say(f"warning: serving on {host} without --api-key: anyone who can reach this port can use the model")
    say(f"serving {model_id} on http://{host}:{port}/v1 ({session.mode}); Ctrl-C stops")
    config = uvicorn.Config(server.app(), host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=30)
    uvicorn.Server(config).run()
    server.stopping.set()
