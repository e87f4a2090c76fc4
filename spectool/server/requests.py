"""What `spectool serve` reads from a request body: its JSON checked field by field, its prompt as
tokens, and the GenerationConfig it asks for (its fields over the server's options), or an ApiError
that names what was wrong.

Which fields are served, ignored or refused is fields.py's declaration; the numeric fields are
checked by their declarations in options.py, as the command line's are. What the output must be
comes from OpenAI's `response_format` or llama-server's `json_schema` and `grammar` fields
(request_grammar), at most one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from spectool.options import Options, UserError, in_request, request_options
from spectool.server.errors import ApiError, Overflow, invalid
from spectool.server.fields import check
from spectool.server.logprobs import requested as requested_logprobs
from spectool.session import Session, generation, prediction_tokens

if TYPE_CHECKING:
    from spectool.core.grammar import Grammar
    from spectool.generate.loop import GenerationConfig
    from spectool.llama.engine import Model
    from spectool.server.infill import Limits
    from spectool.server.tools import Tools

def stream_and_stop(body: dict) -> tuple[bool, list[str]]:
    """The request's `stream` (true or false) and `stop` (a string or a list of strings) by their
    types, else a 400 naming the field; the numeric fields are checked by their declarations
    (options.request_options)."""
    stream, stop = boolean(body, "stream"), body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid("stop", "must be a string or a list of strings")
    return stream, [s for s in stop if s]


def boolean(body: dict, name: str) -> bool:
    """A field that is true or false (absent: false), else a 400 naming it."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise invalid(name, f"must be true or false (it was sent as {json.dumps(value)[:60]})")
    return bool(value)


N_MAX = 8  # `n`: the most choices a request may ask for, generated one after another


def choices(body: dict, infill: bool) -> int:
    """The request's `n`: 1 to N_MAX choices (/infill: 1, as llama-server's has no `n`), else a 400
    naming it."""
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= (1 if infill else N_MAX):
        raise invalid("n", f"must be an integer from 1 to {1 if infill else N_MAX} (it was sent as "
                           f"{json.dumps(n)[:60]})")
    return n


def load(raw: bytes) -> dict:
    """A request body's JSON object, else a 400: not JSON, not an object, nested deeper than
    grammar.DEPTH_MAX levels (the parser's RecursionError too), or holding a string that is no text
    (a lone surrogate, "\\ud800"); a field at fault is named."""
    from spectool.core.grammar import DEPTH_MAX, deeper

    # (Python reads NaN and Infinity too: the field that holds one is named by request_options)
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, f"the request body is nested deeper than {DEPTH_MAX} levels",
                       code="invalid_json") from None
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    for name, value in body.items():
        field = name.encode("utf-8", "backslashreplace").decode()  # (a name may be no text)
        if deeper(value, DEPTH_MAX - 1):
            raise ApiError(400, f"'{field}' is nested deeper than a request body's {DEPTH_MAX} "
                                "levels", code="invalid_json", param=field)
        if not utf8({name: value}):
            raise ApiError(400, f"'{field}' holds a lone surrogate (an escape such as \\ud800 "
                                "that is no character): send text", code="invalid_json",
                           param=field)
    return body


def utf8(value) -> bool:
    """Whether every string in a JSON value is text that UTF-8 can spell."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class Request:
    """What a request asks for, as `parse` reads it."""

    gens: list[GenerationConfig]  # a GenerationConfig for each of its `n` choices
    tokens: list[int]  # the prompt
    stop: list[str]  # stop strings
    stream: bool
    tools: Tools | None  # the tools it offers (chat)
    fields: list | None = None  # /infill: the answer's fields it keeps (None: all)
    limits: Limits | None = None  # /infill: the editors' limits on the answer
    ignored: list[str] = field(default_factory=list)  # the fields that asked nothing (fields.py)
    steps: bool = False  # each streamed chunk says what drafted its text (`draft_steps`)


def parse(raw: bytes | dict, chat: bool, session: Session, options: Options,
          infill: bool = False) -> Request:
    """The Request in a body (or the body already read, as another API's translation hands it over):
    a chat completion's messages, a completion's prompt (with `suffix`: fill-in-the-middle) or an
    /infill request's fields (infill.py), the request's fields over the server's `options`. Choice i
    of a seeded request has seed + i."""
    body = raw if isinstance(raw, dict) else load(raw)
    # (/infill's own fields are infill.py's, and it ignores llama-server's `samplers`)
    ignored = check("chat" if chat else "completions",
                    {k: v for k, v in body.items() if k != "samplers"} if infill else body)
    n = choices(body, infill)
    stream, more = stream_and_stop(body)
    target = session.gen.target
    tools = request_tools(body, target) if chat else None
    if chat and body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    # warm: an /infill with n_predict 0, the prompt into the cache only
    warm, fields, limits = False, None, None
    if infill:
        from spectool.server.infill import infill_limits, n_predict, response_fields

        body, warm = n_predict(body)
        fields, limits = response_fields(body), infill_limits(body)
    if chat:
        tokens, stop = chat_prompt(body, target, tools)
    else:
        tokens, stop = completion_prompt(body, target, infill, options)
    if len(tokens) >= target.n_ctx:
        raise Overflow(len(tokens), target.n_ctx, "messages" if chat else "prompt")
    grammar = request_grammar(body, target)
    if tools and tools.constrained and grammar is not None:
        if grammar.schema is None:
            raise invalid("tools", "cannot be given with a grammar unless tool_choice is \"none\"")
        tools.answer = grammar.schema  # under auto: an answer in the schema, or a call
    # the tools' grammar (a call), else the request's, else the server's default
    grammar = (tools and tools.constrained
               and tools_grammar(tools, target)) or grammar or session.gen.grammar
    gens = generations(body, chat, n, grammar, session, options, request_prediction(body))
    return Request([replace(g, max_tokens=0) for g in gens] if warm else gens, tokens, stop + more,
                   stream, tools, fields, limits, [] if infill else ignored,
                   stream and not infill and boolean(body, "draft_steps"))


def generations(body: dict, chat: bool, n: int, grammar: Grammar | None, session: Session,
                options: Options, prediction: str | None = None) -> list[GenerationConfig]:
    """The `n` choices' GenerationConfigs: the request's fields over the server's options, by their
    declarations (options.py), as `run` does, each drafting the `prediction` first where there is
    one; choice i of a seeded request has seed + i."""
    try:
        o = request_options(options, body)
    except UserError as e:
        if e.option is None:
            raise
        name, message = in_request(e)
        raise ApiError(400, message, code=f"invalid_{name}", param=name) from None
    seeds = [o.seed if o.seed is None else o.seed + i for i in range(n)]
    logprobs = requested_logprobs(body, chat)  # logprobs.py
    draft_max = request_draft_max(body, session.k_max)
    predicted = prediction_tokens(session.target, prediction)  # once for all the choices
    return [replace(generation(session.policy, session.target, replace(o, seed=seed), grammar,
                               predicted), logprobs=logprobs, draft_max=draft_max)
            for seed in seeds]


def request_draft_max(body: dict, k_max: int) -> int | None:
    """The request's own drafting: `"speculative": false` (none: 0), `true` (the server's: None)
    or {"n_max": K}, and llama-server's flat `speculative.n_max` (its older servers' name), K an
    integer from 0, at most the server's --draft-max (a request lowers it, never raises it); None
    where it sets none. Another shape is a 400 naming the field."""
    spec, flat = body.get("speculative"), body.get("speculative.n_max")
    if isinstance(spec, bool):
        if flat is not None:
            raise invalid("speculative.n_max", "cannot be given with \"speculative\": "
                                               f"{json.dumps(spec)}")
        return None if spec else 0
    if spec is not None and not isinstance(spec, dict):
        raise invalid("speculative", 'must be true, false or {"n_max": K} (it was sent as '
                                     f"{json.dumps(spec)[:60]})")
    spec = spec or {}
    other = sorted(set(spec) - {"n_max", "n_min", "p_min"})  # (n_min, p_min: ignored, fields.py)
    if other:
        raise invalid(f"speculative.{other[0]}", "is not a drafting setting this server takes "
                                                 "(n_max)")
    if spec.get("n_max") is not None and flat is not None:
        raise invalid("speculative.n_max", "was given twice: as speculative.n_max and in "
                                           "\"speculative\"")
    k = spec.get("n_max", flat)
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise invalid("speculative.n_max", "must be an integer from 0 (it was sent as "
                                           f"{json.dumps(k)[:60]})")
    return min(k, k_max)


def request_prediction(body: dict) -> str | None:
    """The text of OpenAI's `prediction` (Predicted Outputs): {"type": "content", "content": a
    string or a list of text parts, joined as they come}; None without one. Another shape is a 400
    naming the field at fault."""
    p = body.get("prediction")
    if p is None:
        return None
    if not isinstance(p, dict):
        raise invalid("prediction", 'must be {"type": "content", "content": ...} (it was sent as '
                                    f"{json.dumps(p)[:60]})")
    if p.get("type") != "content":
        raise invalid("prediction.type", 'must be "content" (it was sent as '
                                         f"{json.dumps(p.get('type'))[:60]})")
    c = p.get("content")
    if isinstance(c, list) and all(isinstance(part, dict) and part.get("type") == "text"
                                   and isinstance(part.get("text"), str) for part in c):
        return "".join(part["text"] for part in c)
    if not isinstance(c, str):
        raise invalid("prediction.content", "must be a string or a list of text parts "
                                            '({"type": "text", "text": ...})')
    return c


def request_tools(body: dict, target: Model) -> Tools | None:
    from spectool.server.tools import ToolError, read

    try:
        return read(body, target.chat_template())
    except ToolError as e:
        raise ApiError(400, str(e), code=f"invalid_{e.param}", param=e.param) from None


def tools_grammar(tools: Tools, target: Model) -> Grammar:
    from spectool.core.grammar import GrammarError

    try:
        grammar = tools.grammar(target)
        grammar.check(target)
        return grammar
    except GrammarError as e:
        raise invalid("tools", f"could not be made into a grammar of a call: {e}") from None


def request_grammar(body: dict, target: Model | None = None) -> Grammar | None:
    """The grammar a request asks for, None when it asks for none (then the server's default holds):
    `response_format` as OpenAI sends it (`text`; `json_object`, with a `schema` as llama-server
    allows; or `json_schema` with {name, schema, strict}; no schema: any JSON object),
    llama-server's `json_schema` (an object) or `grammar` (GBNF text; "" is none, as there). Two of
    them, a value of the wrong shape, or a grammar the library refuses, or that names a token the
    `target`'s vocabulary lacks (`<[99999]>`, `<|no_such|>`): a 400 naming the field."""
    asked: list[tuple[str, Any]] = []  # (field, how to make its Grammar)
    rf = body.get("response_format")
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            raise invalid("response_format", 'must be {"type": "text"}, {"type": '
                          '"json_object"} or {"type": "json_schema", "json_schema": {...}} '
                          f'(it was sent as {json.dumps(rf)[:60]})')
        schema = rf.get("schema") if kind == "json_object" else None
        if kind == "json_schema":
            spec = rf.get("json_schema")
            if not isinstance(spec, dict):
                raise invalid("response_format",
                              "needs a 'json_schema' object: {name, schema, strict}")
            if not isinstance(spec.get("strict", False), (bool, type(None))):
                raise invalid("response_format",
                              "has a json_schema whose 'strict' is not true or false")
            schema = spec.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise invalid("response_format", "has a 'schema' that is not a JSON object")
        if kind != "text":
            asked.append(("response_format", schema))
    if body.get("json_schema") is not None:
        if not isinstance(body["json_schema"], dict):
            raise invalid("json_schema", "must be a JSON schema object")
        asked.append(("json_schema", body["json_schema"]))
    if body.get("grammar") is not None and body["grammar"] != "":
        if not isinstance(body["grammar"], str):
            raise invalid("grammar", "must be a string of GBNF grammar")
        asked.append(("grammar", body["grammar"]))
    if len(asked) > 1:
        raise invalid(asked[1][0], f"cannot be given with '{asked[0][0]}': ask for one grammar or "
                                   "schema")
    return made(*asked[0], target) if asked else None


def made(name: str, value: Any, target: Model | None) -> Grammar:
    """The Grammar of a request's field `name` (GBNF text, a schema, None: any JSON object), checked
    against the `target`'s vocabulary; one the library refuses is a 400 naming the field."""
    from spectool.core.grammar import Grammar, GrammarError

    try:
        grammar = (Grammar.gbnf(value) if name == "grammar" else Grammar.json_object()
                   if value is None else Grammar.json_schema(value))
        if target is not None:
            grammar.check(target)
        return grammar
    except GrammarError as e:
        raise invalid(name, f"was refused: {e}") from None


def chat_prompt(body: dict, target: Model,
                tools: Tools | None = None) -> tuple[list[int], list[str]]:
    """A chat completion's `messages` (tool calls and results among them) rendered with the model's
    chat template and the request's `tools`, as tokens, and the stop strings the template's absence
    needs (chat.FALLBACK_STOP)."""
    from spectool.templates import FALLBACK_STOP, TemplateError, prompt_tokens
    from spectool.server.tools import ToolError, template_messages

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} "
                            "objects", code="invalid_messages")
    try:
        rendered = template_messages(messages, content, target.chat_template(), tools)
        tokens = prompt_tokens(target, rendered, tools.tools if tools and not tools.describe
                               else None)
    except (TemplateError, ToolError) as e:
        raise ApiError(400, str(e), code="invalid_messages", param="messages") from None
    return tokens, list(FALLBACK_STOP) if target.chat_template() is None else []


def completion_prompt(body: dict, target: Model, infill: bool = False,
                      options: Options | None = None) -> tuple[list[int], list[str]]:
    """A completion's `prompt` (a string, or a list of one) as tokens, and no stop strings of its
    own; with a `suffix`, or for /infill, the fill-in-the-middle prompt (infill.py)."""
    if infill or body.get("suffix") not in (None, ""):
        from spectool.server.infill import infill_prompt, suffix_prompt

        # the extra chunks leave room for the server's answer budget, as llama-server's its
        # --n-predict: a request that warms the cache (n_predict 0) and the next one then keep the
        # same chunks
        budget = options.max_tokens if options is not None else 0
        return (infill_prompt if infill else suffix_prompt)(body, target, budget), []
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string", code="invalid_prompt")
    return target.tokenize(prompt, add_special=True, parse_special=True), []


def content(m: dict, i: int) -> str:
    """A message's content: a string, or OpenAI's array of content parts, whose text parts are
    joined with newlines as llama.cpp's server joins them (common/chat.cpp, concat_content_parts).
    Other parts are refused by type: this server reads text only."""
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list) and c and all(isinstance(part, dict) for part in c):
        other = sorted({str(part.get("type")) for part in c
                        if part.get("type") != "text" or not isinstance(part.get("text"), str)})
        if other:
            raise ApiError(400, f"messages[{i}].content has parts of type {', '.join(other)}; this "
                                "server takes text parts only", code="unsupported_content")
        return "\n".join(part["text"] for part in c)
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text "
                        "parts", code="invalid_messages")
