"""What a speculative step costs outside llama.cpp: host time per step (plain, prompt lookup, draft model), and what
a greedy 9-token verification costs inside `llama_decode` with whole logits rows copied out against token ids
sampled in the graph.

    pip install -e ".[test,bench]"
    python research/step_cost.py           # about 3 minutes on 2 cores; writes research/results/step_cost.md
    python research/step_cost.py --graph on   # sampled inside llama.cpp's graph even on the CPU (off: never)

Gemma 3 270M F16 target (the Q4_K_M as the draft model), greedy, 8 code-editing prompts (HumanEval), 96 new
tokens, every layer on the GPU when there is one. Host time per step = (decode wall time - time inside
`llama_decode`) / steps, where decode wall time runs from the end of prompt processing to the last token (as
benchmarks/vs_llamacpp.py times spectool) and every `llama_decode` call in that window, the draft model's
included, is timed by a wrapper around llama-cpp-python's binding. What is left is spectool's own work: writing
batches, reading outputs, drafter, controller, rollback, statistics, the generator.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from spectool.bench import Contender
from spectool.core.costs import Costs
from spectool.core.stats import Stats
from spectool.generate.loop import speculative_generate
from spectool.llama import devices, engine
from spectool.llama.outputs import IDS, ROWS, Output
from spectool.options import CTX_SIZE
from spectool_lab import common
from spectool_lab.common import machine, models

HERE = Path(__file__).resolve().parent
CALLS: list[tuple[float, float]] = []  # (start, seconds) of every llama_decode


def _timed_decode():
    import llama_cpp as lib  # the module engine calls llama_decode through

    real = lib.llama_decode

    def llama_decode(ctx, batch):
        t0 = time.perf_counter()
        rc = real(ctx, batch)
        CALLS.append((t0, time.perf_counter() - t0))
        return rc

    lib.llama_decode = llama_decode


def host_per_step(g, prompt: list[int]) -> tuple[list[float], int, float]:
    """(host seconds outside llama_decode of each step, tokens, decode wall seconds) of one generation."""
    st = Stats()
    CALLS.clear()
    t0 = time.perf_counter()
    arrivals, n = [], 0
    for step in speculative_generate(g, prompt, st):
        arrivals.append(time.perf_counter())
        n += len(step.tokens)
    bounds = [t0 + st.prompt_seconds, *arrivals]
    calls = iter(sorted(CALLS))
    call = next(calls, None)
    host = []
    for a, b in zip(bounds, bounds[1:]):
        inside = 0.0
        while call is not None and call[0] < b:
            inside += call[1] if call[0] >= a else 0.0
            call = next(calls, None)
        host.append((b - a) - inside)
    return host, n, bounds[-1] - bounds[0]


def verify_cost(target, prompt: list[int], output: Output, repeats: int = 40) -> float:
    """Median seconds inside llama_decode of a 9-token verification after `prompt`, outputs read as `output` asks
    (ROWS: whole rows copied out; IDS: token ids sampled in the graph)."""
    target.graph_sampling = output is not ROWS
    target.sync(prompt[:-1], logits="none")
    times = []
    for _ in range(repeats + 2):
        CALLS.clear()
        target.eval(prompt[-1:] + prompt[-9:-1], logits="all", output=output)
        times.append(CALLS[-1][1])
        target.rollback(len(prompt) - 1)
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--graph", choices=("auto", "on", "off"), default="auto",
                    help="sample inside llama.cpp's graph: where the output layer is on a device (auto), always, never")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    engine.set_verbose(False)
    _timed_decode()
    paths = models()
    texts = common.humaneval_prompts(args.prompts)
    contenders = [Contender("plain", "none"), Contender("lookup", "lookup", 32),
                  Contender("lookup k=8", "lookup", 8, True), Contender("draft model", "draft", 8)]
    rows = []
    graph = {"auto": None, "on": True, "off": False}[args.graph]
    with engine.Model(paths["F16"], n_ctx=CTX_SIZE, n_threads=args.threads, n_gpu_layers="auto",
                      graph_sampling=graph) as target, \
            engine.Model(paths["Q4_K_M"], n_ctx=CTX_SIZE, n_threads=args.threads, n_gpu_layers="auto",
                         graph_sampling=graph) as draft:
        sampled_in_graph = target.graph_sampling
        backend = target.offload()["backend"]
        prompts = [target.tokenize(t) for t in texts]
        costs = {c.name: Costs() for c in contenders}
        total = {c.name: ([], [0, 0.0]) for c in contenders}
        for i, prompt in enumerate(prompts):
            for c in contenders:
                g = c.generation(target, {0: (draft, None)}, args.tokens, costs[c.name])
                host, n, wall = host_per_step(g, prompt)
                total[c.name][0].extend(host)
                total[c.name][1][0] += n
                total[c.name][1][1] += wall
            print(f"  prompt {i + 1}/{len(prompts)}", end="\r", flush=True)
        for c in contenders:
            host, (n, wall) = total[c.name]
            steps = len(host)
            rows.append(f"| {c.name} | {1000 * statistics.mean(host):.3f} | {1000 * statistics.median(host):.3f} | "
                        f"{n / steps:.2f} | {1000 * wall / steps:.2f} | {100 * sum(host) / wall:.1f}% |")
        rows_ms = 1000 * verify_cost(target, prompts[0], ROWS)
        ids_ms = 1000 * verify_cost(target, prompts[0], IDS)
    md = (f"Machine: {machine(args.threads)}, backend {backend}; "
          f"llama-cpp-python {devices.versions()['llama_cpp_python']}. Gemma 3 270M F16 (draft: Q4_K_M), greedy, "
          f"{args.prompts} HumanEval prompts, {args.tokens} new tokens. Outputs read "
          f"{'as sampled inside the graph' if sampled_in_graph else 'as whole rows on the host'}. "
          f"Command: `python research/step_cost.py --graph {args.graph}`.\n\n"
          "| contender | host ms / step, mean | median | tokens / step | decode ms / step | host share |\n"
          "|---|---:|---:|---:|---:|---:|\n"
          + "\n".join(rows) + "\n\n"
          f"Inside llama_decode, a greedy 9-token verification (median of 40): whole rows copied out "
          f"{rows_ms:.2f} ms, token ids sampled in the graph {ids_ms:.2f} ms.\n")
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "step_cost.md").open("a") as f:
        f.write(f"## {time.strftime('%Y-%m-%d %H:%M')}\n\n{md}\n")
    print("\n" + md)


if __name__ == "__main__":
    main()
