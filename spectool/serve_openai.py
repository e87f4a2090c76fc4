"""OpenAI's answer shapes for a request under way (`Reply`): the chat.completion or text_completion object, the
chunks it streams, and usage with spectool's speculative counters. A reply holds `n` choices, generated one after
another: their pieces come in order, each choice's ended by its Stats (or an Exception, which ends them all)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spectool.serve_errors import ApiError


@dataclass
class Reply:
    """A request under way: what its answer is made of. `pieces` are the workers' items (Server._pieces), the
    choices' one after another; `stats` is set when they end (the last choice's)."""
    rid: str
    created: int
    chat: bool
    stream: bool
    n_prompt: int
    pieces: Any
    tools: Any = None
    stats: Any = None
    n: int = 1  # choices
    fields: Any = None  # /infill: the response_fields asked for (serve_infill)
    logprobs: Any = None  # where asked: a choice's log-probability records in OpenAI's shape (serve_logprobs)


def finish(stats) -> str:
    return "length" if stats.finish_reason in ("length", "context") else "stop"


def usage(ends: list, n_prompt: int, mode: str) -> dict:
    """The usage of a request's choices (`ends`: their Stats): the prompt once, as OpenAI counts it, the
    completions' tokens and the speculation summed over them."""
    from spectool.core.stats import Stats

    stats = Stats.summed(ends)
    cached = max(0, n_prompt - 1 - stats.n_prefilled)  # the KV cache kept them from the previous request
    return {"prompt_tokens": n_prompt, "completion_tokens": stats.n_generated,
            "total_tokens": n_prompt + stats.n_generated, "prompt_tokens_details": {"cached_tokens": cached},
            "speculative": {"mode": mode, "drafted": stats.n_drafted, "accepted": stats.n_accepted,
                            "acceptance_rate": round(stats.acceptance_rate, 4),
                            "by_source": dict(stats.by_source),  # drafted tokens: lookup, draft, ..., grammar
                            "tokens_per_second": round(stats.tokens_per_second, 3),
                            "prompt_seconds": round(stats.prompt_seconds, 6),
                            "decode_seconds": round(stats.decode_seconds, 6)}}


async def choices(reply: Reply) -> tuple[list[str], list, list[list]]:
    """Each choice's whole text, its Stats and its tokens' log-probability records (empty unless asked); a 500
    where generation failed."""
    texts, ends, records = [[]], [], [[]]
    async for piece, end in reply.pieces:  # (a failure ends them)
        if piece is not None:
            texts[-1].append(piece)
            records[-1].extend(end or ())
        else:
            ends.append(end)
            texts.append([])
            records.append([])
    if isinstance(ends[-1], Exception):
        raise ApiError(500, f"generation failed: {ends[-1]}", "server_error")
    reply.stats = ends[-1]
    return ["".join(t) for t in texts[:-1]], ends, records[:-1]


def logprobs(reply: Reply, records: list) -> dict | None:
    return reply.logprobs(records) if reply.logprobs is not None else None


def answer(reply: Reply, texts: list[str], ends: list, records: list[list], model_id: str, mode: str) -> dict:
    """The chat.completion or text_completion object of the choices' texts."""
    out: list[dict[str, Any]] = []
    for i, (text, stats) in enumerate(zip(texts, ends)):
        choice: dict[str, Any] = {"index": i, "finish_reason": finish(stats), "logprobs": logprobs(reply, records[i])}
        if reply.chat:
            tools = reply.tools
            choice["message"], called = tools.message(text) if tools else ({"role": "assistant", "content": text}, 0)
            choice["finish_reason"] = "tool_calls" if called else choice["finish_reason"]
        else:
            choice["text"] = text
        out.append(choice)
    return {"id": reply.rid, "object": "chat.completion" if reply.chat else "text_completion",
            "created": reply.created, "model": model_id, "choices": out, "usage": usage(ends, reply.n_prompt, mode)}


async def chunks(reply: Reply, model_id: str, mode: str):
    """The reply's answer as the objects OpenAI streams (chat.completion.chunk or text_completion), each naming
    its choice's index, the last choice's finish chunk with the usage of all; or, where generation failed, an
    error object. Where log-probabilities are asked for, a chunk carries those of the tokens its text completes
    (those that only a tool call's text held back go with the next chunk out)."""
    chat, pieces, tools = reply.chat, reply.pieces, reply.tools
    kind = "chat.completion.chunk" if chat else "text_completion"
    ends: list = []  # the Stats of the choices done
    held: list = []  # log-probability records not sent yet

    def chunk(text: str | None, finish_reason: str | None = None, usage_: dict | None = None,
              delta: dict | None = None) -> dict:
        if chat:
            delta = delta if delta is not None else {"content": text} if text is not None else {}
            choice = {"index": len(ends), "delta": delta, "finish_reason": finish_reason}
        else:
            choice = {"index": len(ends), "text": text or "", "finish_reason": finish_reason}
        if held:
            choice["logprobs"] = logprobs(reply, held[:])
            held.clear()
        obj = {"id": reply.rid, "object": kind, "created": reply.created, "model": model_id, "choices": [choice]}
        if usage_ is not None:
            obj["usage"] = usage_
        return obj

    shaped = tools.streamer() if tools else None  # content as it comes, tool calls once read (tools.Stream)
    try:
        if chat:
            yield chunk(None, delta={"role": "assistant", "content": ""})
        async for piece, end in pieces:
            if piece is not None:
                held.extend(end or ())
            if piece is not None and shaped:
                for delta in shaped.feed(piece):
                    yield chunk(None, delta=delta)
            elif piece is not None:
                yield chunk(piece)
            elif isinstance(end, Exception):
                yield ApiError(500, f"generation failed: {end}", "server_error").body()
            else:
                reply.stats = end
                deltas, called = shaped.end() if shaped else ([], False)
                for delta in deltas:
                    yield chunk(None, delta=delta)
                reason = "tool_calls" if called else finish(end)
                if len(ends) < reply.n - 1:
                    yield chunk(None, reason)
                    ends.append(end)
                    shaped = tools.streamer() if tools else None
                    if chat:
                        yield chunk(None, delta={"role": "assistant", "content": ""})
                else:
                    yield chunk(None, reason, usage([*ends, end], reply.n_prompt, mode))
    finally:
        await pieces.aclose()  # a stream closed early (the client went away) stops the generation
