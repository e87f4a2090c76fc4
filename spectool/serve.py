"""`spectool serve`: an OpenAI-compatible HTTP server over the session layer (Starlette on uvicorn).

One model, one sequence: requests take turns in arrival order (a bounded queue answers 503 when full), each
generation runs in a worker thread and streams its text through an asyncio queue, and a client that goes away
(streamed or not) stops its generation at the next step. The event loop only moves bytes: a request's body is read
within a size limit (413) and a time limit (408), then parsed and tokenized in a thread of its own
(serve_requests.py). The KV cache keeps what the previous request shared with the next (its longest common token
prefix), so an agent that resends its whole conversation prefills only what is new.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from spectool.options import Options, UserError
from spectool.serve_requests import ApiError, parse
from spectool.session import Session

# --max-body-bytes 0: a token is about 4 bytes of text, and JSON may spell one character in 12 bytes (two \uXXXX
# escapes); 64 bytes a token leaves room for that and for a conversation's framing
BODY_BYTES_PER_TOKEN = 64


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
    """The server's state: the session it generates with, `options` (the requests' defaults and --queue,
    --max-body-bytes, --body-timeout), the turn of each request and the totals /metrics reports."""

    def __init__(self, session: Session, options: Options, model_id: str, api_key: str | None = None,
                 say: Callable[[str], None] = print):
        self.session, self.options, self.model_id = session, options, model_id
        self.api_key, self.say = api_key, say
        self.max_body = options.max_body_bytes or BODY_BYTES_PER_TOKEN * session.gen.target.n_ctx
        self.turn = threading.Condition()  # one generation at a time, in arrival order (tickets)
        self.next_ticket = self.serving = 0
        self.counting = threading.Lock()
        self.waiting = 0
        self.totals = Totals()
        self.stopping = threading.Event()

    # -- requests ------------------------------------------------------------------------------------------------
    def generation(self, raw: bytes, chat: bool):
        """(Generation, prompt tokens, stop strings, stream) of a request's body (serve_requests.parse). Runs in a
        thread: parsing and tokenizing a large body never holds up the event loop."""
        return parse(raw, chat, self.session, self.options)

    async def body(self, request) -> bytes:
        """The request's body, at most `max_body` bytes (413) and sent within --body-timeout seconds (408); both
        close the connection, as what is left of the body would be read as the next request."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise ApiError(413, f"the request body has {length} bytes; this server takes at most {self.max_body} "
                                "(--max-body-bytes)", code="body_too_large")

        async def read() -> bytes:
            data = bytearray()
            async for chunk in request.stream():
                data += chunk
                if len(data) > self.max_body:
                    raise ApiError(413, f"the request body is over {self.max_body} bytes (--max-body-bytes)",
                                   code="body_too_large")
            return bytes(data)

        try:
            return await asyncio.wait_for(read(), self.options.body_timeout)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {self.options.body_timeout} s "
                                "(--body-timeout)", code="body_timeout") from None

    def ticket(self) -> int:
        with self.turn:
            self.next_ticket += 1
            return self.next_ticket - 1

    def run(self, ticket: int, gen, tokens, stop, push, cancelled: threading.Event):
        """Generate in this (worker) thread once `ticket` is served, handing (text, the records of its tokens'
        logprobs or None) pieces and finally (None, Stats) to `push`."""
        from spectool.core.speculative import generate_text
        from spectool.core.stats import Stats
        from spectool.serve_logprobs import Tracker

        tracker = Tracker(gen.target) if gen.logprobs is not None else None

        stats = Stats(mode=self.session.mode)
        with self.turn:
            self.turn.wait_for(lambda: self.serving == ticket)
        with self.counting:
            self.waiting -= 1
        try:
            if not cancelled.is_set():  # a client that left while waiting costs nothing
                for text, step in generate_text(gen, tokens, stop, stats, lambda: cancelled.is_set() or
                                                self.stopping.is_set()):
                    records = tracker.feed(text, step) if tracker is not None else None
                    if text or records:
                        push((text, records))
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
        from starlette.exceptions import HTTPException
        from starlette.requests import ClientDisconnect, Request
        from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
        from starlette.routing import Route

        def error(e: ApiError) -> JSONResponse:
            # a body left unread (413, 408) would be taken for the next request: those close the connection
            close = {"Connection": "close"} if e.status in (408, 413) else None
            return JSONResponse(e.body(), status_code=e.status, headers=close)

        def answered(handler):
            """The endpoint `handler` that always answers: ApiError as itself, anything else as a 500 and one line
            through `say` (stderr). Nothing reaches Starlette's error middleware, which would re-raise it to uvicorn
            (a traceback, and a keep-alive connection dropped under the client)."""
            async def endpoint(request: Request):
                try:
                    return await handler(request)
                except ApiError as e:
                    return error(e)
                except ClientDisconnect:  # gone while sending its body: no one reads the answer
                    return error(ApiError(499, "the client closed the connection", code="client_closed"))
                except Exception as e:  # noqa: BLE001 - one line on stderr, never a traceback
                    self.say(f"error: {request.method} {request.url.path}: {type(e).__name__}: {e}")
                    return error(ApiError(500, f"internal error: {type(e).__name__}", "server_error"))
            return endpoint

        def authorised(request: Request) -> None:
            # the header's bytes (Starlette decodes them as latin-1), compared in constant time
            sent = request.headers.get("authorization", "").encode("latin-1")
            if self.api_key and not hmac.compare_digest(sent, f"Bearer {self.api_key}".encode()):
                raise ApiError(401, "invalid API key (send 'Authorization: Bearer KEY')", "authentication_error",
                               "invalid_api_key")

        async def complete(request: Request, chat: bool):
            authorised(request)
            raw = await self.body(request)
            # one model is served: any `model` names it, as with llama-server (responses name the real one)
            gen, tokens, stop, stream = await asyncio.to_thread(self.generation, raw, chat)
            with self.counting:
                if self.waiting >= self.options.queue:
                    self.totals.rejected += 1
                    raise ApiError(503, f"busy: {self.waiting} requests are waiting; try again later",
                                   "server_error", "queue_full")
                self.waiting += 1
                self.totals.requests += 1
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()
            cancelled = threading.Event()
            worker = threading.Thread(target=self.run, daemon=True,
                                      args=(self.ticket(), gen, tokens, stop, lambda item: loop.call_soon_threadsafe(
                                          queue.put_nowait, item), cancelled))
            worker.start()
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
            created = int(time.time())
            pieces = self._pieces(request, queue, cancelled)
            if stream:
                return StreamingResponse(self._events(pieces, rid, created, chat), media_type="text/event-stream")
            text, end, records = [], None, [] if gen.logprobs is not None else None
            async for piece, end in pieces:
                if piece is not None:
                    text.append(piece)
                    if end:  # the logprobs of its tokens
                        records.extend(end)
            if isinstance(end, Exception):
                raise ApiError(500, f"generation failed: {end}", "server_error")
            return JSONResponse(self._object(rid, created, chat, "".join(text), end, len(tokens), records))

        async def models(request: Request):
            authorised(request)
            return JSONResponse({"object": "list", "data": [
                {"id": self.model_id, "object": "model", "created": 0, "owned_by": "spectool"}]})

        async def health(request: Request):  # open, as llama-server's: load balancers and probes hold no key
            return JSONResponse({"status": "ok"})

        async def metrics(request: Request):  # open too, as llama-server's: counters only, no text of anyone's
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

        routes = [Route("/v1/chat/completions", answered(chat_completions), methods=["POST"]),
                  Route("/v1/completions", answered(completions), methods=["POST"]),
                  Route("/v1/models", answered(models), methods=["GET"]),
                  Route("/health", answered(health), methods=["GET"]),
                  Route("/metrics", answered(metrics), methods=["GET"])]
        return Starlette(routes=routes, exception_handlers={HTTPException: http_error})

    @staticmethod
    async def _pieces(request, queue, cancelled):
        """The worker's (text, None) pieces and its last (None, Stats or Exception) as they come. A client that goes
        away (looked for every 0.25 s, streamed or not) sets `cancelled`, which stops its generation at the next
        step (the worker then hands over its last item); so does a stream closed early."""
        async def watch():
            while not await request.is_disconnected():
                await asyncio.sleep(0.25)
            cancelled.set()

        watcher = asyncio.create_task(watch())
        try:
            while True:
                item = await queue.get()
                yield item
                if item[0] is None:
                    return
        finally:
            watcher.cancel()
            cancelled.set()

    async def _events(self, pieces, rid, created, chat):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, finish: str | None = None, usage: dict | None = None,
                  delta: dict | None = None, records: list | None = None) -> str:
            if chat:
                delta = delta if delta is not None else {"content": text} if text is not None else {}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            if records is not None:  # the logprobs of this piece's tokens (serve_logprobs.py)
                choice["logprobs"] = self._logprobs(records, chat)
            obj = {"id": rid, "object": kind, "created": created, "model": self.model_id, "choices": [choice]}
            if usage is not None:
                obj["usage"] = usage
            return f"data: {json.dumps(obj)}\n\n"

        if chat:
            yield chunk(None, delta={"role": "assistant", "content": ""})
        try:
            async for piece, end in pieces:
                if piece is not None:
                    yield chunk(piece, records=end)
                elif isinstance(end, Exception):
                    yield f"data: {json.dumps(ApiError(500, f'generation failed: {end}', 'server_error').body())}\n\n"
                else:
                    yield chunk(None, _finish(end), self._usage(end, end.n_prompt_tokens))
                    yield "data: [DONE]\n\n"
        finally:
            await pieces.aclose()  # a stream closed early (the client went away) stops the generation

    def _usage(self, stats, n_prompt: int) -> dict:
        cached = max(0, n_prompt - 1 - stats.n_prefilled)  # the KV cache kept them from the previous request
        return {"prompt_tokens": n_prompt, "completion_tokens": stats.n_generated,
                "total_tokens": n_prompt + stats.n_generated, "prompt_tokens_details": {"cached_tokens": cached},
                "speculative": {"mode": self.session.mode, "drafted": stats.n_drafted, "accepted": stats.n_accepted,
                                "acceptance_rate": round(stats.acceptance_rate, 4),
                                "by_source": dict(stats.by_source),  # drafted tokens: lookup, draft, ..., grammar
                                "tokens_per_second": round(stats.tokens_per_second, 3),
                                "prompt_seconds": round(stats.prompt_seconds, 6),
                                "decode_seconds": round(stats.decode_seconds, 6)}}

    def _logprobs(self, records: list | None, chat: bool) -> dict | None:
        from spectool import serve_logprobs

        if records is None:
            return None
        return (serve_logprobs.chat if chat else serve_logprobs.completion)(records, self.session.gen.target)

    def _object(self, rid, created, chat, text, stats, n_prompt, records=None) -> dict:
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(stats),
                                  "logprobs": self._logprobs(records, chat)}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": self.model_id, "choices": [choice], "usage": self._usage(stats, n_prompt)}


def _finish(stats) -> str:
    return "length" if stats.finish_reason in ("length", "context") else "stop"


def check_api_key(api_key: str | None) -> None:
    """An empty --api-key would turn authentication off without a word: refused (before the model loads)."""
    if api_key is not None and not api_key.strip():
        raise UserError("--api-key is empty: give a key (or set SPECTOOL_API_KEY), or leave the option out to serve "
                        "without one", code=2)


def serve(session: Session, options: Options, model_id: str, host: str, port: int, api_key: str | None,
          say: Callable[[str], None] = print) -> None:
    """Serve until Ctrl-C or SIGTERM (uvicorn's own handling: the response in progress finishes, then it stops)."""
    import uvicorn

    check_api_key(api_key)
    server = Server(session, options, model_id, api_key, say)
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        say(f"warning: serving on {host} without --api-key: anyone who can reach this port can use the model")
    say(f"serving {model_id} on http://{host}:{port}/v1 ({session.mode}); Ctrl-C stops")
    config = uvicorn.Config(server.app(), host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=30)
    uvicorn.Server(config).run()
    server.stopping.set()
