"""spectool's prompt lookup against llama.cpp's own n-gram drafting (`llama-lookup`, and `llama-speculative-simple`
with `--spec-type ngram-simple | ngram-map-k | ngram-mod`), with plain decoding by both tools as the baseline, on
the same prompts in the same run.

    pip install -e ".[test,bench]"
    python benchmarks/vs_llamacpp.py         # builds llama.cpp's tools once (see llamacpp.py), then ~10 minutes

F16 Gemma 3 270M, greedy, 8 prompts a set, 96 new tokens, 2 threads, every layer on the GPU where llama.cpp sees one
(spectool's `-ngl auto`, the tools' `-ngl 99`; the report names the backend); `llama-lookup` drafts at most 8 tokens
(`--spec-draft-n-max 8`, as in llama.cpp's examples) from its context n-gram cache; the n-gram drafters of
`llama-speculative-simple` are sized for short contexts (llamacpp.NGRAM). The contenders run prompt by prompt,
interleaved, so slow drift of the machine hits all alike. Decode speed is tokens per second of decoding:
llama-completion's `eval time` (single-token decodes), spectool's own clock from the end of prompt processing to
its last token, and llama-lookup's and llama-speculative-simple's `decoded N tokens in T seconds` read the same way
as spectool's: the 96 tokens asked for, from the end of the prompt's first n-1 tokens to the 96th
(llamacpp.parse_lookup: llama-lookup decodes the last prompt token before its clock starts, counts the token that
gives, and runs its last step past -n). Writes benchmarks/results/vs_llamacpp.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import llamacpp  # noqa: E402
import common  # noqa: E402
from common import models, on_gpu  # noqa: E402

from common import machine  # noqa: E402
from spectool.llama import engine  # noqa: E402
from spectool.bench import Contender, Result  # noqa: E402
from spectool.core.costs import Costs  # noqa: E402
from spectool.generate.loop import GenerationConfig, speculative_generate  # noqa: E402
from spectool.core.stats import Stats  # noqa: E402
from spectool.cli.display import offload_text  # noqa: E402
from spectool.options import CTX_SIZE  # noqa: E402

SETS = {"code editing (HumanEval)": common.humaneval_prompts, "grounded chat (ShareGPT)": common.grounded_prompts,
        "free-form (ShareGPT)": common.freeform_prompts}


def decode(g: GenerationConfig, prompt: list[int], st: Stats) -> tuple[list[int], int, float]:
    """(tokens, how many, seconds): wall-clock decode time, as llama.cpp's tools count it (prompt processing,
    which for spectool includes indexing the prompt and measuring a fresh cost table, excluded)."""
    t0 = time.perf_counter()
    tokens = [t for step in speculative_generate(g, prompt, st) for t in step.tokens]
    return tokens, len(tokens), time.perf_counter() - t0 - st.prompt_seconds


def run_set(name: str, texts: list[str], model: Path, bins: dict, args) -> list[Result]:
    ours = [Contender("spectool plain", "none"), Contender("spectool lookup", "lookup", 32)]
    theirs = [Result("llama-completion"), Result(f"llama-lookup ({args.n_draft})"),
              *[Result(f"llama.cpp {kind}") for kind in llamacpp.NGRAM]]
    results = {c.name: Result(c.name) for c in ours}
    costs = {c.name: Costs() for c in ours}
    repack = not engine.avoid_amx()  # the same weights layout as spectool's (see engine.avoid_amx)
    gpu = on_gpu()
    with engine.Model(model, n_ctx=CTX_SIZE, n_threads=args.threads, n_gpu_layers="auto") as target:
        print(f"   spectool's backend: {offload_text({'target': target.offload()})}; llama.cpp's tools: "
              f"-ngl {99 if gpu else 0}", flush=True)
        plain_texts = []
        for i, text in enumerate(texts):
            prompt = target.tokenize(text)
            for c in ours:
                st = Stats(mode=c.mode)
                g = c.generation(target, {}, args.tokens, costs[c.name])
                results[c.name].add(st, *decode(g, prompt, st))
            plain_texts.append(target.detokenize(results["spectool plain"].outputs[-1]))
            # llama-lookup's clock leaves out its decode of the last prompt token (llamacpp.parse_lookup): priced as
            # one of llama-completion's single-token decodes on this prompt (on the earlier ones if that failed)
            one_decode = theirs[0].seconds / theirs[0].tokens if theirs[0].tokens else 0.0
            runs = [lambda: llamacpp.completion(bins["llama-completion"], model, text, args.tokens, args.threads,
                                                repack=repack, gpu=gpu),
                    lambda: llamacpp.lookup(bins["llama-lookup"], model, text, args.tokens, args.n_draft,
                                            args.threads, repack=repack, first_decode=one_decode, gpu=gpu)]
            runs += [lambda kind=kind: llamacpp.speculative_ngram(bins["llama-speculative-simple"], model, text,
                                                                  args.tokens, kind, args.threads, repack=repack,
                                                                  gpu=gpu) for kind in llamacpp.NGRAM]
            for r, run in zip(theirs, runs):
                try:
                    out = run()
                except RuntimeError as e:
                    r.failed += 1
                    print(f"  {r.contender} failed on prompt {i + 1}: {e}", flush=True)
                    continue
                r.prompts += 1
                r.generated += out.tokens
                r.tokens += out.tokens
                r.seconds += out.seconds
                if r is theirs[0] and out.tokens:
                    one_decode = out.seconds / out.tokens
                r.drafted += out.drafted
                r.accepted += out.accepted
                # the same text as spectool's plain decoding, as far as both went (llama-lookup can overshoot)
                n = min(len(out.text), len(plain_texts[-1]))
                r.identical += n > 0 and out.text[:n] == plain_texts[-1][:n]
            print(f"  prompt {i + 1}/{len(texts)}", end="\r", flush=True)
    rows = [theirs[0], results["spectool plain"], *theirs[1:], results["spectool lookup"]]
    for r in results.values():
        r.identical = sum(a == b for a, b in zip(r.outputs, results["spectool plain"].outputs))
    for r in rows:
        r.speedup = r.tokens_per_second / theirs[0].tokens_per_second if theirs[0].tokens_per_second else 0.0
    return rows


def table(groups: dict[str, list[Result]]) -> str:
    lines = ["| set | contender | tok/s | vs llama-completion | drafted | accepted | same text as plain |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, rows in groups.items():
        for r in rows:
            drafted = f"{r.drafted}" if r.drafted else ""
            accepted = f"{r.accepted}" if r.drafted else ""
            lines.append(f"| {name} | {r.contender} | {r.tokens_per_second:.1f} | {r.speedup:.2f}x | {drafted} | "
                         f"{accepted} | {r.identical}/{r.prompts} |")
    lines += ["", "| set | spectool lookup / llama-lookup | spectool lookup / llama.cpp's best n-gram drafter | "
                  "spectool plain / llama-completion |", "|---|---:|---:|---:|"]
    for name, rows in groups.items():
        ours, best = rows[-1], max(rows[3:-1], key=lambda r: r.tokens_per_second)
        lines.append(f"| {name} | {ours.tokens_per_second / rows[2].tokens_per_second:.2f}x | "
                     f"{ours.tokens_per_second / best.tokens_per_second:.2f}x ({best.contender}) | "
                     f"{rows[1].tokens_per_second / rows[0].tokens_per_second:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-draft", type=int, default=8, help="llama-lookup's --spec-draft-n-max")
    ap.add_argument("--only", default="", help="only the sets whose name contains this text")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    engine.set_verbose(False)
    bins = llamacpp.build()
    model = models()["F16"]
    groups = {}
    for name, make in SETS.items():
        if args.only in name:
            print(f"== {name}", flush=True)
            groups[name] = run_set(name, make(args.prompts), model, bins, args)
            print(table({name: groups[name]}), flush=True)
    md = (f"Machine: {machine(args.threads)}; llama.cpp "
          f"{llamacpp.llama_cpp_version()} (llama-cpp-python's vendored sources) "
          f"{'GPU backend, every layer on the GPU' if on_gpu() else 'CPU backend'}. Gemma 3 270M F16, greedy, "
          f"{args.prompts} prompts a set, {args.tokens} new tokens. Command: `python benchmarks/vs_llamacpp.py`.\n\n"
          + table(groups) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vs_llamacpp.md").write_text(md)
    print("\n" + md)


if __name__ == "__main__":
    main()
