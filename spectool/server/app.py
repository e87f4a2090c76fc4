"""`spectool serve`: the HTTP application (Starlette on uvicorn) and its routes, over the server's
state (context.py): OpenAI's chat completions, completions, Responses and models; Anthropic's
Messages; llama-server's /infill, /tokenize and /detokenize; /health and /metrics; the chat page at
/ (webui.py).

Every route answers: an ApiError as itself, anything else as a 500 and one line on stderr, each in
its API's error shape (`answered`).
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from spectool.options import Options, UserError, is_loopback
from spectool.server import infill, messages, responses, slots, tokens, webui
from spectool.server.context import Server
from spectool.server.errors import ApiError
from spectool.server.guard import Guarded
from spectool.server.metrics import corpus_metrics
from spectool.session import Session

Shape = Callable[[ApiError], dict]  # an API's error body
Handler = Callable[[Request], Awaitable[Response]]


def server_of(request: Request) -> Server:
    return request.app.state.server


def error_response(e: ApiError, shape: Shape = ApiError.body) -> JSONResponse:
    """An error's answer; a body left unread (413, 408) would be taken for the next request: those
    close the connection."""
    close = {"Connection": "close"} if e.status in (408, 413) else None
    return JSONResponse(shape(e), status_code=e.status, headers=close)


def answered(handler: Handler, shape: Shape = ApiError.body) -> Handler:
    """The endpoint `handler` that always answers: ApiError as itself, anything else as a 500 and
    one line through the server's `say` (stderr), in its API's error `shape`. Nothing reaches
    Starlette's error middleware, which would re-raise it to uvicorn (a traceback, and a keep-alive
    connection dropped under the client)."""
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e, shape)
        except ClientDisconnect:  # gone while sending its body: no one reads the answer
            return error_response(ApiError(499, "the client closed the "
                                                "connection", code="client_closed"), shape)
        except Exception as e:  # noqa: BLE001 - one line on stderr, never a traceback
            server_of(request).say(f"error: {request.method} {request.url.path}: "
                                   f"{type(e).__name__}: {e}")
            return error_response(ApiError(500, "internal error: "
                                                f"{type(e).__name__}", "server_error"), shape)
    return endpoint


def authorised(request: Request) -> None:
    """The request's key, where the server has one: `Authorization: Bearer KEY` (the scheme in any
    case, RFC 7235), else x-api-key (Anthropic's clients send it, and llama-server reads it), the
    header's bytes (Starlette decodes them as latin-1) compared in constant time."""
    key = server_of(request).api_key
    if not key:
        return
    scheme, _, sent = request.headers.get("authorization", "").strip().partition(" ")
    if "authorization" not in request.headers:
        sent = request.headers.get("x-api-key", "")
    elif scheme.lower() != "bearer":
        sent = ""
    if not hmac.compare_digest(sent.strip().encode("latin-1"), key.encode()):
        raise ApiError(401, "invalid API key (send 'Authorization: Bearer "
                            "KEY')", "authentication_error",
                       "invalid_api_key")


async def generate_route(request: Request, chat: bool, fim: bool = False) -> Response:
    """A chat completion, a completion or an /infill: the request's generation, answered whole or
    streamed."""
    authorised(request)
    server = server_of(request)
    reply = await server.start(request, await server.body(request), chat, fim)
    if fim:  # llama-server's fill-in-the-middle answer (infill.py)
        return await infill.respond(reply.pieces, reply.stream, reply.n_prompt, server.model_id,
                                    reply.fields)
    if reply.stream:
        return server.stream(server.events(reply))
    return JSONResponse(await server.whole(reply))


async def chat_completions(request: Request) -> Response:
    return await generate_route(request, chat=True)


async def completions(request: Request) -> Response:
    return await generate_route(request, chat=False)


async def fill_in_the_middle(request: Request) -> Response:
    return await generate_route(request, chat=False, fim=True)


async def tokens_route(request: Request) -> Response:
    """llama-server's /tokenize and /detokenize (tokens.py)."""
    authorised(request)
    server = server_of(request)
    raw = await server.body(request)
    return JSONResponse(await asyncio.to_thread(tokens.answer, request.url.path, raw,
                                                server.session.gen.target))


def over_chat(answer: Callable[[Server, Request], Awaitable[Response]]) -> Handler:
    """Another API over the chat path (responses.py, messages.py)."""
    async def route(request: Request) -> Response:
        authorised(request)
        return await answer(server_of(request), request)
    return route


async def models(request: Request) -> Response:
    authorised(request)
    return JSONResponse({"object": "list", "data": [
        {"id": server_of(request).model_id, "object": "model", "created": 0,
         "owned_by": "spectool"}]})


async def props(request: Request) -> Response:
    """llama-server's GET /props and GET /slots (slots.py), behind the key as there."""
    authorised(request)
    server = server_of(request)
    if request.url.path == "/props":
        return JSONResponse(slots.props(server))
    return JSONResponse(slots.slots(server, request.query_params.get("fail_on_no_slot", "") != ""))


async def health(request: Request) -> Response:
    """Open, as llama-server's: load balancers and probes hold no key."""
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    """Counters only, no text of anyone's, behind the key as llama-server's: each slot's, and the
    batch's with --parallel above 1; the corpus's size and its disputes' tally, where there is one
    (--lookup-corpus)."""
    authorised(request)
    server = server_of(request)
    corpus = server.session.corpus
    batch = server.batcher.batch if server.batcher is not None else None
    text = server.totals.prometheus() + server.ignored.prometheus() + server.slots.prometheus(
        server.tasks, batch) + ("" if corpus is None else corpus_metrics(corpus))
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405, in OpenAI's error shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(ApiError(404, f"no such path: {request.url.path}", code="not_found"))
    return error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: "
                                                    f"{exc.detail}",
                                   code="method_not_allowed" if exc.status_code == 405 else None))


def post(path: str, handler: Handler, shape: Shape = ApiError.body) -> Route:
    return Route(path, answered(handler, shape), methods=["POST"])


def get(path: str, handler: Handler) -> Route:
    return Route(path, answered(handler), methods=["GET"])


ROUTES = [
    post("/v1/chat/completions", chat_completions),
    post("/v1/completions", completions),
    post("/infill", fill_in_the_middle),
    post("/tokenize", tokens_route),
    post("/detokenize", tokens_route),
    post("/v1/responses", over_chat(responses.answer)),
    post("/v1/messages", over_chat(messages.answer), messages.error_body),
    post("/v1/messages/count_tokens", over_chat(messages.count_tokens), messages.error_body),
    get("/v1/models", models),
    get("/props", props),
    get("/slots", props),
    get("/health", health),
    get("/metrics", metrics),
]


async def alive(request: Request) -> Response:
    """/ without the page: HEAD answers (Claude Code's check), GET is any unknown path's 404."""
    if request.method == "HEAD":
        return Response()
    raise HTTPException(404)


def make_app(server: Server) -> Starlette:
    """The ASGI application of `server`, behind its guard (guard.py: the Host, the Origin, JSON
    only), which lets the pages of the origins it allows read the answers (CORS)."""
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware

    # the chat page (webui.py), and HEAD /, which Claude Code sends before it starts (answered
    # without the page too)
    page = ([Route("/", alive, methods=["GET", "HEAD"])] if server.options.no_webui else
            [get(path, webui.page) for path in webui.FILES])
    middleware = [Middleware(Guarded, guard=server.guard),
                  Middleware(CORSMiddleware, allow_origins=sorted(server.guard.origins),
                             allow_methods=["GET", "POST"], allow_headers=["*"])]
    app = Starlette(routes=ROUTES + page, exception_handlers={HTTPException: http_error},
                    middleware=middleware)
    app.state.server = server
    return app


def check_api_key(api_key: str | None) -> None:
    """An empty --api-key would turn authentication off without a word: refused (before the model
    loads)."""
    if api_key is not None and not api_key.strip():
        raise UserError("--api-key is empty: give a key (or set SPECTOOL_API_KEY), or leave the "
                        "option out to serve without one", code=2)


def serve(session: Session, options: Options, model_id: str, host: str, port: int,
          api_key: str | None,
          say: Callable[[str], None] = print) -> None:
    """Serve until Ctrl-C or SIGTERM: the generations under way end at their next step, their
    answers end as a length-limited answer ends, uvicorn stops, and once the generation threads are
    done the caller closes the session (its cost table saved) and exits 130 or 143 (cli/errors.py:
    uvicorn raises the signal again once it has stopped)."""
    import uvicorn

    check_api_key(api_key)
    server = Server(session, options, model_id, api_key, say, host, port)
    if not is_loopback(host) and not api_key:
        say(f"warning: serving on {host} without --api-key: anyone who can reach this port can use "
            "the model")
    say(f"serving {model_id} on http://{host}:{port}/v1 ({session.mode}, "
        f"{context_of(session.gen.target, options.parallel)}); Ctrl-C stops")
    config = uvicorn.Config(make_app(server), host=host, port=port, log_level="warning",
                            access_log=False,
                            timeout_graceful_shutdown=30)
    try:
        stopping_with(server, uvicorn.Server)(config).run()
    finally:
        server.close()


def context_of(target, parallel: int) -> str:
    """The start line's words for the context: its tokens, or (--parallel) how many sequences hold
    how many tokens each, and the KV cache they take."""
    if parallel == 1:
        return f"a context of {target.n_ctx} tokens"
    return (f"{parallel} sequences of {target.n_ctx} tokens each, a KV cache of "
            f"{target.kv_cache_bytes() >> 20} MiB in all")


def stopping_with(server: Server, base: type) -> type:
    """uvicorn's Server class, whose handling of SIGTERM and Ctrl-C also stops `server`'s
    generations at their next step: streams get their last chunk and [DONE] at once, and uvicorn's
    graceful shutdown, which waits for them, is not cut short by its 30 s."""
    class Stopping(base):
        def handle_exit(self, sig, frame) -> None:
            server.stopping.set()
            super().handle_exit(sig, frame)
    return Stopping
