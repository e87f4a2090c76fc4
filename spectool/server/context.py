"""The server's state and its generations (as llama-server's server-context): the session it
generates with, the requests' turns, and each generation in a worker thread, its pieces handed to
the event loop.

One model, one sequence: requests take turns in arrival order (a bounded queue answers 503 when
full), each generation runs in a worker thread and streams its text through an asyncio queue, and a
client that goes away (streamed or not) stops its generation at the next step. The event loop only
moves bytes: a request's body is read within a size limit (413) and a time limit (408), then parsed
and tokenized in a thread of its own (requests.py). The KV cache keeps what the previous request
shared with the next (its longest common token prefix), so an agent that resends its whole
conversation prefills only what is new; with --parallel, each slot's sequence keeps its own, and a
request takes the free slot whose cache shares the longest prefix with it (generate/batch.py's
Batch.pick).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from functools import partial
from typing import AsyncGenerator, Callable

from spectool.options import Options
from spectool.server import logprobs
from spectool.server.completions import Reply, answer, choices, chunks
from spectool.server.errors import ApiError
from spectool.server.guard import Guard
from spectool.server.infill import Limits
from spectool.server.metrics import Ignored, Slots, Totals
from spectool.server.requests import Request, parse
from spectool.server.slots import Task
from spectool.session import Session

# --max-body-bytes 0: a token is about 4 bytes of text, and JSON may spell one character in 12 bytes
# (two \uXXXX escapes); 64 bytes a token leaves room for that and for a conversation's framing
BODY_BYTES_PER_TOKEN = 64
# the name of each choice's worker thread (Server.run), which Server.close waits for
GENERATION_THREAD = "spectool-generation"
# a keep-alive where an API has no event of its own for one: an SSE comment, which clients skip
COMMENT = ": keep-alive\n\n"


class Turns:
    """At most `slots` generations at a time (--parallel), started in arrival order: each takes a
    ticket, and the tickets are served in turn; at most `queue` generations wait (one more is a
    503)."""

    def __init__(self, queue: int, slots: int = 1):
        self.queue = queue
        self.slots = slots
        self.turn = threading.Condition()
        self.next_ticket = 0
        self.serving = 0  # the next ticket to start
        self.running = 0  # generations started and not done
        self.waiting = 0  # generations that have a ticket and are not served yet

    def take(self, n: int) -> list[int]:
        """n tickets in a row (a request's `n` choices, one after another); a 503 when it would wait
        and the queue is full (--queue 0: no waiting room, so only while every slot is taken)."""
        with self.turn:
            free = self.slots - self.running  # (a ticket taken, not yet served, will take one)
            if self.waiting >= free and self.waiting - free >= self.queue:
                raise ApiError(503, f"busy: {self.waiting - free} requests are waiting "
                                    f"(--queue {self.queue}); try again later", "server_error",
                               "queue_full")
            self.waiting += n
            self.next_ticket += n
            return list(range(self.next_ticket - n, self.next_ticket))

    def wait(self, ticket: int) -> None:
        """Block until `ticket` is served: the tickets before it started, and a slot free."""
        with self.turn:
            self.turn.wait_for(lambda: self.serving == ticket and self.running < self.slots)
            self.serving, self.running = ticket + 1, self.running + 1
            self.waiting -= 1
            self.turn.notify_all()

    def done(self) -> None:
        """A generation being served ended: its slot is free for the next ticket."""
        with self.turn:
            self.running -= 1
            self.turn.notify_all()


class Server:
    """The server's state: the session it generates with, `options` (the requests' defaults and
    --queue, --max-body-bytes, --body-timeout), the requests' turns and the totals /metrics
    reports."""

    def __init__(self, session: Session, options: Options, model_id: str,
                 api_key: str | None = None,
                 say: Callable[[str], None] = print, host: str = "127.0.0.1",
                 port: int | None = None):
        self.session = session
        self.options = options
        self.model_id = model_id
        self.api_key = api_key
        self.say = say
        self.max_body = options.max_body_bytes or BODY_BYTES_PER_TOKEN * session.gen.target.n_ctx
        self.turns = Turns(options.queue, options.parallel)
        self.totals = Totals()
        self.ignored = Ignored()  # the request fields that asked nothing (fields.py)
        # what each slot runs, or ran last (slots.py): one a sequence --parallel decodes together
        self.tasks: list[Task | None] = [None] * options.parallel
        self.slots = Slots(options.parallel)  # each slot's counters (metrics.py)
        self.batcher = None
        if options.parallel > 1:  # the generations under way decoded together (batching.py)
            from spectool.server.batching import Batcher

            self.batcher = Batcher(session.gen.target, options.parallel)
        self.stopping = threading.Event()
        # who may call from a web page (guard.py): the Host names, the pages' origins
        self.guard = Guard.of(host, port, options.allowed_hosts, options.cors_origins)

    def parse_request(self, raw: bytes | dict, chat: bool, infill: bool = False) -> Request:
        """What a request's body asks for (requests.parse). Runs in a thread: parsing and tokenizing
        a large body never holds up the event loop."""
        return parse(raw, chat, self.session, self.options, infill)

    async def body(self, request) -> bytes:
        """The request's body, at most `max_body` bytes (413) and sent within --body-timeout seconds
        (408); both close the connection, as what is left of the body would be read as the next
        request."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise ApiError(413, f"the request body has {length} bytes; this server takes at most "
                                f"{self.max_body} (--max-body-bytes)", code="body_too_large")

        async def read() -> bytes:
            data = bytearray()
            async for chunk in request.stream():
                data += chunk
                if len(data) > self.max_body:
                    raise ApiError(413, f"the request body is over {self.max_body} bytes "
                                        "(--max-body-bytes)",
                                   code="body_too_large")
            return bytes(data)

        try:
            return await asyncio.wait_for(read(), self.options.body_timeout)
        except asyncio.TimeoutError:
            raise ApiError(408, "the request body did not arrive within "
                                f"{self.options.body_timeout} s "
                                "(--body-timeout)", code="body_timeout") from None

    def run(self, ticket: int, gen, tokens: list[int], stop: list[str], push,
            cancelled: threading.Event,
            limits: Limits | None = None, steps: bool = False) -> None:
        """Generate in this (worker) thread once `ticket` is served, handing (text, the
        log-probability records of its tokens or None) pieces and finally (None, Stats) to `push`;
        with `steps`, each step's piece is (text, records, what drafted it: step_of), even where it
        made no text yet. /infill's `limits` end it early, as the token budget does."""
        from spectool.core.stats import Stats

        stats = Stats(mode=self.session.mode)
        self.turns.wait(ticket)
        with self.turns.turn:  # a slot not processing: with --parallel, the one Batch.pick picks
            free = [i for i, t in enumerate(self.tasks) if t is None or not t.processing]
            slot = free[0] if self.batcher is None else self.batcher.batch.pick(tokens, free)
            self.tasks[slot] = task = Task(ticket, gen, len(tokens), stats)
        try:
            # an /infill with n_predict 0 (an editor warming the cache): the prompt only
            if gen.max_tokens == 0:
                warm(gen, tokens, stats, self.batcher, slot)
            # a client that left while waiting costs nothing, nor does a turn once the server stops
            elif not cancelled.is_set() and not self.stopping.is_set():
                self.generate(gen, tokens, stop, push, cancelled, limits, stats, slot, steps)
        # the prefill stopped between batches: the client left (loop.prefill)
        except KeyboardInterrupt:
            pass
        except Exception as e:  # noqa: BLE001 - a 500 to the client, a line here, no traceback
            self.say(f"error: generation failed: {type(e).__name__}: {' '.join(str(e).split())}")
            push((None, e))
            return
        finally:
            self.slots.finish(slot, task)  # free
            self.turns.done()
        if self.stopping.is_set() and stats.finish_reason in (None, "interrupted"):
            stats.finish_reason = "length"  # cut short by SIGTERM or Ctrl-C, as by a token budget
        self.totals.add(len(tokens), stats, cancelled.is_set())
        push((None, stats))

    def close(self, timeout: float = 30) -> None:
        """Stop: the generations under way end at their next step, those waiting for their turn
        generate nothing; wait (at most `timeout` seconds) until every generation thread is done, so
        that the session closes (the model freed, the cost table saved) under none of them."""
        self.stopping.set()
        deadline = time.monotonic() + timeout
        for t in threading.enumerate():
            if t.name == GENERATION_THREAD:
                t.join(max(0.0, deadline - time.monotonic()))

    def generate(self, gen, tokens: list[int], stop: list[str], push, cancelled: threading.Event,
                 limits: Limits | None, stats, slot: int = 0, traced: bool = False) -> None:
        """One generation's pieces handed to `push`, until it ends, its client leaves, the server
        stops or /infill's `limits` are reached; with --parallel, in the batch's sequence `slot`;
        `traced` (`draft_steps`): every step's piece, with what drafted it (step_of)."""
        from spectool.generate.loop import generate_text

        tracker = logprobs.Tracker(gen.target) if gen.logprobs is not None else None

        def interrupted() -> bool:
            return cancelled.is_set() or self.stopping.is_set() or (limits is not None
                                                                    and limits.reached)

        steps = (generate_text(gen, tokens, stop, stats, interrupted) if self.batcher is None
                 else self.batcher.generate(gen, tokens, stop, stats, interrupted, slot))
        for text, step in steps:
            text = limits.cut(text) if limits is not None else text
            records = tracker.feed(text, step) if tracker is not None else None
            if traced:
                push((text, records, step_of(step, gen.target)))
            elif text or records:
                push((text, records))
        if limits is not None and limits.reached and stats.finish_reason in (None, "interrupted"):
            stats.finish_reason = "length"

    async def start(self, request, raw: bytes | dict, chat: bool, infill: bool = False) -> Reply:
        """The request's generation under way: its body (read, or already translated from another
        API: responses.py, messages.py) parsed in a thread, its choices' places in the queue taken,
        one after another (503 when full). One model is served: any `model` names it, as with
        llama-server (answers name the real one)."""
        asked = await asyncio.to_thread(self.parse_request, raw, chat, infill)
        self.ignored.add("chat" if chat else "completions", asked.ignored)
        try:
            tickets = self.turns.take(len(asked.gens))
        except ApiError:
            self.totals.requests_rejected += 1
            raise
        self.totals.requests += 1
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()
        queues: list[asyncio.Queue] = []
        for ticket, gen in zip(tickets, asked.gens):
            queues.append(queue := asyncio.Queue[tuple]())
            threading.Thread(target=self.run, daemon=True, name=GENERATION_THREAD, args=(
                ticket, gen, asked.tokens, asked.stop, handing(loop, queue), cancelled,
                asked.limits, asked.steps)).start()
        shape = None
        if asked.gens[0].logprobs is not None:  # OpenAI's shape of a choice's records (logprobs.py)
            shape = partial(logprobs.chat if chat else logprobs.completion,
                            model=asked.gens[0].target)
        return Reply(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time()),
                     chat,
                     asked.stream, len(asked.tokens), pieces(request, queues, cancelled),
                     asked.tools,
                     n=len(asked.gens), fields=asked.fields, logprobs=shape)

    async def whole(self, reply: Reply) -> dict:
        """The reply's answer in one object: a chat.completion or a text_completion."""
        texts, ends, records = await choices(reply)
        return answer(reply, texts, ends, records, self.model_id, self.session.mode)

    def chunks(self, reply: Reply):
        """The reply's answer as the objects OpenAI streams (completions.chunks)."""
        return chunks(reply, self.model_id, self.session.mode)

    def stream(self, events, beat: str = COMMENT):
        """A stream of server-sent `events`, kept alive (`kept_alive`, --keepalive)."""
        from starlette.responses import StreamingResponse

        return StreamingResponse(kept_alive(events, beat, self.options.keepalive),
                                 media_type="text/event-stream")

    async def events(self, reply: Reply):
        """The reply's chunks as server-sent events."""
        async for obj in self.chunks(reply):
            yield f"data: {json.dumps(obj)}\n\n"
            if "error" in obj:
                return
        yield "data: [DONE]\n\n"


async def kept_alive(events: AsyncGenerator[str, None], beat: str, seconds: float):
    """A stream's `events`, with `beat` after each `seconds` of silence (a long prompt prefilled, a
    tool call held until it is whole), so that a client's idle watchdog does not give up on it (0:
    none). Closed early, it closes `events`, which stops the generation."""
    pending: asyncio.Future | None = None
    try:
        while True:
            pending = pending or asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending}, timeout=seconds or None)
            if not done:
                yield beat
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield event
    finally:
        if pending is not None and pending.cancel():
            await asyncio.gather(pending, return_exceptions=True)
        await events.aclose()


def step_of(step, target) -> dict:
    """What drafted a step's text (a streamed chunk's `draft_step`): the drafter's source (none:
    nothing drafted), its drafted and accepted tokens (a grammar forced `forced` of them), the
    tokens made final, how many of the text's characters came from accepted drafts (the rest is
    the target's own token), and the text of the drafts the target refused."""
    return {"source": str(step.source), "drafted": step.drafted, "accepted": step.accepted,
            "forced": step.forced, "tokens": len(step.tokens), "draft_chars": step.draft_chars,
            "rejected": target.detokenize(step.rejected)}


def handing(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> Callable[[tuple], None]:
    """A worker's `push`: an item into `queue` on the event loop's thread; nothing once the loop has
    closed (the server stopped: no one is left to read it)."""
    def push(item: tuple) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed
            pass
    return push


def warm(gen, tokens: list[int], stats, batcher=None, slot: int = 0) -> None:
    """The prompt into the cache only, nothing generated (an /infill with n_predict 0: an editor
    warming it); with --parallel above 1, into the `slot`'s sequence of the `batcher`'s batch."""
    t0 = time.perf_counter()
    stats.n_prompt_tokens = len(tokens)
    if batcher is None:
        stats.n_prefilled = gen.target.sync(tokens[:-1], logits="none")
    else:
        batcher.warm(gen, tokens, stats, slot)
    stats.prompt_seconds = time.perf_counter() - t0
    stats.finish_reason = "length"


async def pieces(request, queues: list[asyncio.Queue], cancelled: threading.Event):
    """The workers' (text, records) pieces and each one's last (None, Stats or Exception) as they
    come, one worker (a choice) after another. A client that goes away (looked for every 0.25 s,
    streamed or not) sets `cancelled`, which stops its generation at the next step (the worker then
    hands over its last item, and the choices after it generate nothing); so does a stream closed
    early."""
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
