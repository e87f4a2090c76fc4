"""Fill-in-the-middle for `spectool serve`: llama-server's `/infill` (`input_prefix`,
`input_suffix`, `input_extra`, `prompt`, `n_predict`) and OpenAI's `suffix` on /v1/completions, for
models whose vocabulary has FIM tokens; the prompt built as llama-server's format_prompt_infill
builds it, and /infill's answer in its shape.

The prompt holds the prefix, the suffix and the extra files, so prompt lookup drafts from all of
them: code completion mostly echoes the file around the cursor.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from spectool.server.errors import ApiError, invalid

if TYPE_CHECKING:
    from spectool.llama.engine import Model

# llama-server's, between extra chunks where the vocabulary has no FIM_SEP
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"
FIM_BATCH = 2048  # llama-server's default --batch-size, which its FIM prompt is cut to fit


def fim_tokens(target: Model, field: str) -> dict[str, int]:
    """The target's FIM tokens; a 400 naming `field` (the one that asked for FIM) when it lacks
    FIM_PRE, FIM_SUF or FIM_MID, as llama-server refuses (it says 501; every bad request here is a
    400)."""
    fim = target.fim_tokens()
    missing = [name for name in ("pre", "suf", "mid") if name not in fim]
    if missing:
        raise ApiError(400, "fill-in-the-middle is not supported by this model: its vocabulary "
                            f"has no {', '.join('FIM_' + m.upper() for m in missing)} "
                            "token", code="fim_not_supported",
                       param=field)
    return fim


def fim_prompt(target: Model, fim: dict[str, int], prefix: str, suffix: str, extra: list[dict],
               middle: str,
               n_predict: int) -> list[int]:
    """llama-server's repo-level FIM prompt (format_prompt_infill): [FIM_REP]myproject, then each
    extra chunk as [FIM_SEP]filename and its text (or a snippet separator without FIM_SEP),
    [FIM_SEP]filename, then [BOS][FIM_PRE]prefix middle[FIM_SUF]suffix[FIM_MID]. Truncated as there:
    the prefix keeps its last 3/4 of a batch (llama-server's 2048 tokens, or half the context if
    less), the suffix its first 1/4 (less the middle), the extra chunks their end, within what the
    context leaves after a batch and twice the answer's budget."""
    def tok(text: str, special: bool = False) -> list[int]:
        return target.tokenize(text, add_special=False, parse_special=special)

    extra_tokens = [fim["rep"], *tok("myproject\n")] if "rep" in fim else []
    for chunk in extra:
        if "sep" in fim:
            extra_tokens += [fim["sep"], *tok(chunk.get("filename", "tmp") + "\n")]
        else:
            extra_tokens += tok(CHUNK_SEPARATOR)
        extra_tokens += tok(chunk["text"])
    if "sep" in fim:
        extra_tokens += [fim["sep"], *tok("filename\n")]
    pre, suf, mid = tok(prefix), tok(suffix), tok(middle, special=True)
    n_ctx = target.n_ctx
    # (half: a prompt cut to a whole small context would leave no room)
    n_batch = min(FIM_BATCH, n_ctx // 2)
    pre = pre[len(pre) - min(len(pre), 3 * (n_batch // 4)):]
    suf = suf[:min(len(suf), max(0, n_batch // 4 - (2 + len(mid))))]
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    return (extra_tokens[len(extra_tokens) - n_extra:] + target.added_bos()
            + [fim["pre"], *pre, *mid, fim["suf"], *suf, fim["mid"]])


def text_field(body: dict, name: str, required: bool) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise invalid(name, "must be a string" + (" (it is required)" if value is None else ""))
    return value


def extra_chunks(body: dict) -> list[dict]:
    """`input_extra`: a list of {"text": string, "filename": string (optional)}, as llama-server
    checks it."""
    extra = body.get("input_extra")
    if extra is None:
        return []
    if not isinstance(extra, list) or not all(
            isinstance(c, dict) and isinstance(c.get("text"), str)
            and isinstance(c.get("filename", ""), str)
            for c in extra):
        raise invalid("input_extra", 'must be a list of {"filename": string, "text": string}')
    return extra


def infill_prompt(body: dict, target: Model, n_predict: int) -> list[int]:
    """The tokens of an /infill request (its fields checked, each by name)."""
    prefix, suffix = text_field(body, "input_prefix", True), text_field(body, "input_suffix", True)
    middle, extra = text_field(body, "prompt", False), extra_chunks(body)
    return fim_prompt(target, fim_tokens(target, "input_suffix"), prefix, suffix, extra, middle,
                      n_predict)


def suffix_prompt(body: dict, target: Model, n_predict: int) -> list[int]:
    """The FIM tokens of a completion with OpenAI's `suffix` (the prompt is the prefix)."""
    suffix = body.get("suffix")
    if not isinstance(suffix, str):
        raise invalid("suffix", "must be a string")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid("prompt", "must be a string with 'suffix'")
    return fim_prompt(target, fim_tokens(target, "suffix"), prompt, suffix, [], "", n_predict)


def n_predict(body: dict) -> tuple[dict, bool]:
    """(the body with llama-server's `n_predict`, before `max_tokens`, as this server's
    `max_tokens`, and whether it asks for no tokens at all): -1 (no limit there) is the server's
    default here, and 0 asks for the prompt only (editors send it to warm the cache)."""
    name = "n_predict" if body.get("n_predict") is not None else "max_tokens"
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, type(None))) or (value or 0) < -1:
        raise invalid(name, "must be an integer, -1 (the server's default) or more")
    if value in (None, -1, 0):
        return {k: v for k, v in body.items() if k not in ("n_predict", "max_tokens")}, value == 0
    return {**body, "max_tokens": value}, False


# -- /infill's answer, in llama-server's shape
# ----------------------------------------------------------------------
def timings(stats) -> dict:
    """llama-server's `timings`, with its draft counters."""
    # kept in the KV cache from the last request
    cached = max(0, stats.n_prompt_tokens - 1 - stats.n_prefilled)
    n_pre, n_gen = stats.n_prompt_tokens - cached, stats.n_generated
    p_ms, g_ms = stats.prompt_seconds * 1e3, stats.decode_seconds * 1e3
    return {"cache_n": cached, "prompt_n": n_pre, "prompt_ms": p_ms,
            "prompt_per_token_ms": p_ms / n_pre if n_pre else 0.0,
            "prompt_per_second": 1e3 * n_pre / p_ms if p_ms else 0.0, "predicted_n": n_gen,
            "predicted_ms": g_ms,
            "predicted_per_token_ms": g_ms / n_gen if n_gen else 0.0,
            "predicted_per_second": 1e3 * n_gen / g_ms if g_ms else 0.0, "draft_n": stats.n_drafted,
            "draft_n_accepted": stats.n_accepted}


def final(text: str, stats, n_prompt: int, model_id: str, fields: list | None,
          stream: bool) -> dict:
    """The last (or only) object of an /infill answer; `response_fields` picks nested fields as
    llama-server."""
    stop_type = {"length": "limit", "context": "limit", "stop": "eos"}.get(stats.finish_reason
                                                                           or "", "none")
    res = {"index": 0, "content": "" if stream else text, "tokens": [], "id_slot": 0, "stop": True,
           "model": model_id, "tokens_predicted": stats.n_generated, "tokens_evaluated": n_prompt,
           "has_new_line": "\n" in text, "truncated": False, "stop_type": stop_type,
           "stopping_word": "",
           "tokens_cached": n_prompt + stats.n_generated, "timings": timings(stats)}
    if not fields:
        return res
    picked = {}
    for path in (f for f in fields if isinstance(f, str)):
        value: Any = res
        found = True
        for key in path.split("/"):
            found = found and isinstance(value, dict) and key in value
            value = value[key] if found else None
        if found:
            picked[path] = value
    return picked


def partial(text: str) -> str:
    """One streamed piece of an /infill answer, as llama-server sends it (an SSE `data:` line; the
    counters come in the final object)."""
    return "data: " + json.dumps({"index": 0, "content": text, "tokens": [], "stop": False,
                                  "id_slot": 0}) + "\n\n"


def response_fields(body: dict) -> list | None:
    """The answer's fields an /infill request keeps (`response_fields`), None for all."""
    fields = body.get("response_fields")
    return fields if isinstance(fields, list) else None


class Limits:
    """The limits editors send to /infill (llama.vim, llama.vscode), as llama-server applies them
    (server-context.cpp, process_token): with `n_indent` > 0 every line after the first must start
    with at least that many spaces or tabs, and the first that does not ends the answer before its
    first other character (its indentation kept; an empty line ends it too, as there); with
    `t_max_predict_ms` > 0 the answer ends after the first newline written once that many
    milliseconds of generation have passed. Either ends it as the token budget does (stop_type
    "limit"). `cut` is fed each piece of text in turn."""

    def __init__(self, n_indent: int = 0, t_max_predict_ms: float = 0):
        self.n_indent = n_indent
        self.t_max = t_max_predict_ms / 1e3 if t_max_predict_ms > 0 else None
        self.reached = False
        # how far the line begun by the last newline is indented, until it shows
        self._line: int | None = None
        self._t0: float | None = None  # when the first piece came

    @property
    def any(self) -> bool:
        return self.n_indent > 0 or self.t_max is not None

    def cut(self, text: str) -> str:
        """What of the next piece goes out: all of it, or its part before the limit (`reached` from
        then on)."""
        if self.reached:
            return ""
        now = time.perf_counter()
        self._t0 = now if self._t0 is None else self._t0
        for i, c in enumerate(text):
            if self.n_indent > 0 and self._line is not None:
                if c in " \t":
                    self._line += 1
                    continue
                short, self._line = self._line < self.n_indent, None
                if short:
                    self.reached = True
                    return text[:i]
            if c == "\n":
                if self.t_max is not None and now - self._t0 > self.t_max:
                    self.reached = True
                    return text[: i + 1]
                self._line = 0
        return text


def infill_limits(body: dict) -> Limits | None:
    """An /infill request's `n_indent` (an integer from 0) and `t_max_predict_ms` (an integer from
    -1; 0 or less: none), within llama-server's bounds (server-schema.cpp), else a 400 naming the
    field; None where neither limits anything."""
    values = {}
    for name, low, high in (("n_indent", 0, 2**31 - 1), ("t_max_predict_ms", -1, 2**63 - 1)):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not low <= value <= high):
            raise invalid(name, f"must be an integer from {low} to {high} (it was sent as "
                                f"{json.dumps(value)[:60]})")
        values[name] = value or 0
    found = Limits(**values)
    return found if found.any else None


async def events(pieces, n_prompt: int, model_id: str, fields: list | None):
    """An /infill answer streamed as llama-server streams it: a `data:` object per piece, then the
    final object (`stop`: true, the counters and timings), no [DONE]."""
    text = []
    try:
        async for piece, end in pieces:
            if piece is not None:
                text.append(piece)
                yield partial(piece)
            elif isinstance(end, Exception):
                failed = ApiError(500, f"generation failed: {end}", "server_error")
                yield f"data: {json.dumps(failed.body())}\n\n"
            else:
                yield "data: " + json.dumps(final("".join(text), end, n_prompt, model_id, fields,
                                                  True)) + "\n\n"
    finally:
        await pieces.aclose()  # a stream closed early (the client went away) stops the generation


async def respond(pieces, stream: bool, n_prompt: int, model_id: str, fields: list | None):
    """The answer to an /infill request from its worker's `pieces` (serve.Server._pieces): streamed
    (events) or one JSON object (final)."""
    from starlette.responses import JSONResponse, StreamingResponse

    if stream:
        return StreamingResponse(events(pieces, n_prompt, model_id, fields),
                                 media_type="text/event-stream")
    text, end = [], None
    async for piece, end in pieces:
        if piece is not None:
            text.append(piece)
    if isinstance(end, Exception):
        raise ApiError(500, f"generation failed: {end}", "server_error")
    return JSONResponse(final("".join(text), end, n_prompt, model_id, fields, False))
