"""Speculative decoding over llama.cpp's RPC backend: plain vs prompt lookup vs a draft model, with the target's
layers on a `spectool worker`, on loopback and behind a proxy that adds network latency.

    pip install -e ".[test,bench]"          # with CMAKE_ARGS="-DGGML_RPC=on", as the README installs
    python benchmarks/rpc_bench.py            # about 5 minutes on 2 cores

A worker process (`spectool worker`, all threads) holds F16 Gemma 3 270M; the client process keeps the draft
(Q4_K_M) local, as `spectool run --rpc` does. Between them sits nothing (loopback), or a small TCP proxy that
delays every chunk by the given latency each way, in order, as a LAN or Wi-Fi hop would. Every plain step of the
target pays the round trips of one llama_decode; a verified batch of k draft tokens pays them once for k tokens,
so the speedup of speculation should grow with latency. Greedy, code editing (HumanEval), the same prompts and
token budget for every contender; decode speed timed as `spectool bench` times it (first token out to last), and
every speculative output is checked against plain decoding's.
"""

from __future__ import annotations

import argparse
import json
import queue
import socket
import subprocess
import sys
import threading
import time

CONTENDERS = [("plain", "none", 8), ("lookup", "lookup", 32), ("draft", "draft", 8)]


class DelayProxy:
    """127.0.0.1:port -> upstream, every chunk delivered `delay` seconds after it arrived, order kept."""

    def __init__(self, upstream: tuple[str, int], delay: float):
        self.upstream, self.delay = upstream, delay
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.server.accept()
            up = socket.create_connection(self.upstream)
            for s in (client, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._pipe(client, up)
            self._pipe(up, client)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        q: queue.Queue = queue.Queue()

        def read():
            try:
                while data := src.recv(1 << 16):
                    q.put((time.perf_counter() + self.delay, data))
            except OSError:
                pass
            q.put((0.0, b""))

        def write():
            while True:
                due, data = q.get()
                if not data:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()


def child(args) -> None:
    """One client process (RPC devices are registered per process): load, run the contenders, print JSON."""
    import contextlib

    from spectool import bench
    from spectool.bench import Contender
    from spectool.session import Options, load_models, resolve_models
    from spectool_lab import common
    from spectool_lab.common import models

    m = models()
    o = Options(model=str(m["F16"]), model_draft=str(m["Q4_K_M"]), rpc=args.rpc, threads=args.threads,
                gpu_layers="auto" if args.rpc else 0, ctx_size=2048)
    with contextlib.ExitStack() as stack:
        loaded = load_models(o, stack, resolve_models(o), want_draft=True)
        target, draft = loaded.target, loaded.draft
        texts = common.chosen(next(iter(common.SETS)), args.prompts, args, args.seed)
        prompts = [target.tokenize(t) for t in texts]
        contenders = [Contender(name, mode, k) for name, mode, k in CONTENDERS]
        bench.run(target, {0: (draft, None)}, prompts[:1], contenders, 16)  # warm up both machines
        results = bench.run(target, {0: (draft, None)}, prompts, contenders, args.tokens)
        print(json.dumps({"offload": target.offload(), "results": [r.to_json() for r in results]}))


def start_worker(threads: int) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "spectool", "worker", "--port", str(port), "-t", str(threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the worker did not start")


def measure(args, rpc: str | None) -> dict:
    cmd = [sys.executable, __file__, "--child", "--prompts", str(args.prompts), "--tokens", str(args.tokens),
           "--threads", str(args.threads), "--seed", str(args.seed)] + (["--rpc", rpc] if rpc else []) + (
               ["--tuning"] if args.tuning else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--latency", default="0,1,4", help="one-way latencies in ms (0: plain loopback)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rpc", help=argparse.SUPPRESS)
    from spectool_lab import common

    common.sample_options(ap)
    args = ap.parse_args()
    if args.child:
        return child(args)
    args.seed = common.fresh_seed(args.seed)
    rows = [("local (no RPC)", measure(args, None))]
    worker, port = start_worker(args.threads)
    try:
        for ms in (float(x) for x in args.latency.split(",")):
            endpoint = port if ms == 0 else DelayProxy(("127.0.0.1", port), ms / 1000).port
            label = "loopback" if ms == 0 else f"+{ms:g} ms each way"
            rows.append((label, measure(args, f"127.0.0.1:{endpoint}")))
            print(f"  {label} done", file=sys.stderr, flush=True)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    print(f"\nF16 Gemma 3 270M on a `spectool worker` ({args.threads} threads), Q4_K_M draft local; code editing "
          f"(HumanEval), {args.prompts} prompts ({'the tuning list' if args.tuning else f'unseen, --seed {args.seed}'}), "
          f"{args.tokens} tokens, greedy\n")
    print("| link | plain tok/s | lookup tok/s | lookup speedup | draft tok/s | draft speedup | identical |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for label, r in rows:
        by = {x["contender"]: x for x in r["results"]}
        same = min(x["identical"] for x in r["results"])
        print(f"| {label} | {by['plain']['tokens_per_second']:.1f} | {by['lookup']['tokens_per_second']:.1f} | "
              f"{by['lookup']['speedup']:.2f}x | {by['draft']['tokens_per_second']:.1f} | "
              f"{by['draft']['speedup']:.2f}x | {same}/{args.prompts} |")


if __name__ == "__main__":
    main()
