"""Structured output: JSON extraction under a JSON schema, spectool against llama-server with the same schema, on
the same prompts in the same run.

    pip install -e ".[test,bench]"
    python benchmarks/structured.py          # builds llama-server once (see llamacpp.py), then ~10 minutes
    python benchmarks/structured.py --quick  # 2 prompts: a smoke run
    python benchmarks/structured.py --draft  # and a draft model under the grammar, alone and after lookup

Prompts (spectool_lab.extraction): HumanEval functions and ShareGPT requests that paste a text, in turn, each with a
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
from dataclasses import replace
from pathlib import Path

from spectool.bench import Contender
from spectool.core.costs import Costs
from spectool.core.grammar import Grammar
from spectool.core.stats import Stats
from spectool.drafters.builder import for_generation
from spectool.llama import engine
from spectool.models.registry import PAIR_DRAFT_MAX
from spectool.options import DRAFT_MAX
from spectool.templates import prompt_tokens
from spectool_lab import common, llamacpp
from spectool_lab.common import decode, machine, models, on_gpu, open_drafts
from spectool_lab.extraction import Extraction, Row, extraction_prompts, table


HERE = Path(__file__).resolve().parent

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
    gpu = on_gpu()  # the device spectool runs on (the weights' layout: the lab's default, spectool's)
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(llamacpp.Server(server_bin, model, args.threads, gpu=gpu,
                                                             extra=flags))
                   for name, flags in SERVERS.items()}
        target = stack.enter_context(common.load(model, args.threads))
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
