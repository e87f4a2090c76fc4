"""Which attention kernel the target runs on a CPU: llama.cpp's flash attention or its plain one,
whichever this machine runs faster, measured once per model and machine and kept.

llama.cpp turns flash attention on wherever the backend supports it (`-fa auto`), the CPU included.
On a CPU it is not always the faster: on a 2-core Xeon (AVX-512), SmolLM2 135M decoded one token
after 1,024 of context in 21.9 ms with it and 13.8 ms without, and a batch of 16 (a verification)
in 242 ms against 84, while Gemma 3 270M F16 ran 4-6% faster with it
(research/notes/2026-12-06-attention.md). It also makes a batch's price grow with the context, so
that a cost table keyed by batch size mixes shapes. So on a CPU, `--flash-attn auto` times both
kernels on PROBE tokens of context (a decode of one token and one of a verification's batch, a few
times each) and keeps flash attention unless the plain kernel is faster by more than MARGIN.
Where layers go to a GPU or a worker, llama.cpp decides, as it does on them.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from spectool.cost_files import cpu_name
from spectool.llama import engine, native
from spectool.models.store import cache_dir, file_tag, write_json_atomic

PROBE = 512  # tokens of context the kernels are timed after
BATCHES = (1, 8)  # a plain step and a verification, timed at that context ...
TIMES = 3  # ... this many times each, the median kept
MARGIN = 0.05  # how much faster the plain kernel must be to be chosen over llama.cpp's default


def chosen(path: str | os.PathLike, threads: int | None, gpu_layers: int | str,
           asked: str = "auto") -> bool | None:
    """The `flash_attn` to load the target at `path` with: `asked` on or off as said; auto, where
    its layers stay on the CPU, the faster kernel (kept in SPECTOOL_CACHE/attention/ and measured
    only once), else None (llama.cpp's default)."""
    if asked != "auto":
        return asked == "on"
    ngl, usable = engine.resolve_gpu_layers(gpu_layers)
    if ngl != 0 and usable:
        return None
    path = engine.check_gguf_file(path)  # the loader's one-line errors for a bad path, first
    where = _cache_path(path, threads)
    try:
        return bool(json.loads(where.read_text())["flash_attn"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none kept yet, or damaged: measured again
    seconds = native.on_a_thread_of_its_own(  # (its OpenMP threads end with it)
        lambda: {fa: decode_seconds(path, threads, fa) for fa in (True, False)})
    flash = faster(seconds)
    where.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(where, {"flash_attn": flash,
                              "seconds": {str(fa).lower(): s for fa, s in seconds.items()}})
    return flash


def faster(seconds: dict[bool, float]) -> bool:
    """Whether to run flash attention, from what a decode cost with it (True) and without (False):
    yes unless the plain kernel was faster by more than MARGIN."""
    return seconds[False] * (1 + MARGIN) >= seconds[True]


def decode_seconds(path: str | os.PathLike, threads: int | None, flash_attn: bool) -> float:
    """What a decode of each of BATCHES costs after PROBE tokens of context, summed (the median of
    TIMES each), with flash attention on or off, on the CPU."""
    with engine.Model(path, n_ctx=PROBE + max(BATCHES), n_threads=threads, n_gpu_layers=0,
                      flash_attn=flash_attn) as m:
        x = [t % m.n_vocab for t in range(1000, 1000 + PROBE)]  # any tokens: attention is the cost
        m.sync(x, logits="none")
        total = 0.0
        for b in BATCHES:
            samples = []
            for _ in range(TIMES):
                t0 = time.perf_counter()
                m.eval(x[:b], logits="all")
                samples.append(time.perf_counter() - t0)
                m.rollback(PROBE)
            total += sorted(samples)[TIMES // 2]
        return total


def _cache_path(path: str | os.PathLike, threads: int | None) -> Path:
    tag = file_tag(path, threads, engine.backend_info(), platform.machine(), os.cpu_count(),
                   cpu_name())
    return cache_dir("attention") / f"{Path(path).stem}-{tag}.json"
