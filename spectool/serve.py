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
from functools import partial
from typing import Callable

from spectool import serve_infill, serve_logprobs, serve_messages, serve_openai, serve_responses, serve_tokens
from spectool.options import Options, UserError
from spectool.serve_openai import Reply
from spectool.serve_errors import ApiError
from spectool.serve_requests import parse
from spectool.session import Session

# --max-body-bytes 0: a token is about 4 bytes of text, and JSON may spell one character in 12 bytes (two \uXXXX
# escapes); 64 bytes a token leaves room for that and for a conversation's framing
BODY_BYTES_PER_TOKEN = 64


def corpus_metrics(corpus) -> str:
    """The corpus's gauges in Prometheus's text format: its size, and its recent disputes with the requests' own
    text (drafters/corpus.py: decayed counts of those it won and lost, and whether it outranks the requests' own
    text now)."""
    won, lost = corpus.won
    return ("# TYPE spectool_lookup_corpus_tokens gauge\n"
            f"spectool_lookup_corpus_tokens {len(corpus)}\n"
            "# TYPE spectool_lookup_corpus_disputes gauge\n"
            f'spectool_lookup_corpus_disputes{{result="won"}} {won:.3f}\n'
            f'spectool_lookup_corpus_disputes{{result="lost"}} {lost:.3f}\n'
            "# TYPE spectool_lookup_corpus_outranks gauge\n"
            f"spectool_lookup_corpus_outranks {int(corpus.outranks())}\n")


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
    def generation(self, raw: bytes | dict, chat: bool, infill: bool = False):
        """What a request's body asks for (serve_requests.parse). Runs in a thread: parsing and tokenizing a
        large body never holds up the event loop."""
        return parse(raw, chat, self.session, self.options, infill)

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

    def run(self, ticket: int, gen, tokens, stop, push, cancelled: threading.Event,
            limits: serve_infill.Limits | None = None):
        """Generate in this (worker) thread once `ticket` is served, handing (text, the log-probability records of
        its tokens or None) pieces and finally (None, Stats) to `push`; /infill's `limits` end it early, as the
        token budget does."""
        from spectool.core.speculative import generate_text
        from spectool.core.stats import Stats

        tracker = serve_logprobs.Tracker(gen.target) if gen.logprobs is not None else None
        stats = Stats(mode=self.session.mode)
        with self.turn:
            self.turn.wait_for(lambda: self.serving == ticket)
        with self.counting:
            self.waiting -= 1
        try:
            if gen.max_tokens == 0:  # an /infill with n_predict 0 (an editor warming the cache): the prompt only
                t0 = time.perf_counter()
                stats.n_prompt_tokens, stats.n_prefilled = len(tokens), gen.target.sync(tokens[:-1], logits="none")
                stats.prompt_seconds, stats.finish_reason = time.perf_counter() - t0, "length"
            elif not cancelled.is_set():  # a client that left while waiting costs nothing
                for text, step in generate_text(gen, tokens, stop, stats, lambda: cancelled.is_set() or
                                                self.stopping.is_set() or (limits is not None and limits.reached)):
                    text = limits.cut(text) if limits is not None else text
                    records = tracker.feed(text, step) if tracker is not None else None
                    if text or records:
                        push((text, records))
                if limits is not None and limits.reached and stats.finish_reason in (None, "interrupted"):
                    stats.finish_reason = "length"
        except KeyboardInterrupt:  # the prefill stopped between batches: the client left (speculative._prefill)
            pass
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

    async def start(self, request, raw: bytes | dict, chat: bool, infill: bool = False) -> Reply:
        """The request's generation under way: its body (read, or already translated from another API:
        serve_responses, serve_messages) parsed in a thread, its choices' places in the queue taken, one after
        another (503 when full)."""
        # one model is served: any `model` names it, as with llama-server (responses name the real one)
        asked = await asyncio.to_thread(self.generation, raw, chat, infill)
        gens, tokens, stop = asked.gens, asked.tokens, asked.stop
        with self.counting:
            if self.waiting >= self.options.queue:
                self.totals.rejected += 1
                raise ApiError(503, f"busy: {self.waiting} requests are waiting; try again later",
                               "server_error", "queue_full")
            self.waiting += len(gens)
            self.totals.requests += 1
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()
        queues: list[asyncio.Queue] = []
        with self.turn:  # the choices' turns one after another: `n` generations in a row
            for gen in gens:
                queues.append(queue := asyncio.Queue())
                threading.Thread(target=self.run, daemon=True, args=(
                    self.ticket(), gen, tokens, stop,
                    lambda item, q=queue: loop.call_soon_threadsafe(q.put_nowait, item), cancelled,
                    asked.limits)).start()
        logprobs = None
        if gens[0].logprobs is not None:  # OpenAI's shape of a choice's records (serve_logprobs.py)
            logprobs = partial(serve_logprobs.chat if chat else serve_logprobs.completion, model=gens[0].target)
        return Reply(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time()), chat,
                     asked.stream, len(tokens), self._pieces(request, queues, cancelled), asked.tools, n=len(gens),
                     fields=asked.fields, logprobs=logprobs)

    async def whole(self, reply: Reply) -> dict:
        """The reply's answer in one object: a chat.completion or a text_completion."""
        texts, ends, records = await serve_openai.choices(reply)
        return serve_openai.answer(reply, texts, ends, records, self.model_id, self.session.mode)

    def chunks(self, reply: Reply):
        """The reply's answer as the objects OpenAI streams (serve_openai.chunks)."""
        return serve_openai.chunks(reply, self.model_id, self.session.mode)

    # -- the ASGI application ------------------------------------------------------------------------------------
    def app(self):
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.requests import ClientDisconnect, Request
        from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
        from starlette.routing import Route

        def error(e: ApiError, shape: Callable[[ApiError], dict] = ApiError.body) -> JSONResponse:
            # a body left unread (413, 408) would be taken for the next request: those close the connection
            close = {"Connection": "close"} if e.status in (408, 413) else None
            return JSONResponse(shape(e), status_code=e.status, headers=close)

        def answered(handler, shape: Callable[[ApiError], dict] = ApiError.body):
            """The endpoint `handler` that always answers: ApiError as itself, anything else as a 500 and one line
            through `say` (stderr), in its API's error `shape`. Nothing reaches Starlette's error middleware, which
            would re-raise it to uvicorn (a traceback, and a keep-alive connection dropped under the client)."""
            async def endpoint(request: Request):
                try:
                    return await handler(request)
                except ApiError as e:
                    return error(e, shape)
                except ClientDisconnect:  # gone while sending its body: no one reads the answer
                    return error(ApiError(499, "the client closed the connection", code="client_closed"), shape)
                except Exception as e:  # noqa: BLE001 - one line on stderr, never a traceback
                    self.say(f"error: {request.method} {request.url.path}: {type(e).__name__}: {e}")
                    return error(ApiError(500, f"internal error: {type(e).__name__}", "server_error"), shape)
            return endpoint

        def authorised(request: Request) -> None:
            # the header's bytes (Starlette decodes them as latin-1), compared in constant time; Anthropic's clients
            # send the key as x-api-key, which llama-server reads too
            key = request.headers.get("x-api-key")
            sent = (f"Bearer {key}" if key and "authorization" not in request.headers else
                    request.headers.get("authorization", "")).encode("latin-1")
            if self.api_key and not hmac.compare_digest(sent, f"Bearer {self.api_key}".encode()):
                raise ApiError(401, "invalid API key (send 'Authorization: Bearer KEY')", "authentication_error",
                               "invalid_api_key")

        async def complete(request: Request, chat: bool, infill: bool = False):
            authorised(request)
            reply = await self.start(request, await self.body(request), chat, infill)
            if infill:  # llama-server's fill-in-the-middle answer (serve_infill.py)
                return await serve_infill.respond(reply.pieces, reply.stream, reply.n_prompt, self.model_id,
                                                  reply.fields)
            if reply.stream:
                return StreamingResponse(self._events(reply), media_type="text/event-stream")
            return JSONResponse(await self.whole(reply))

        async def models(request: Request):
            authorised(request)
            return JSONResponse({"object": "list", "data": [
                {"id": self.model_id, "object": "model", "created": 0, "owned_by": "spectool"}]})

        async def health(request: Request):  # open, as llama-server's: load balancers and probes hold no key
            return JSONResponse({"status": "ok"})

        async def metrics(request: Request):  # open too, as llama-server's: counters only, no text of anyone's
            corpus = self.session.corpus  # its size and its disputes' tally, where there is one (--lookup-corpus)
            text = self.totals.prometheus() + ("" if corpus is None else corpus_metrics(corpus))
            return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

        async def chat_completions(request: Request):
            return await complete(request, True)

        async def completions(request: Request):
            return await complete(request, False)

        async def tokens(request: Request):  # llama-server's /tokenize and /detokenize (serve_tokens.py)
            authorised(request)
            raw = await self.body(request)
            return JSONResponse(await asyncio.to_thread(serve_tokens.answer, request.url.path, raw,
                                                        self.session.gen.target))

        async def api(request: Request, answer):  # another API over the chat path: serve_responses, serve_messages
            authorised(request)
            return await answer(self, request)

        async def http_error(request: Request, exc):
            if exc.status_code == 404:
                return error(ApiError(404, f"no such path: {request.url.path}", code="not_found"))
            return error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                  code="method_not_allowed" if exc.status_code == 405 else None))

        routes = [Route("/v1/chat/completions", answered(chat_completions), methods=["POST"]),
                  Route("/v1/completions", answered(completions), methods=["POST"]),
                  Route("/infill", answered(lambda r: complete(r, False, infill=True)), methods=["POST"]),
                  Route("/tokenize", answered(tokens), methods=["POST"]),
                  Route("/detokenize", answered(tokens), methods=["POST"]),
                  Route("/v1/responses", answered(lambda r: api(r, serve_responses.answer)), methods=["POST"]),
                  *[Route(path, answered(lambda r, f=f: api(r, f), serve_messages.error_body), methods=["POST"])
                    for path, f in (("/v1/messages", serve_messages.answer),
                                    ("/v1/messages/count_tokens", serve_messages.count_tokens))],
                  Route("/v1/models", answered(models), methods=["GET"]),
                  Route("/health", answered(health), methods=["GET"]),
                  Route("/metrics", answered(metrics), methods=["GET"])]
        return Starlette(routes=routes, exception_handlers={HTTPException: http_error})

    @staticmethod
    async def _pieces(request, queues, cancelled):
        """The workers' (text, records) pieces and each one's last (None, Stats or Exception) as they come, one
        worker (a choice) after another. A client that goes away (looked for every 0.25 s, streamed or not) sets
        `cancelled`, which stops its generation at the next step (the worker then hands over its last item, and
        the choices after it generate nothing); so does a stream closed early."""
        async def watch():
            while not await request.is_disconnected():
                await asyncio.sleep(0.25)
            cancelled.set()

        watcher = asyncio.create_task(watch())
        try:
            for queue in queues:
                while True:
                    item = await queue.get()
                    yield item
                    if item[0] is None:
                        if isinstance(item[1], Exception):
                            return
                        break
        finally:
            watcher.cancel()
            cancelled.set()

    async def _events(self, reply: Reply):
        async for obj in self.chunks(reply):
            yield f"data: {json.dumps(obj)}\n\n"
            if "error" in obj:
                return
        yield "data: [DONE]\n\n"


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
