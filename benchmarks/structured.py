"""Structured output: JSON extraction under a JSON schema, spectool against llama-server with the same schema, on
the same prompts in the same run.

    pip install -e ".[test,bench]"
    python benchmarks/structured.py          # builds llama-server once (see llamacpp.py), then ~10 minutes
    python benchmarks/structured.py --quick  # 2 prompts: a smoke run
    python benchmarks/structured.py --draft  # and a draft model under the grammar, alone and after lookup

Prompts (extraction_prompts): HumanEval functions and ShareGPT requests that paste a text, in turn, each with a
JSON schema of 5 fields to fill from it: a function's name, parameters, return annotation, the first sentence of
its docstring and its first example call (after one worked example, HumanEval/13: Gemma 3 270M, a base model,
then copies the facts from the function); a request's kind (an enum), its instruction, the topic of its text,
the text's first sentence and the names in it. The values are meant to be copied from the text, where prompt
lookup finds them; strings and lists have a maximum length (maxLength, maxItems), so that a generation that
rambles inside a string still ends in valid JSON. Each is one user message, rendered as spectool's chat and serve
render it (spectool.cli.chat.prompt_tokens: the model's chat template, or "User:/Assistant:" lines where the model has
none, as this GGUF does); llama-server gets the same token ids on /completion, so both tools see the same prompt.

F16 Gemma 3 270M, greedy, 2 threads, at most 256 new tokens (the grammar's completion ends a generation earlier),
the contenders prompt by prompt, interleaved, so slow drift of the machine hits all alike:
- spectool constrained plain (`for_generation(None, grammar=True, forced=False)`, no drafter: one token a step), the
  grammar's forced tokens as the only drafts (no drafter, `forced=True`), lookup without forced drafts,
  lookup with forced drafts (the default): the schema compiled by llguidance, decode time from the end of prompt
  processing to the last token, one cost table per contender shared by the prompts; with --draft, also the Q4_K_M
  (the target's own weights at another precision) as a draft model under the grammar, alone and after lookup
  (hybrid), whole and pruned to 64k tokens (prune.py), the forced tokens first in each draft;
- llama-server (built from the vendored llama.cpp), the schema in its `json_schema` request field, plain and with
  each n-gram drafter it has (`--spec-type`, llamacpp.SERVER_NGRAM), one server each, started once: decode speed
  is its own `timings` (predicted_per_second: the tokens after the first over predicted_ms, prompt excluded).
Every output is parsed as JSON and validated against its schema (`jsonschema`); the table counts the valid ones
and the note says why the others are not. "same text" counts the prompts whose output equals spectool's
constrained plain output (for spectool's lookup contenders that is the exactness of speculation, for
llama-server whether its grammar engine picked the same text; a difference is reported, never a failure).
Writes benchmarks/results/structured.md (structured_draft.md with --draft).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import llamacpp  # noqa: E402
import common  # noqa: E402
from common import models, on_gpu, open_drafts  # noqa: E402
from vs_llamacpp import decode  # noqa: E402

from common import machine  # noqa: E402
from spectool.llama import engine  # noqa: E402
from spectool.bench import Contender, Result  # noqa: E402
from spectool.templates import prompt_tokens  # noqa: E402
from spectool.core.costs import Costs  # noqa: E402
from spectool.core.grammar import Grammar  # noqa: E402
from spectool.drafters.builder import for_generation  # noqa: E402
from spectool.core.stats import Stats  # noqa: E402
from spectool.models.registry import PAIR_DRAFT_MAX  # noqa: E402
from spectool.options import CTX_SIZE, DRAFT_MAX  # noqa: E402

NAME = {"type": "string", "maxLength": 32}
LINE = {"type": "string", "maxLength": 100}  # a copied sentence or line, cut where a small model would ramble on
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
FUNCTION_ASK = ("Describe a Python function as a JSON object: its name, its parameter names, its return annotation, "
                "the first sentence of its docstring and its first example call, copied as written.")
FUNCTION_DEMO = (  # HumanEval/13, which the prompts' stride skips
    'def greatest_common_divisor(a: int, b: int) -> int:\n    """ Return a greatest common divisor of two integers a '
    'and b\n    >>> greatest_common_divisor(3, 5)\n    1\n    """\n    while b:\n        a, b = b, a % b\n    return a',
    {"name": "greatest_common_divisor", "parameters": ["a", "b"], "returns": "int",
     "summary": "Return a greatest common divisor of two integers a and b", "example": "greatest_common_divisor(3, 5)"})
REQUEST = {  # a ShareGPT request that pastes a text
    "type": "object",
    "properties": {
        "kind": {"enum": ["rewrite", "summarize", "fix", "proofread", "paraphrase", "improve", "edit", "other"]},
        "instruction": LINE,
        "topic": NAME,
        "first_sentence": LINE,
        "names": {"type": "array", "items": NAME, "maxItems": 5},
    },
    "required": ["kind", "instruction", "topic", "first_sentence", "names"],
    "additionalProperties": False,
}
REQUEST_ASK = ("Describe the request above as a JSON object: what kind of request it is, its instruction, the topic "
               "of the text it pastes, the text's first sentence and the names of people, places, products or "
               "technologies in it, copied as written.")


def message(ask: str, text: str, demo: tuple[str, dict] | None = None, fence: str = "") -> str:
    """The user's message: what to fill in, a worked example, then the text; or, without one, the text first and
    then what to fill in. (Gemma 3 270M, a base model, copies the form of an example function, and fills in the
    facts of the function asked about; shown an example request, it copies the example's values instead.)"""
    def block(t: str) -> str:
        return f"```{fence}\n{t}\n```" if fence else t

    if demo is None:
        return f"{block(text)}\n\n{ask}\nThe JSON object is:"
    return (f"{ask}\n\nFor example, for\n{block(demo[0])}\nthe JSON object is:\n{json.dumps(demo[1])}\n\n"
            f"Now for\n{block(text)}\nthe JSON object is:")


@dataclass
class Extraction:
    source: str  # where the text comes from
    message: str  # the user's message: what to fill in, then the text
    schema: dict


def extraction_prompts(n: int) -> list[Extraction]:
    """`n` extraction prompts, HumanEval and ShareGPT in turn (the first one of each with n = 2)."""
    functions, texts = common.humaneval_functions((n + 1) // 2), common.grounded_texts(n // 2)
    out = []
    for i in range(n):
        if i % 2 == 0:
            name, code = functions[i // 2]
            out.append(Extraction(f"HumanEval {name}", message(FUNCTION_ASK, code, FUNCTION_DEMO, "python"), FUNCTION))
        else:
            out.append(Extraction(f"ShareGPT request {i // 2 + 1}", message(REQUEST_ASK, texts[i // 2]),
                                  REQUEST))
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
    notes: list[str] = field(default_factory=list, repr=False)  # why an output is not valid, or a failure

    def output(self, text: str, schema: dict, source: str) -> None:
        self.texts.append(text)
        reason = check(text, schema)
        self.valid += reason is None
        if reason:
            self.notes.append(f"{self.contender} on {source}: {reason}")


SPECTOOL = [  # (contender, forced drafts); plain decoding under the grammar drafts nothing, not even what it forces
    (Contender("spectool constrained plain", "none"), False),
    (Contender("spectool forced drafts only", "none", DRAFT_MAX), True),  # room for drafts: no drafter but the grammar
    (Contender("spectool lookup, no forced drafts", "lookup", DRAFT_MAX), False),
    (Contender("spectool lookup + forced drafts", "lookup", DRAFT_MAX), True),
]
DRAFTED = [  # with --draft: the Q4_K_M as a draft model under the grammar (drafters/grammar.GrammarDrafter)
    (Contender("spectool draft model + forced drafts", "draft", PAIR_DRAFT_MAX), True),
    (Contender("spectool hybrid + forced drafts", "hybrid", 2 * PAIR_DRAFT_MAX), True),
    (Contender("spectool draft model, 64k vocab + forced drafts", "draft", PAIR_DRAFT_MAX, draft_vocab=65536), True),
    (Contender("spectool hybrid, 64k vocab + forced drafts", "hybrid", 2 * PAIR_DRAFT_MAX, draft_vocab=65536), True),
]
SERVERS = {"llama-server": (), **{f"llama-server {kind}": ("--spec-type", kind, *sizes)
                                   for kind, sizes in llamacpp.SERVER_NGRAM.items()}}


def run(extractions: list[Extraction], model: Path, server_bin: Path, args, draft: Path | None = None) -> list[Row]:
    spectool = SPECTOOL + (DRAFTED if draft else [])
    rows = {name: Row(name) for name in [*(c.name for c, _ in spectool), *SERVERS]}
    costs = {c.name: Costs() for c, _ in spectool}
    repack, gpu = not engine.avoid_amx(), on_gpu()  # the weights layout and device spectool runs with
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(llamacpp.Server(server_bin, model, args.threads, repack=repack,
                                                             gpu=gpu, extra=flags))
                   for name, flags in SERVERS.items()}
        target = stack.enter_context(engine.Model(model, n_ctx=CTX_SIZE, n_threads=args.threads,
                                                  n_gpu_layers="auto"))
        drafts = open_drafts(stack, draft, [c for c, _ in spectool], args.threads)
        for i, ex in enumerate(extractions):
            prompt = prompt_tokens(target, [{"role": "user", "content": ex.message}])
            grammar = Grammar.json_schema(ex.schema)
            for c, forced in spectool:
                st, r = Stats(mode=c.mode), rows[c.name]
                g = c.generation(target, drafts, args.tokens, costs[c.name])
                g = replace(g, grammar=grammar, drafter=for_generation(g.drafter, grammar=True, forced=forced))
                tokens, n, seconds = decode(g, prompt, st)
                r.add(st, tokens, n, seconds)
                r.forced += st.by_source.get("grammar", 0)
                r.output(target.detokenize([t for t in tokens if not target.is_eog(t)]), ex.schema, ex.source)
            for name, server in servers.items():
                r = rows[name]
                try:
                    out = server.complete(prompt, args.tokens, ex.schema)
                except RuntimeError as e:
                    r.failed += 1
                    r.notes.append(f"{name} failed on {ex.source}: {e}")
                    continue
                r.prompts += 1
                r.generated += out.tokens + 1
                r.tokens += out.tokens
                r.seconds += out.seconds
                r.drafted += out.drafted
                r.accepted += out.accepted
                r.output(out.text, ex.schema, ex.source)
            print(f"  prompt {i + 1}/{len(extractions)}", end="\r", flush=True)
    out = list(rows.values())
    plain = rows["spectool constrained plain"]
    for r in out:
        r.identical = sum(a == b for a, b in zip(r.texts, plain.texts))
        r.speedup = r.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else 0.0
    return out


def table(rows: list[Row]) -> str:
    servers = [r for r in rows if r.contender.startswith("llama-server")]
    best = max(servers, key=lambda r: r.tokens_per_second)
    lines = ["| contender | tok/s | vs spectool constrained plain | vs llama-server's best | drafted | accepted | "
             "forced by the grammar | valid JSON | same text as spectool constrained plain |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        vs_best = r.tokens_per_second / best.tokens_per_second if best.tokens_per_second else 0.0
        n = r.prompts + r.failed
        lines.append(f"| {r.contender} | {r.tokens_per_second:.1f} | {r.speedup:.2f}x | {vs_best:.2f}x | "
                     f"{r.drafted or ''} | {r.accepted if r.drafted else ''} | {r.forced or ''} | {r.valid}/{n} | "
                     f"{r.identical}/{n} |")
    lines += ["", f"llama-server's fastest configuration: {best.contender} ({best.tokens_per_second:.1f} tok/s)."]
    notes = [note for r in rows for note in r.notes]
    lines += ["", "Not valid:" if notes else "Every output of every contender is valid against its schema."]
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="extraction prompts (at least 8 for the record)")
    ap.add_argument("--tokens", type=int, default=256, help="most new tokens per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 prompts: a smoke run")
    ap.add_argument("--draft", action="store_true", help="also the Q4_K_M as a draft model under the grammar")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    if args.quick:
        args.prompts = 2
    engine.set_verbose(False)
    server_bin = llamacpp.build(targets=llamacpp.SERVER)["llama-server"]
    extractions = extraction_prompts(args.prompts)
    m = models()
    rows = run(extractions, m["F16"], server_bin, args, m["Q4_K_M"] if args.draft else None)
    md = (f"Machine: {machine(args.threads)}; llama.cpp {llamacpp.llama_cpp_version()} (llama-cpp-python's vendored "
          f"sources), {'GPU backend, every layer on the GPU' if on_gpu() else 'CPU backend'}. Gemma 3 270M F16, "
          f"greedy, {len(extractions)} extraction prompts with a JSON schema each "
          f"({', '.join(e.source for e in extractions)}), at most {args.tokens} new tokens. Command: "
          f"`python benchmarks/structured.py{' --quick' if args.quick else ''}{' --draft' if args.draft else ''}`.\n\n"
          + table(rows) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / ("structured_draft.md" if args.draft else "structured.md")).write_text(md)
    print("\n" + md)


if __name__ == "__main__":
    main()
