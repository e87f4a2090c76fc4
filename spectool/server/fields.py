"""Each API's request fields, declared once: those SERVED; those IGNORED because they ask nothing
of the output (client metadata, cache and context-management hints, store flags, service tiers:
what agents send by default), each counted in /metrics; and those REFUSED, a 400 naming the field,
because they would change the output and are not done here (a refused field passes with a value
that asks nothing, `fine`, and is counted as ignored then).

On chat completions and completions a field not declared is ignored and counted, as llama-server
ignores it; on the Responses and Messages APIs it is a 400, as at OpenAI and Anthropic. The tables
of docs/serve.md are this declaration's (`table`; tests/test_fields.py checks them)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from spectool.options import Options
from spectool.server.errors import ApiError

SERVED, IGNORED, REFUSED = "served", "ignored", "400"
APIS = ("chat", "completions", "responses", "messages")
STRICT = {"responses", "messages"}  # where a field not declared is a 400


@dataclass(frozen=True)
class Field:
    """One row of an API's table: its fields, what is done with them, and (REFUSED) the values that
    ask nothing: a tuple of values (by value and type: 0 is not False), or a test of the value."""

    names: tuple[str, ...]
    policy: str
    doc: str
    fine: tuple | Callable[[Any], bool] = (None,)
    only: str | None = None  # OpenAI's table: the one API (chat or completions) the row is for

    def asks_nothing(self, value) -> bool:
        if callable(self.fine):
            return value is None or self.fine(value)
        return asks_nothing(value, self.fine)


def asks_nothing(value, fine: tuple) -> bool:
    """Whether a field's value is one of those that ask nothing of the server (by value and type: 0
    is not False)."""
    return any(value == ok and type(value) is type(ok) for ok in fine)


# llama.cpp's sampler chain as spectool runs it (core/verify.py), by llama-server's names
CHAIN = ("penalties", "top_k", "top_p", "min_p", "temperature")
# the samplers that do nothing at their neutral values, which the refused fields below enforce
NEUTRAL = {"dry", "typ_p", "typical_p", "xtc", "top_n_sigma"}


def same_chain(value) -> bool:
    """Whether llama-server's `samplers` asks for spectool's chain: its other samplers neutral, the
    rest in the chain's order."""
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        return False
    names = ["temperature" if s == "temp" else s for s in value if s not in NEUTRAL]
    return all(s in CHAIN for s in names) and names == sorted(names, key=CHAIN.index)


def clears_only_thinking(value) -> bool:
    """Whether Anthropic's `context_management` asks only to clear thinking blocks (none is kept
    here, so nothing is cleared); clearing tool results would change the prompt."""
    if not isinstance(value, dict) or set(value) - {"edits"}:
        return False
    edits = value.get("edits")
    return isinstance(edits, list) and all(
        isinstance(e, dict) and str(e.get("type", "")).startswith("clear_thinking_")
        for e in edits)


def passed(*served: str) -> tuple[str, ...]:
    """The fields of options.py that the chat path takes (`seed`, `min_p`, ...), less `served`."""
    names = {d.request for d, _, _ in Options.declared().values() if d.request}
    return tuple(sorted(names - {"max_tokens", *served}))


NO_OUTPUT = "asks nothing of the output"
MODEL = Field(("model",), IGNORED, "any name gets the served model")
OPENAI = [
    Field(("messages",), SERVED, "any role the template takes; content a string or text parts, "
          "joined with newlines (an image or audio part is a 400)", only="chat"),
    Field(("prompt",), SERVED, "a string, or a list of one string (token ids or several strings "
          "are a 400)", only="completions"),
    Field(("max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
           "presence_penalty", "frequency_penalty", "top_k", "min_p", "repeat_penalty",
           "repeat_last_n"), SERVED, "within the command line's bounds"),
    Field(("stream", "stream_options"), SERVED, "server-sent events; the last chunk carries "
          "`usage`"),
    Field(("n",), SERVED, "1 to 8 choices, one after another"),
    Field(("response_format", "json_schema", "grammar"), SERVED,
          "[structured output](#structured-output)"),
    Field(("tools", "tool_choice", "parallel_tool_calls"), SERVED, "[tool calls](#tool-calls)",
          only="chat"),
    Field(("logprobs", "top_logprobs"), SERVED, "[log-probabilities](#log-probabilities)"),
    Field(("suffix",), SERVED, "[fill-in-the-middle](#fill-in-the-middle)", only="completions"),
    Field(("prediction",), SERVED, "OpenAI's Predicted Outputs: the first draft source"),
    Field(("speculative", "speculative.n_max"), SERVED, "the request's own drafting: `false` "
          "(none), or `{\"n_max\": K}` (llama-server's older flat `speculative.n_max`): at most K "
          "drafts a step, capped at `--draft-max`; the output is the same "
          "([parallel requests](#parallel-requests))"),
    Field(("draft_steps",), SERVED, "spectool's: `true`, with `stream`, and each chunk's "
          "`draft_step` says where its text came from ([the chat page](#the-chat-page))"),
    MODEL,
    Field(("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
           "prompt_cache_retention"), IGNORED, f"client metadata and storage: {NO_OUTPUT}"),
    Field(("reasoning_effort", "verbosity"), IGNORED, "hints to OpenAI's reasoning models; "
          "nothing here reads them"),
    Field(("cache_prompt", "id_slot"), IGNORED, "llama-server's: the KV cache keeps the longest "
          "common prefix anyway; a request takes the free slot holding its longest prefix"),
    Field(("dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
           "xtc_threshold", "mirostat_tau", "mirostat_eta", "dynatemp_exponent", "min_keep"),
          IGNORED, "llama-server's settings of samplers that are off (below)"),
    Field(("speculative.n_min", "speculative.p_min"), IGNORED, "llama-server's drafting settings "
          "(in `speculative` too): the controller picks each draft's length, and no draft "
          "changes the output"),
    Field(("best_of",), REFUSED, "above 1", (None, 1)),
    Field(("echo",), REFUSED, "true", (None, False), only="completions"),
    Field(("logit_bias",), REFUSED, "any bias", (None, {})),
    Field(("functions", "function_call"), REFUSED, "use `tools`", (None, [], "none", "auto")),
    Field(("audio", "modalities"), REFUSED, "anything but text", (None, ["text"])),
    Field(("tools", "tool_choice"), REFUSED, "tools are chat's", (None, [], "none", "auto"),
          only="completions"),
    Field(("suffix",), REFUSED, "fill-in-the-middle is `/v1/completions`'", (None, ""),
          only="chat"),
    Field(("mirostat", "n_probs"), REFUSED, "above 0", (None, 0)),
    Field(("typical_p",), REFUSED, "below 1", (None, 1, 1.0)),
    Field(("dry_multiplier", "xtc_probability", "dynatemp_range"), REFUSED, "above 0",
          (None, 0, 0.0)),
    Field(("top_n_sigma",), REFUSED, "0 or above", (None, -1, -1.0)),
    Field(("ignore_eos",), REFUSED, "true", (None, False)),
    Field(("samplers",), REFUSED, "an order other than the chain's (penalties, top_k, top_p, "
          "min_p, temperature; the samplers that are off may stand anywhere)", same_chain),
]
RESPONSES = [
    Field(("input",), SERVED, "a string, or message, `function_call` and `function_call_output` "
          "items: the chat messages, tool calls and results"),
    Field(("instructions",), SERVED, "a system message first"),
    Field(("max_output_tokens",), SERVED, "as chat's `max_tokens`; without it, the rest of the "
          "context"),
    Field(("temperature", "top_p", "parallel_tool_calls", *passed("temperature", "top_p")),
          SERVED, "as on chat"),
    Field(("tools", "tool_choice"), SERVED, "function tools, and `namespace` tools' functions; a "
          "call comes back as a `function_call` item (with its `namespace`); `web_search` tools "
          "are ignored (counted as `tools.web_search`), other built-in tools are a 400"),
    Field(("text",), SERVED, "`format` (`text`, `json_object`, `json_schema`) as "
          "`response_format`; `verbosity` ignored"),
    Field(("stream",), SERVED, "the Responses events, `response.created` to "
          "`response.completed`"),
    Field(("include", "top_logprobs"), SERVED, "`message.output_text.logprobs`: "
          "[log-probabilities](#log-probabilities); the other values name items this server "
          "never makes"),
    MODEL,
    Field(("metadata", "client_metadata", "user", "safety_identifier", "prompt_cache_key",
           "prompt_cache_retention", "service_tier", "stream_options"), IGNORED,
          f"client metadata: {NO_OUTPUT}"),
    Field(("store",), IGNORED, "nothing is stored (a response says `store: false`)"),
    Field(("reasoning",), IGNORED, "no reasoning is done: the chat path renders and returns none "
          "(Codex sends it)"),
    Field(("previous_response_id", "conversation", "prompt"), REFUSED, "they need stored "
          "responses", (None, "")),
    Field(("background",), REFUSED, "true", (None, False)),
    Field(("truncation",), REFUSED, "other than `disabled`", (None, "disabled")),
    Field(("max_tool_calls",), REFUSED, "any", (None,)),
]
MESSAGES = [
    Field(("messages",), SERVED, "`user` and `assistant` turns (`text`, `tool_use`, "
          "`tool_result` blocks); a `system` turn joins the system prompt; a last assistant turn "
          "(a prefill), images and documents are a 400"),
    Field(("system",), SERVED, "a string or text blocks: a system message first"),
    Field(("max_tokens",), SERVED, "required, as at Anthropic"),
    Field(("temperature", "top_p", "top_k", *passed("temperature", "top_p", "top_k")), SERVED,
          "as on chat"),
    Field(("stop_sequences",), SERVED, "`stop`; `stop_reason` `\"stop_sequence\"` and the "
          "`stop_sequence` that ended it"),
    Field(("tools", "tool_choice"), SERVED, "client tools (`name`, `description`, "
          "`input_schema`) and `auto`, `any`, `tool`, `none`, `disable_parallel_tool_use`; a call "
          "comes back as a `tool_use` block; server tools are a 400"),
    Field(("output_config",), SERVED, "`format` (`json_schema`) as `response_format`; `effort` "
          "ignored (counted as `output_config.effort`)"),
    Field(("stream",), SERVED, "Anthropic's events, `message_start` to `message_stop`, with "
          "`ping`s"),
    MODEL,
    Field(("metadata", "service_tier", "inference_geo", "speed", "diagnostics"), IGNORED,
          f"client metadata: {NO_OUTPUT}"),
    Field(("cache_control",), IGNORED, "here and on any block or tool (counted once): prompt "
          "caching marks; the KV cache keeps the longest common prefix anyway"),
    Field(("thinking",), IGNORED, "no thinking is done: the chat path renders and returns none "
          "(Claude Code sends it)"),
    Field(("context_management",), REFUSED, "edits other than `clear_thinking_*` (none is kept "
          "here, so those ask nothing: Claude Code sends one)", clears_only_thinking),
    Field(("container", "mcp_servers"), REFUSED, "server-side tools", (None, [])),
]
# values inside a served field that are ignored, counted by path: (field, key)
SPECULATIVE = [("speculative", "n_min"), ("speculative", "p_min")]
NESTED = {"responses": [("text", "verbosity")], "messages": [("output_config", "effort")],
          "chat": SPECULATIVE, "completions": SPECULATIVE}


def rows(api: str) -> list[Field]:
    if api in ("chat", "completions"):
        return [f for f in OPENAI if f.only in (None, api)]
    return {"responses": RESPONSES, "messages": MESSAGES}[api]


def declared(api: str) -> dict[str, Field]:
    return {name: f for f in rows(api) for name in f.names}


def check(api: str, body: dict) -> list[str]:
    """The fields of a request body that ask nothing of the output (to count), after a 400 for the
    first refused field whose value asks something, or (Responses, Messages) a field not
    declared."""
    known, ignored = declared(api), []
    for name, value in body.items():
        f = known.get(name)
        if f is None and api in STRICT:
            raise ApiError(400, f"'{name}' is not a field this server knows",
                           code="unsupported_field", param=name)
        if f is not None and f.policy == REFUSED and not f.asks_nothing(value):
            raise ApiError(400, f"'{name}' is not supported by this server (it was sent as "
                                f"{json.dumps(value)[:60]}); leave it out",
                           code="unsupported_field", param=name)
        if f is None or f.policy != SERVED and value is not None:
            ignored.append(name)
    for name, key in NESTED.get(api, ()):
        if isinstance(body.get(name), dict) and body[name].get(key) is not None:
            ignored.append(f"{name}.{key}")
    if api == "messages" and "cache_control" not in body and marked(body, "cache_control"):
        ignored.append("cache_control")
    if api == "responses" and isinstance(body.get("tools"), list):
        ignored += [f"tools.{t['type']}" for t in body["tools"] if built_in_ignored(t)]
    return ignored


def label(api: str, name: str) -> str:
    """The name /metrics counts an ignored field by: one this declaration names (a dated built-in
    tool by its undated name), else `other`, as a field a client names at will may hold anything
    (a user's data)."""
    tool = re.sub(r"_20\d\d_\d\d_\d\d$", "", name)
    named = {f"{a}.{b}" for a, b in NESTED.get(api, ())} | {f"tools.{t}" for t in IGNORED_TOOLS}
    return tool if name in declared(api) or tool in named else "other"


# Responses' built-in tools that run at OpenAI's side and that agents send by default (Codex:
# `web_search`): without them the model answers from what it knows, as llama-server does (it skips
# every non-function tool); the others (file search, code interpreter, MCP, shell, ...) are a 400
IGNORED_TOOLS = ("web_search", "web_search_preview")


def built_in_ignored(tool) -> bool:
    """Whether a Responses tool is a built-in one that is ignored (IGNORED_TOOLS, dated versions
    too: web_search_2025_08_26)."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    return isinstance(kind, str) and any(kind == t or kind.startswith(t + "_20")
                                         for t in IGNORED_TOOLS)


def marked(value, key: str) -> bool:
    """Whether `key` is a key of any object inside a JSON value."""
    if isinstance(value, dict):
        return key in value or any(marked(v, key) for v in value.values())
    return isinstance(value, list) and any(marked(v, key) for v in value)


def table(api: str) -> str:
    """docs/serve.md's table of an API's fields (chat and completions share one)."""
    apis = ("chat", "completions") if api in ("chat", "completions") else (api,)
    title = {"chat": "chat / completions", "responses": "Responses",
             "messages": "Messages"}[apis[0]]
    lines = [f"| {title} field | policy | what spectool does |", "|---|---|---|"]
    for f in (OPENAI if len(apis) == 2 else rows(api)):
        names = ", ".join(f"`{n}`" for n in f.names)
        where = f" ({f.only})" if f.only else ""
        lines.append(f"| {names}{where} | {f.policy} | {f.doc} |")
    return "\n".join(lines)
