"""OpenAI's answer shapes for a request under way (`Reply`): the chat.completion or text_completion
object, the chunks it streams, and usage with spectool's speculative counters. A reply holds `n`
choices, generated one after another: their pieces come in order, each choice's ended by its Stats
(or an Exception, which ends them all)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spectool.server.errors import ApiError


@dataclass
class Reply:
    """A request under way: what its answer is made of. `pieces` are the workers' items
    (Server._pieces), the choices' one after another; `stats` is set when they end (the last
    choice's)."""
    rid: str
    created: int
    chat: bool
    stream: bool
    n_prompt: int
    pieces: Any
    tools: Any = None
    stats: Any = None
    n: int = 1  # choices
    fields: Any = None  # /infill: the response_fields asked for (infill)
    # where asked: a choice's log-probability records in OpenAI's shape (logprobs)
    logprobs: Any = None


def finish(stats) -> str:
    return "length" if stats.finish_reason in ("length", "context") else "stop"


def usage(ends: list, n_prompt: int, mode: str) -> dict:
    """The usage of a request's choices (`ends`: their Stats): the prompt once, as OpenAI counts it,
    the completions' tokens and the speculation summed over them; of the tokens drafted from a
    request's `prediction`, those that appeared in the output and those that did not, in OpenAI's
    names (which count the rejected ones in completion_tokens too: here they count only what was
    generated)."""
    from spectool.core.stats import Stats

    stats = Stats.summed(ends)
    # the KV cache kept them from the previous request
    cached = max(0, n_prompt - 1 - stats.n_prefilled)
    return {"prompt_tokens": n_prompt, "completion_tokens": stats.n_generated,
            "total_tokens": n_prompt + stats.n_generated,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {
                "accepted_prediction_tokens": stats.prediction_accepted,
                "rejected_prediction_tokens": stats.prediction_rejected},
            "speculative": {"mode": mode, "drafted": stats.n_drafted, "accepted": stats.n_accepted,
                            "acceptance_rate": round(stats.acceptance_rate, 4),
                            # drafted tokens: lookup, draft, ..., grammar
                            "by_source": dict(stats.by_source),
                            "tree": stats.tree,  # --draft-tree's steps, siblings, taken
                            "tokens_per_second": round(stats.tokens_per_second, 3),
                            "prompt_seconds": round(stats.prompt_seconds, 6),
                            "decode_seconds": round(stats.decode_seconds, 6)}}


async def choices(reply: Reply) -> tuple[list[str], list, list[list]]:
    """Each choice's whole text, its Stats and its tokens' log-probability records (empty unless
    asked); a 500 where generation failed."""
    texts: list[list[str]] = [[]]
    ends: list = []
    records: list[list] = [[]]
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


def answer(reply: Reply, texts: list[str], ends: list, records: list[list], model_id: str,
           mode: str) -> dict:
    """The chat.completion or text_completion object of the choices' texts."""
    out: list[dict[str, Any]] = []
    for i, (text, stats) in enumerate(zip(texts, ends)):
        choice: dict[str, Any] = {"index": i, "finish_reason": finish(stats),
                                  "logprobs": logprobs(reply, records[i])}
        if reply.chat:
            tools = reply.tools
            choice["message"], called = tools.message(text) if tools else ({"role": "assistant",
                                                                            "content": text}, 0)
            choice["finish_reason"] = "tool_calls" if called else choice["finish_reason"]
        else:
            choice["text"] = text
        out.append(choice)
    return {"id": reply.rid, "object": "chat.completion" if reply.chat else "text_completion",
            "created": reply.created, "model": model_id, "choices": out,
            "usage": usage(ends, reply.n_prompt, mode)}


class Chunks:
    """The chunks of one streamed reply (see `chunks`): which choice is streaming, and the
    log-probability records not sent yet."""

    def __init__(self, reply: Reply, model_id: str, mode: str):
        self.reply, self.model_id, self.mode = reply, model_id, mode
        self.kind = "chat.completion.chunk" if reply.chat else "text_completion"
        self.ends: list = []  # the Stats of the choices done
        self.held: list = []  # log-probability records not sent yet
        self.shaped = self.streamer()

    def streamer(self):
        """A choice's content as it comes and its tool calls once read (tools.Stream), where it
        offers tools."""
        return self.reply.tools.streamer() if self.reply.tools else None

    def chunk(self, text: str | None, finish_reason: str | None = None, usage_: dict | None = None,
              delta: dict | None = None) -> dict:
        reply = self.reply
        if reply.chat:
            delta = delta if delta is not None else {"content": text} if text is not None else {}
            choice = {"index": len(self.ends), "delta": delta, "finish_reason": finish_reason}
        else:
            choice = {"index": len(self.ends), "text": text or "", "finish_reason": finish_reason}
        if self.held:
            choice["logprobs"] = logprobs(reply, self.held[:])
            self.held.clear()
        obj = {"id": reply.rid, "object": self.kind, "created": reply.created,
               "model": self.model_id,
               "choices": [choice]}
        if usage_ is not None:
            obj["usage"] = usage_
        return obj

    def opening(self) -> list[dict]:
        """A chat choice opens with its role."""
        return ([self.chunk(None, delta={"role": "assistant", "content": ""})] if self.reply.chat
                else [])

    def piece(self, piece: str, records, step: dict | None = None) -> list[dict]:
        """A piece's chunks; with its `step` (`draft_steps`), the last carries it (a piece that
        makes no text yet: a chunk of its own, with no content)."""
        self.held.extend(records or ())
        if self.shaped:
            out = [self.chunk(None, delta=delta) for delta in self.shaped.feed(piece)]
        else:
            out = [self.chunk(piece)] if piece or step is None else []
        if step is not None:
            out = out or [self.chunk(None, delta={})]
            out[-1]["draft_step"] = step
        return out

    def end(self, stats) -> list[dict]:
        """A choice's end: its held tool calls, its finish chunk, and the next choice's opening (the
        last choice's finish chunk carries the usage of all)."""
        self.reply.stats = stats
        deltas, called = self.shaped.end() if self.shaped else ([], False)
        out = [self.chunk(None, delta=delta) for delta in deltas]
        reason = "tool_calls" if called else finish(stats)
        if len(self.ends) < self.reply.n - 1:
            out.append(self.chunk(None, reason))
            self.ends.append(stats)
            self.shaped = self.streamer()
            return out + self.opening()
        return out + [self.chunk(None, reason,
                                 usage([*self.ends, stats], self.reply.n_prompt, self.mode))]


async def chunks(reply: Reply, model_id: str, mode: str):
    """The reply's answer as the objects OpenAI streams (chat.completion.chunk or text_completion),
    each naming its choice's index, the last choice's finish chunk with the usage of all; or, where
    generation failed, an error object. Where log-probabilities are asked for, a chunk carries those
    of the tokens its text completes (those that only a tool call's text held back go with the next
    chunk out)."""
    stream = Chunks(reply, model_id, mode)
    try:
        for obj in stream.opening():
            yield obj
        async for piece, end, *step in reply.pieces:
            if piece is not None:
                out = stream.piece(piece, end, *step)
            elif isinstance(end, Exception):
                out = [ApiError(500, f"generation failed: {end}", "server_error").body()]
            else:
                out = stream.end(end)
            for obj in out:
                yield obj
    finally:
        # a stream closed early (the client went away) stops the generation
        await reply.pieces.aclose()
