"""What another thread's OpenMP team costs the thread that generates: decodes on the main thread alone, while a
second thread that decoded once is alive (idle), and after it has ended.

    python research/openmp_teams.py [--models smollm2,gemma-f16] [--threads 2]

llama-cpp-python's wheel builds ggml's CPU backend with OpenMP (libggml-cpu links libgomp), which keeps a team of
worker threads for each thread that runs a parallel region, until that thread ends. A round is 48 one-token steps,
each followed by the greedy pick, and 12 verifications of 8 tokens, after 300 tokens of context; each phase is the
median of 4 rounds. The second thread decodes 3 tokens on a model of its own, then waits.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from spectool_lab import common
from threadpool import round_ms

from spectool import attention
from spectool.llama import engine

STEPS, CHECKS, PROMPT, ROUNDS = 48, 12, 300, 4


def rounds(m: engine.Model, prompt: list[int]) -> list[tuple[float, float]]:
    return [round_ms(m, prompt, STEPS, CHECKS) for _ in range(ROUNDS)]


def phases(m: engine.Model, other: engine.Model, prompt: list[int]) -> dict[str, list[tuple[float, float]]]:
    """Each phase's rounds: alone, beside a live thread that decoded once, after that thread ended."""
    out = {"alone": rounds(m, prompt)}
    stop = threading.Event()

    def side() -> None:
        other.eval([1, 2, 3], logits="last")  # one decode on this thread: a team of its own
        stop.wait()

    thread = threading.Thread(target=side)
    thread.start()
    time.sleep(0.5)
    out["another thread's team alive"] = rounds(m, prompt)
    stop.set()
    thread.join()
    time.sleep(0.2)
    out["after it ended"] = rounds(m, prompt)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma-f16")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine.set_verbose(False)
    print(f"{common.machine(args.threads)}; the median of {ROUNDS} rounds a phase\n")
    print("| model | phase | one-token step ms | verification of 8 ms |")
    print("|---|---|---:|---:|")
    for name in args.models.split(","):
        path = common.real_model(name)
        flash = attention.chosen(path, args.threads, 0)
        with engine.Model(path, n_ctx=1024, n_threads=args.threads, flash_attn=flash) as m, \
                engine.Model(path, n_ctx=256, n_threads=args.threads, flash_attn=flash) as other:
            prompt = [t % m.n_vocab for t in range(1000, 1000 + PROMPT)]
            m.sync(prompt, logits="none")
            for phase, rounds in phases(m, other, prompt).items():
                one, eight = (statistics.median(r[i] for r in rounds) for i in (0, 1))
                print(f"| {name} | {phase} | {one:.2f} | {eight:.2f} |", flush=True)


if __name__ == "__main__":
    main()
