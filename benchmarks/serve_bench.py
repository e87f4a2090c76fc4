"""End-to-end tokens/s through `spectool serve`'s OpenAI API: speculative (prompt lookup) vs `--spec none`, on the
code-editing set, and what HTTP costs per token.

    pip install -e ".[test,bench]"
    python benchmarks/serve_bench.py        # a few minutes on 2 cores
    python benchmarks/serve_bench.py --parallel 4 --repeats 3


For each mode a real server process serves F16 Gemma 3 270M on 127.0.0.1 and the official `openai` client sends
the prompts one after another, greedy, streamed (as editors and agents ask). End-to-end speed is completion tokens
over the client's wall clock from the request to the stream's end (prompt processing included, as a user waits
for it); the server's own prompt and decode times come back in `usage.speculative`, and what is left of the
client's time, per token, is what the API adds (HTTP, JSON, server-sent events, the queue). `--logprobs N` adds
the lookup server asked for each token's logprob and its N best alternatives (`logprobs: N`), each prompt sent with
and without them in turn (which first alternates), so that both see the same load.

`--parallel N` measures the batch instead: N clients at once, each sending its share of the prompts one after
another, against the one-sequence lookup server (which queues them), `--parallel N` with lookup (and with
`--kv-unified`; with `--trees T`, with `--draft-tree T` too), and `--parallel N --spec none`; the servers are up
together and take turns, round after round (`--repeats`), so that each round sees the same machine. Throughput is
all completion tokens over the round's wall clock, prompts included: each round's prompts start with its number,
so that no server finds one cached from an earlier round.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from spectool_lab import common
from spectool_lab.common import models


def start(model: Path, spec: str, threads: int, *extra: str) -> tuple[subprocess.Popen, str]:
    """A `spectool serve` process on a free local port (`extra`: more flags), once /health answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "spectool", "serve", "-m", str(model), "--spec", spec,
                             "-t", str(threads), "--port", str(port), *extra], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start")


def measure(url: str, texts: list[str], tokens: int, logprobs: int | None = None, warm: bool = True) -> dict:
    """The totals of the prompts sent one after another; with `logprobs`, each prompt is sent twice, with and
    without asking for them, and {False: totals without, True: totals with} comes back. `warm`: a short request
    first."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    if warm:
        client.completions.create(model=model, prompt="warm up", max_tokens=4)
    rows = {asks: {"tokens": 0, "wall": 0.0, "decode": 0.0, "prompt": 0.0, "drafted": 0, "accepted": 0}
            for asks in (False, True)}
    for i, text in enumerate(texts):
        for asks in ((False,) if logprobs is None else (i % 2 == 1, i % 2 == 0)):
            r = rows[asks]
            t0 = time.perf_counter()
            usage = None
            for chunk in client.completions.create(model=model, prompt=text, max_tokens=tokens, temperature=0,
                                                   stream=True, logprobs=logprobs if asks else None):
                usage = chunk.usage or usage
            r["wall"] += time.perf_counter() - t0
            spec = usage.model_extra["speculative"]
            r["tokens"] += usage.completion_tokens
            r["decode"] += spec["decode_seconds"]
            r["prompt"] += spec["prompt_seconds"]
            r["drafted"], r["accepted"] = r["drafted"] + spec["drafted"], r["accepted"] + spec["accepted"]
    return rows if logprobs is not None else rows[False]


def together(url: str, texts: list[str], tokens: int, clients: int) -> tuple[int, float]:
    """`clients` clients at once, client i sending texts i, i + clients, ... one after another: the completion
    tokens of all and the wall clock from the first request to the last answer."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    made = [0] * clients

    def send(i: int) -> None:
        for text in texts[i::clients]:
            r = client.completions.create(model=model, prompt=text, max_tokens=tokens, temperature=0)
            made[i] += r.usage.completion_tokens

    threads = [threading.Thread(target=send, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(made), time.perf_counter() - t0


def batch_rounds(model: Path, texts: list[str], args) -> None:
    """The `--parallel N` comparison (module docstring), printed as a table of each server's mean tokens per second
    over the rounds, its spread, and its ratio to the one-sequence server's."""
    n = args.parallel
    shapes = {"one sequence, lookup (queued)": ("lookup", "1", ()),
              f"--parallel {n}, lookup": ("lookup", str(n), ()),
              f"--parallel {n} --kv-unified, lookup": ("lookup", str(n), ("--kv-unified",)),
              f"--parallel {n} --spec none": ("none", str(n), ())}
    if args.trees:  # each slot's draft trees in the batch's one decode (one KV buffer)
        shapes[f"--parallel {n} --draft-tree {args.trees}, lookup"] = ("lookup", str(n),
                                                                        ("--draft-tree", str(args.trees)))
    servers = {name: start(model, spec, args.threads, "--parallel", par, "-c", str(2048 * int(par)), *extra)
               for name, (spec, par, extra) in shapes.items()}
    rates: dict[str, list[float]] = {name: [] for name in shapes}
    try:
        for url in (u for _, u in servers.values()):  # warm-up: every sequence's graphs
            together(url, [f"Warm-up {i}: count to ten." for i in range(n)], 8, n)
        for r in range(args.repeats):
            names = list(shapes)[r % len(shapes) :] + list(shapes)[: r % len(shapes)]
            # no prompt cached by an earlier round: each is prefilled whole on every server
            round_texts = [f"# round {r + 1}\n{text}" for text in texts]
            for name in names:
                made, wall = together(servers[name][1], round_texts, args.tokens, n)
                rates[name].append(made / wall)
                print(f"round {r + 1}: {name}: {made / wall:.1f} tok/s", file=sys.stderr)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    base = statistics.mean(rates[next(iter(shapes))])
    print(f"\n| server, {n} clients at once | tok/s (mean of {args.repeats}) | spread | vs one sequence |\n"
          "|---|---:|---:|---:|")
    for name, xs in rates.items():
        print(f"| {name} | {statistics.mean(xs):.1f} | {min(xs):.1f}-{max(xs):.1f} | "
              f"{statistics.mean(xs) / base:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--logprobs", type=int, default=None, help="also measure lookup with logprobs: N")
    ap.add_argument("--parallel", type=int, default=None, help="measure N clients at once (module docstring)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of --parallel's comparison")
    ap.add_argument("--trees", type=int, default=0, help="--parallel's comparison gains its server with "
                    "--draft-tree N")
    ap.add_argument("--set", default=next(iter(common.SETS)), choices=list(common.SETS),
                    help="the prompts' set (default: code editing)")
    common.sample_options(ap)
    args = ap.parse_args()
    seed = common.fresh_seed(args.seed)
    model, texts = models()["F16"], common.chosen(args.set, args.prompts, args, seed)
    if args.parallel:
        drawn = "the tuning list" if args.tuning else f"unseen, --seed {seed}"
        print(f"F16 Gemma 3 270M, {args.set}, {args.prompts} prompts ({drawn}), {args.tokens} tokens, "
              "greedy")
        return batch_rounds(model, texts, args)
    rows = {}
    for spec in ("none", "lookup"):
        proc, url = start(model, spec, args.threads)
        try:
            if spec == "lookup" and args.logprobs is not None:
                pair = measure(url, texts, args.tokens, args.logprobs)
                rows[spec], rows[f"lookup` + `logprobs: {args.logprobs}"] = pair[False], pair[True]
            else:
                rows[spec] = measure(url, texts, args.tokens)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    drawn = "the tuning list" if args.tuning else f"unseen, --seed {seed}"
    print(f"\nF16 Gemma 3 270M, {args.set}, {args.prompts} prompts ({drawn}), {args.tokens} tokens, "
          "greedy, streamed through the OpenAI API\n")
    print("| server | end-to-end tok/s | speedup | server decode tok/s | API cost per token | drafted | "
          "accepted |\n|---|---:|---:|---:|---:|---:|---:|")
    base = rows["none"]["tokens"] / rows["none"]["wall"]
    for spec, r in rows.items():
        e2e = r["tokens"] / r["wall"]
        print(f"| `--spec {spec}` | {e2e:.1f} | {e2e / base:.2f}x | {r['tokens'] / r['decode']:.1f} | "
              f"{1000 * (r['wall'] - r['decode'] - r['prompt']) / r['tokens']:.2f} ms | {r['drafted']} | "
              f"{r['accepted']} |")


if __name__ == "__main__":
    main()
