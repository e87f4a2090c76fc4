"""What a decode costs with llama.cpp's flash attention and without it, on this CPU, by context and batch size.

    python research/attention_cost.py [--models smollm2,gemma-f16] [--contexts 32,128,512,1024,2048,3000]
                                      [--threads 2]

For each model and kernel: the context filled to each length, then a decode of 1, 2, 4, 8 and 16 tokens (a plain
step and verifications), 5 times each, rolled back; prints the median in ms and each batch's cost over one token's.
Two things a cost table keyed by batch size alone needs from this machine: which kernel is faster
(spectool/attention.py picks it at PROBE tokens), and whether a batch's cost relative to one token stays put
as the context grows (the controller decides by relative prices only).
"""

from __future__ import annotations

import argparse
import time

from spectool_lab import common

from spectool.llama import engine
from spectool.llama.outputs import IDS
from spectool.options import CTX_SIZE

SIZES = (1, 2, 4, 8, 16)


def costs(m: engine.Model, n: int, times: int = 5) -> list[float]:
    """Median seconds of a decode of each of SIZES after n tokens of context."""
    x = [t % m.n_vocab for t in range(1000, 1000 + n)]
    m.sync(x[:-1], logits="none")
    out = []
    for b in SIZES:
        samples = []
        for _ in range(times):
            t0 = time.perf_counter()
            m.eval([x[-1]] * b, logits="all", output=IDS)
            samples.append(time.perf_counter() - t0)
            m.rollback(n - 1)
        out.append(sorted(samples)[times // 2])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma-f16")
    ap.add_argument("--contexts", default="32,128,512,1024,2048,3000")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine.set_verbose(False)
    print(f"{common.machine(args.threads)}; median of 5 decodes each\n")
    print("| model | flash attention | context | 1 token | " + " | ".join(f"{b} tokens / 1" for b in SIZES[1:])
          + " |")
    print("|---|---|---:|---:|" + "---:|" * (len(SIZES) - 1))
    for name in args.models.split(","):
        for flash in (True, False):
            with engine.Model(common.real_model(name), n_ctx=CTX_SIZE, n_threads=args.threads,
                              flash_attn=flash) as m:
                for n in map(int, args.contexts.split(",")):
                    if n + SIZES[-1] > m.n_ctx:
                        break
                    c = costs(m, n)
                    print(f"| {name} | {'on' if flash else 'off'} | {n} | {1e3 * c[0]:.1f} ms | "
                          + " | ".join(f"{x / c[0]:.2f}" for x in c[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
