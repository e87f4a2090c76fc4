"""Log-probabilities in `spectool serve`: what a request asks for (chat's `logprobs` and
`top_logprobs`, completions' `logprobs: N`), which tokens go with each piece of text the server
sends, and OpenAI's shapes of them.

The numbers are the core's (speculative.Step.logprobs): the target's raw distribution, the
log-softmax of its logits at each emitted token, read from the verification's own rows, accepted
drafts included. A piece of text carries the tokens whose text it completes: a token whose bytes end
inside a held-back character or a held-back prefix of a stop string goes with the piece that
releases it, and tokens that only made a stop string (cut from the text) are not reported, as
llama-server drops them.
"""

from __future__ import annotations

import codecs
import json
from typing import TYPE_CHECKING, Any

from spectool.server.errors import invalid

if TYPE_CHECKING:
    from spectool.generate.loop import Step
    from spectool.llama.engine import Model

# chat's top_logprobs: OpenAI's bound (llama-server's default when logprobs is true)
TOP_LOGPROBS_MAX = 20
# completions' logprobs: OpenAI's bound (each alternative is a record in every token's answer:
# 100000 of them made a 98 MB answer of 64 tokens)
COMPLETION_LOGPROBS_MAX = 5


def requested(body: dict, chat: bool) -> int | None:
    """How many alternatives a request asks for with each token's log-probability, None when it asks
    for none: chat's `logprobs: true` with `top_logprobs` 0..20 (0 when left out; without `logprobs:
    true`, a 400, as OpenAI and llama-server answer), completions' `logprobs: N`, N 0..5 as at
    OpenAI. Anything else a 400 naming the field."""
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if not chat:
        if top is not None:
            raise invalid("top_logprobs",
                          "is a chat completions field; a completion asks with 'logprobs': N")
        return None if logprobs is None else count("logprobs", logprobs, COMPLETION_LOGPROBS_MAX)
    if logprobs is not None and not isinstance(logprobs, bool):
        raise invalid("logprobs",
                      f"must be true or false (it was sent as {json.dumps(logprobs)[:60]})")
    if top is not None:
        count("top_logprobs", top, TOP_LOGPROBS_MAX)
        if not logprobs:
            raise invalid("top_logprobs", "needs 'logprobs': true")
    return (top or 0) if logprobs else None


def count(name: str, value: Any, most: int) -> int:
    """A field's count of alternatives, 0 to `most`, else a 400 naming it."""
    if not _integer(value) or not 0 <= value <= most:
        raise invalid(name, f"must be an integer from 0 to {most} (it was sent as "
                            f"{json.dumps(value)[:60]})")
    return value


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Tracker:
    """Which tokens go with each piece of text of one generation (see the module's comment). A
    token's place is where the text decoded so far ends after it, in characters; the text a piece
    releases is a prefix of that decoded text (speculative.TextStream holds back, never changes), so
    a token goes out once its end is out."""

    def __init__(self, model: Model):
        self.piece = model.piece
        # the TextStream's decoding
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.decoded = 0  # characters decoded from the tokens so far
        self.sent = 0  # characters sent
        # tokens not sent yet, each with its "start" and "end" in characters
        self.waiting: list[dict] = []
        self.open: list[dict] = []  # of them, those whose last bytes are not a whole character yet

    def feed(self, text: str, step: Step) -> list[dict]:
        """The records of the tokens that go with `text`, the text released at `step`: {id, token,
        bytes, logprob, top: [(id, logprob)], start}; at the last step, those that made any of the
        text sent."""
        for token, lp in zip(step.tokens, step.logprobs or ()):
            piece = self.piece(token)
            record = {"id": token, "logprob": lp.logprob, "top": lp.top, "start": self.decoded,
                      "end": None}
            self.decoded += len(self.decoder.decode(piece))
            self.open.append(record)
            if not self.decoder.getstate()[0]:  # no bytes held: every open token's text is whole
                self.close()
            self.waiting.append(record)
        self.sent += len(text)
        if step.finish_reason is not None:
            self.decoded += len(self.decoder.decode(b"", final=True))
            self.close()
            out = [r for r in self.waiting if r["start"] < self.sent or r["end"] <= self.sent]
            self.waiting = []
            return out
        n = 0
        while (
            n < len(self.waiting)
            and self.waiting[n]["end"] is not None
            and self.waiting[n]["end"] <= self.sent
        ):
            n += 1
        out, self.waiting = self.waiting[:n], self.waiting[n:]
        return out

    def close(self) -> None:
        for record in self.open:
            record["end"] = self.decoded
        self.open = []


def _text(piece: bytes) -> str:
    """A token's text as llama-server gives it: its bytes decoded, an unfinished character at its
    end left out."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(piece)


def chat(records: list[dict], model: Model) -> dict:
    """OpenAI's chat `logprobs`: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob,
    bytes}]}], refusal}, each entry with llama-server's `id` too."""
    def entry(token: int, logprob: float) -> dict:
        piece = model.piece(token)
        return {"id": token, "token": _text(piece), "logprob": logprob, "bytes": list(piece)}

    content = [entry(r["id"], r["logprob"]) | {"top_logprobs": [entry(t, lp) for t, lp in r["top"]]}
               for r in records]
    return {"content": content, "refusal": None}


def completion(records: list[dict], model: Model) -> dict:
    """OpenAI's legacy completions `logprobs`: {tokens, token_logprobs, top_logprobs: [{token:
    logprob}], text_offset}; each dict holds the N best and the chosen token (up to N + 1, as
    OpenAI's), and text_offset counts characters of the completion's text (not of the prompt: no
    `echo`)."""
    def text(token: int) -> str:
        return _text(model.piece(token))

    return {"tokens": [text(r["id"]) for r in records],
            "token_logprobs": [r["logprob"] for r in records],
            "top_logprobs": [{text(t): lp for t, lp in r["top"]} | {text(r["id"]): r["logprob"]}
                             for r in records],
            "text_offset": [r["start"] for r in records]}
