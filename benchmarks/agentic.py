"""Related requests in a row, as agents, editors and scripts send them: prompt lookup alone, lookup with the corpus of
earlier requests (drafters/corpus.py), and llama.cpp's `llama-lookup` with a dynamic n-gram cache (-lcd), in one run.

    pip install -e ".[test,bench]"
    python benchmarks/agentic.py             # builds llama.cpp's tools once (llamacpp.py), then ~15 minutes

Workloads (real data):
- twice (HumanEval): each function asked for twice in a row, its signature and docstring after an instruction
  (type hints, then a docstring), so the second answer may repeat the first, which its own prompt does not hold;
- edits (HumanEval): a chain of edits to one file (a few functions): each request carries only the instruction and
  the file as it is now (the edits applied so far), and asks for the file after the change;
- single (the existing sets): the code-editing and grounded-chat prompts of benchmarks/run.py, unrelated to each
  other: what the corpus costs where it cannot help.

Contenders, each request sent to all in turn (drift hits all alike): `spectool serve --no-lookup-corpus` (today's
lookup) and `spectool serve` (the corpus, on by default on 127.0.0.1), through the official `openai` client,
streamed; `spectool run` per request without and with `--lookup-cache FILE`; and `llama-lookup -lcd FILE`
(llama-completion's plain decoding on each workload's first request, or on all with --plain, prices the one decode
llama-lookup's clock leaves out, as in vs_llamacpp.py). The corpus and the cache files run through the workloads in
order, as one user's day would. Decode speed: tokens over decode seconds (spectool's own clock, `usage.speculative`
or --stats-json; llama.cpp's tools as vs_llamacpp.py reads them). F16 Gemma 3 270M, greedy, 2 threads. Writes
benchmarks/results/agentic.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from spectool_lab import llamacpp
from spectool_lab.common import WORKLOADS, machine, models, on_gpu

from serve_bench import measure, start

HERE = Path(__file__).resolve().parent


def run_once(model: Path, text: str, tokens: int, threads: int, cache: Path | None) -> tuple[dict, str]:
    """`spectool run` on one prompt (with `--lookup-cache cache`): (its --stats-json, its text)."""
    with tempfile.TemporaryDirectory() as tmp:
        stats = Path(tmp) / "stats.json"
        args = [sys.executable, "-m", "spectool", "run", "-m", str(model), "--spec", "lookup", "-t", str(threads),
                "-n", str(tokens), "-q", "--stats-json", str(stats), *(["--lookup-cache", str(cache)] if cache else [])]
        p = subprocess.run([*args, "-p", text], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if p.returncode:
            raise RuntimeError(f"spectool run failed: {p.stderr[-300:]}")
        return json.loads(stats.read_text()), p.stdout


def add(row: dict, tokens: int, seconds: float, drafted: int = 0, accepted: int = 0) -> None:
    row["tokens"] += tokens
    row["seconds"] += seconds
    row["drafted"] += drafted
    row["accepted"] += accepted


CONTENDERS = ("llama-completion", "llama-lookup -lcd", "serve: lookup", "serve: lookup + corpus", "run: lookup",
              "run: lookup + --lookup-cache")


def run_workload(texts: list[str], urls: dict[str, str], model: Path, bins: dict, files: dict[str, Path],
                 args) -> dict[str, dict]:
    rows = {c: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "same": 0} for c in CONTENDERS}
    gpu = on_gpu()  # (the weights' layout: the lab's default, spectool's)
    one = 0.0
    for i, text in enumerate(texts):
        if i == 0 or args.plain:  # what one single-token decode costs: llama-lookup's clock leaves one out
            plain = llamacpp.completion(bins["llama-completion"], model, text, args.tokens, args.threads,
                                        gpu=gpu)
            add(rows["llama-completion"], plain.tokens, plain.seconds)
            one = plain.seconds / plain.tokens if plain.tokens else 0.0
        lk = llamacpp.lookup(bins["llama-lookup"], model, text, args.tokens, args.n_draft, args.threads,
                             first_decode=one, gpu=gpu, dynamic=files["lcd"])
        add(rows["llama-lookup -lcd"], lk.tokens, lk.seconds, lk.drafted, lk.accepted)
        for name, url in urls.items():
            r = measure(url, [text], args.tokens, warm=False)
            add(rows[name], r["tokens"], r["decode"], r["drafted"], r["accepted"])
        outs = []
        for name, cache in (("run: lookup", None), ("run: lookup + --lookup-cache", files["cache"])):
            st, out = run_once(model, text, args.tokens, args.threads, cache)
            add(rows[name], st["n_generated"], st["decode_seconds"], st["n_drafted"], st["n_accepted"])
            outs.append(out)
        rows["run: lookup + --lookup-cache"]["same"] += outs[0] == outs[1]
        print(f"  request {i + 1}/{len(texts)}", end="\r", flush=True)
    return rows


def table(groups: dict[str, dict[str, dict]], n: dict[str, int]) -> str:
    lines = ["| workload | contender | tok/s | vs plain | drafted | accepted |", "|---|---|---:|---:|---:|---:|"]
    ratios = ["| workload | serve: corpus / lookup | run: cache / lookup | run: cache / llama-lookup -lcd | "
              "serve: corpus / llama-lookup -lcd | run: same text with the cache |", "|---|---:|---:|---:|---:|---:|"]
    for name, rows in groups.items():
        speed = {c: r["tokens"] / r["seconds"] if r["seconds"] else 0.0 for c, r in rows.items()}
        for c, r in rows.items():
            lines.append(f"| {name} ({n[name]} requests) | {c} | {speed[c]:.1f} | "
                         f"{speed[c] / speed['llama-completion']:.2f}x | {r['drafted'] or ''} | "
                         f"{r['accepted'] if r['drafted'] else ''} |")
        ratios.append(f"| {name} | {speed['serve: lookup + corpus'] / speed['serve: lookup']:.2f}x | "
                      f"{speed['run: lookup + --lookup-cache'] / speed['run: lookup']:.2f}x | "
                      f"{speed['run: lookup + --lookup-cache'] / speed['llama-lookup -lcd']:.2f}x | "
                      f"{speed['serve: lookup + corpus'] / speed['llama-lookup -lcd']:.2f}x | "
                      f"{rows['run: lookup + --lookup-cache']['same']}/{n[name]} |")
    return "\n".join(lines + [""] + ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16, help="requests per workload")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-draft", type=int, default=8, help="llama-lookup's --spec-draft-n-max")
    ap.add_argument("--plain", action="store_true", help="llama-completion on every request, not only the first")
    ap.add_argument("--only", default="", help="only the workloads whose name contains this text")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    bins = llamacpp.build()
    model = models()["F16"]
    servers = {"serve: lookup": start(model, "lookup", args.threads, "--no-lookup-corpus"),
               "serve: lookup + corpus": start(model, "lookup", args.threads)}
    groups, n = {}, {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            files = {"lcd": Path(tmp) / "lookup-dynamic.bin", "cache": Path(tmp) / "spectool-lookup.json"}
            for name, make in WORKLOADS.items():
                if args.only in name:
                    texts = make(args.requests)
                    print(f"== {name}: {len(texts)} requests", flush=True)
                    groups[name] = run_workload(texts, {c: url for c, (_, url) in servers.items()}, model, bins, files,
                                                args)
                    n[name] = len(texts)
                    print(table({name: groups[name]}, n), flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    md = (f"Machine: {machine(args.threads)}; llama.cpp {llamacpp.llama_cpp_version()}. Gemma 3 270M F16, greedy, "
          f"{args.tokens} new tokens a request, requests in order. Command: `python benchmarks/agentic.py"
          f"{' --only ' + repr(args.only) if args.only else ''}`.\n\n" + table(groups, n) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agentic.md").write_text(md)
    print("\n" + md)


if __name__ == "__main__":
    main()
