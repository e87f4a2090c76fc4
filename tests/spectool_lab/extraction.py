"""JSON extraction under a schema (benchmarks/structured.py, research/structured_bound.py): the
prompts and how their outputs are scored.

Each prompt is a HumanEval function or a ShareGPT request that pastes a text, in turn, with a JSON
schema of 5 fields to copy from it: a function's name, parameters, return annotation, the first
sentence of its docstring and its first example call (after one worked example, HumanEval/13:
Gemma 3 270M, a base model, then copies the facts from the function); a request's kind (an enum),
its instruction, the topic of its text, the text's first sentence and the names in it. Strings and
lists have a maximum length (maxLength, maxItems), so that a generation that rambles inside a
string still ends in valid JSON. An output counts when it parses as JSON valid against its schema
(`jsonschema`); the table says why the others are not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from spectool.bench import Result
from spectool_lab import common

NAME = {"type": "string", "maxLength": 32}
LINE = {"type": "string", "maxLength": 100}  # a copied line, cut where a small model rambles on
FUNCTION = {  # a HumanEval function's facts
    "type": "object",
    "properties": {
        "name": NAME,
        "parameters": {"type": "array", "items": NAME, "maxItems": 4},
        "returns": NAME,
        "summary": LINE,
        "example": LINE,
    },
    "required": ["name", "parameters", "returns", "summary", "example"],
    "additionalProperties": False,
}
FUNCTION_ASK = ("Describe a Python function as a JSON object: its name, its parameter names, its "
                "return annotation, the first sentence of its docstring and its first example "
                "call, copied as written.")
FUNCTION_DEMO = (  # HumanEval/13, which the prompts' stride skips
    'def greatest_common_divisor(a: int, b: int) -> int:\n    """ Return a greatest common divisor '
    'of two integers a and b\n    >>> greatest_common_divisor(3, 5)\n    1\n    """\n'
    '    while b:\n        a, b = b, a % b\n    return a',
    {"name": "greatest_common_divisor", "parameters": ["a", "b"], "returns": "int",
     "summary": "Return a greatest common divisor of two integers a and b",
     "example": "greatest_common_divisor(3, 5)"})
REQUEST = {  # a ShareGPT request that pastes a text
    "type": "object",
    "properties": {
        "kind": {"enum": ["rewrite", "summarize", "fix", "proofread", "paraphrase", "improve",
                          "edit", "other"]},
        "instruction": LINE,
        "topic": NAME,
        "first_sentence": LINE,
        "names": {"type": "array", "items": NAME, "maxItems": 5},
    },
    "required": ["kind", "instruction", "topic", "first_sentence", "names"],
    "additionalProperties": False,
}
REQUEST_ASK = ("Describe the request above as a JSON object: what kind of request it is, its "
               "instruction, the topic of the text it pastes, the text's first sentence and the "
               "names of people, places, products or technologies in it, copied as written.")


def message(ask: str, text: str, demo: tuple[str, dict] | None = None, fence: str = "") -> str:
    """The user's message: what to fill in, a worked example, then the text; or, without one, the
    text first and then what to fill in. (Gemma 3 270M, a base model, copies the form of an example
    function, and fills in the facts of the function asked about; shown an example request, it
    copies the example's values instead.)"""
    def block(t: str) -> str:
        return f"```{fence}\n{t}\n```" if fence else t

    if demo is None:
        return f"{block(text)}\n\n{ask}\nThe JSON object is:"
    return (f"{ask}\n\nFor example, for\n{block(demo[0])}\nthe JSON object is:\n"
            f"{json.dumps(demo[1])}\n\nNow for\n{block(text)}\nthe JSON object is:")


@dataclass
class Extraction:
    source: str  # where the text comes from
    message: str  # the user's message: what to fill in, then the text
    schema: dict


def extraction_prompts(n: int) -> list[Extraction]:
    """`n` extraction prompts, HumanEval and ShareGPT in turn (the first of each with n = 2)."""
    functions, texts = common.humaneval_functions((n + 1) // 2), common.grounded_texts(n // 2)
    out = []
    for i in range(n):
        if i % 2 == 0:
            name, code = functions[i // 2]
            ask = message(FUNCTION_ASK, code, FUNCTION_DEMO, "python")
            out.append(Extraction(f"HumanEval {name}", ask, FUNCTION))
        else:
            ask = message(REQUEST_ASK, texts[i // 2])
            out.append(Extraction(f"ShareGPT request {i // 2 + 1}", ask, REQUEST))
    return out


def check(text: str, schema: dict) -> str | None:
    """Why `text` is not a JSON value valid against `schema`, in one line; None when it is."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as e:
        return f"not JSON ({e})"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        return f"against the schema at {e.json_path}: {e.message}"
    return None


@dataclass
class Row(Result):
    valid: int = 0
    forced: int = 0  # drafted tokens the grammar forced (Stats.by_source["grammar"])
    texts: list[str] = field(default_factory=list, repr=False)
    notes: list[str] = field(default_factory=list, repr=False)  # why an output is not valid

    def output(self, text: str, schema: dict, source: str) -> None:
        self.texts.append(text)
        reason = check(text, schema)
        self.valid += reason is None
        if reason:
            self.notes.append(f"{self.contender} on {source}: {reason}")


def table(rows: list[Row]) -> str:
    """The contenders' rows as benchmarks/structured.py reports them, each against spectool's
    constrained plain decoding and llama-server's fastest configuration, and why each output that
    is not valid is not."""
    servers = [r for r in rows if r.contender.startswith("llama-server")]
    best = max(servers, key=lambda r: r.tokens_per_second)
    lines = ["| contender | tok/s | vs spectool constrained plain | vs llama-server's best | "
             "drafted | accepted | forced by the grammar | valid JSON | "
             "same text as spectool constrained plain |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        vs_best = r.tokens_per_second / best.tokens_per_second if best.tokens_per_second else 0.0
        n = r.prompts + r.failed
        lines.append(f"| {r.contender} | {r.tokens_per_second:.1f} | {r.speedup:.2f}x | "
                     f"{vs_best:.2f}x | {r.drafted or ''} | {r.accepted if r.drafted else ''} | "
                     f"{r.forced or ''} | {r.valid}/{n} | {r.identical}/{n} |")
    lines += ["", f"llama-server's fastest configuration: {best.contender} "
                  f"({best.tokens_per_second:.1f} tok/s)."]
    notes = [note for r in rows for note in r.notes]
    valid = "Every output of every contender is valid against its schema."
    lines += ["", "Not valid:" if notes else valid]
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)
