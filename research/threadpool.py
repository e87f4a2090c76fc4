"""What llama.cpp's threads cost between decodes: a pool made for each graph, as llama-cpp-python's contexts run, or
one pool kept for the context, as llama.cpp's own tools (common.cpp's common_threadpools, polling 50) run.

    python research/threadpool.py [--models smollm2,gemma-f16] [--rounds 8] [--threads 2]

Without a pool attached, ggml's CPU backend creates and joins its worker threads at every graph it computes
(ggml-cpu.c, `disposable_threadpool`), where ggml is built without OpenMP; built with it (llama-cpp-python's wheel
here: libggml-cpu links libgomp), OpenMP keeps a team per calling thread and the three ways run alike.
For each model and each way (none: a pool per graph; poll 50: llama.cpp's tools' pool; poll 0: a kept pool whose
workers sleep between graphs), a round is what a generation asks after a
300-token prompt: 64 one-token steps, each followed by the greedy pick in numpy, and 16 verifications of 8 tokens,
rolled back. The ways take turns round by round (each round's order rotated) so that the machine's drift falls on
all of them. Prints the mean ms of a one-token step and of a verification, and each way's range over its rounds.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (spectool/llama/native.py)
import numpy as np  # noqa: E402

from spectool_lab import common  # noqa: E402

from spectool import attention  # noqa: E402
from spectool.llama import engine  # noqa: E402

STEPS, CHECKS, PROMPT = 64, 16, 300


class PoolParams(ctypes.Structure):
    """ggml.h's struct ggml_threadpool_params."""

    _fields_ = [("cpumask", ctypes.c_bool * 512), ("n_threads", ctypes.c_int), ("prio", ctypes.c_int),
                ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


def cpu_call(name: str, restype, argtypes):
    """One of the CPU backend's calls, found as common.cpp finds them (the registry's proc address)."""
    from llama_cpp._ggml import libggml

    libggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    libggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    libggml.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    libggml.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    libggml.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    libggml.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    reg = libggml.ggml_backend_dev_backend_reg(libggml.ggml_backend_dev_by_type(0))  # 0: the CPU
    return ctypes.CFUNCTYPE(restype, *argtypes)(libggml.ggml_backend_reg_get_proc_address(reg, name.encode()))


def attach(m: engine.Model, poll: int | None):
    """Attach a kept pool of m's threads polling `poll` (None: detach, a pool per graph); the pool, to free."""
    lib = m.lib.llama_cpp._lib
    lib.llama_attach_threadpool.argtypes = [ctypes.c_void_p] * 3
    lib.llama_detach_threadpool.argtypes = [ctypes.c_void_p]
    lib.llama_detach_threadpool(m.llama_context)
    if poll is None:
        return None
    params = PoolParams(n_threads=m.n_threads, prio=0, poll=poll)
    pool = cpu_call("ggml_threadpool_new", ctypes.c_void_p, [ctypes.POINTER(PoolParams)])(ctypes.byref(params))
    lib.llama_attach_threadpool(m.llama_context, pool, None)
    return pool


def round_ms(m: engine.Model, prompt: list[int], steps: int = STEPS, checks: int = CHECKS) -> tuple[float, float]:
    """(ms of a one-token step with its greedy pick, ms of a verification of 8) over one round of `steps` steps and
    `checks` verifications."""
    m.rollback(len(prompt))
    tok = prompt[-1]
    t0 = time.perf_counter()
    for _ in range(steps):
        m.eval([tok], logits="last")
        tok = int(np.argmax(m.logits()))
    step = (time.perf_counter() - t0) / steps
    m.rollback(len(prompt))
    t0 = time.perf_counter()
    for _ in range(checks):
        m.eval(prompt[-8:], logits="all")
        m.rollback(len(prompt))
    return 1000 * step, 1000 * (time.perf_counter() - t0) / checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma-f16")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine.set_verbose(False)
    free = cpu_call("ggml_threadpool_free", None, [ctypes.c_void_p])
    ways = {"a pool per graph": None, "kept, poll 50": 50, "kept, poll 0": 0}
    print(f"{common.machine(args.threads)}; {args.rounds} rounds a way, taking turns\n")
    print("| model | threads | one-token step ms (range) | verification of 8 ms (range) |")
    print("|---|---|---:|---:|")
    for name in args.models.split(","):
        path = common.real_model(name)
        with engine.Model(path, n_ctx=1024, n_threads=args.threads,
                          flash_attn=attention.chosen(path, args.threads, 0)) as m:
            prompt = [t % m.n_vocab for t in range(1000, 1000 + PROMPT)]
            m.sync(prompt, logits="none")
            got: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
            for r in range(args.rounds):
                order = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]
                for way in order:
                    pool = attach(m, ways[way])
                    got[way].append(round_ms(m, prompt))
                    attach(m, None)
                    if pool:
                        free(pool)
            for way, rows in got.items():
                cells = []
                for i in (0, 1):
                    xs = [row[i] for row in rows]
                    mean = statistics.mean(xs)
                    cells.append(f"{mean:.2f} ({100 * (max(xs) - min(xs)) / mean:.1f}%)")
                print(f"| {name} | {way} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
