"""Which attention kernel the target runs on a CPU: llama.cpp's flash attention or its plain one,
whichever this machine runs faster, measured once per model and machine and kept.

llama.cpp turns flash attention on wherever the backend supports it (`-fa auto`), the CPU included.
On a CPU it is not always the faster: on a 2-core Xeon (AVX-512), SmolLM2 135M decoded one token
after 1,024 of context in 21.9 ms with it and 13.8 ms without, and a batch of 16 (a verification)
in 242 ms against 84, while Gemma 3 270M F16 ran 4-6% faster with it
(research/notes/2026-12-06-attention.md). It also makes a batch's price grow with the context, so
that a cost table keyed by batch size mixes shapes. So on a CPU, `--flash-attn auto` times both
kernels on PROBE tokens of context (decodes of one token and of a verification's batch, on one
load, in turn) and keeps flash attention unless the plain kernel is faster by more than a margin:
over both decodes where the model verifies drafts, over the one-token decode where it decodes a
token a step (`--spec none`, a draft model).
Where layers go to a GPU or a worker, llama.cpp decides, as it does on them.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

from spectool.cost_files import cpu_name
from spectool.llama import engine, native
from spectool.models.store import cache_dir, file_tag, write_json_atomic

PROBE = 512  # tokens of context the kernels are timed after
BATCHES = (1, 8)  # a plain step and a verification, timed at that context ...
ROUNDS, RUN = 3, 4  # ... ROUNDS rounds of RUN decodes, the kernels in turn, the medians kept
# how much faster the plain kernel must be to be chosen over llama.cpp's default. For a model that
# verifies drafts, by any margin over both decodes: on a 2-core EPYC the probe had them 2-16% faster
# without flash attention and spectool's lookup ran 2-5% faster without it. For one that decodes a
# token a step (--spec none, a draft model), by STEP_MARGIN over the one-token decode: there the
# probe moved 5% either way between runs while a generation ran 0-7% faster with flash attention,
# on average (research/notes/2026-12-07-kernel-choice.md); SmolLM2 on a 2-core Xeon, 1.3x faster
# without it at 512 tokens of context, is still caught.
MARGIN, STEP_MARGIN = 0.0, 0.15
# the measurement's version, in the kept file's name: a choice an older one kept is measured again
# (1 timed one load's kernel after the other's and kept one choice for every mode)
METHOD = 2

Seconds = dict[bool, dict[int, float]]  # flash attention on or off -> batch -> seconds a decode


def chosen(path: str | os.PathLike, threads: int | None, gpu_layers: int | str,
           asked: str = "auto", plain: bool = False) -> bool | None:
    """The `flash_attn` to load the model at `path` with: `asked` on or off as said; auto, where
    its layers stay on the CPU, the faster kernel for what it will decode (`plain`: a token a step)
    from decodes timed once and kept in SPECTOOL_CACHE/attention/, else None (llama.cpp's
    default)."""
    if asked != "auto":
        return asked == "on"
    ngl, usable = engine.resolve_gpu_layers(gpu_layers)
    if ngl != 0 and usable:
        return None
    path = engine.check_gguf_file(path)  # the loader's one-line errors for a bad path, first
    where = _cache_path(path, threads)
    try:
        seconds = kept(json.loads(where.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none kept, or damaged
        seconds = native.on_a_thread_of_its_own(  # (its OpenMP threads end with it)
            lambda: kernel_seconds(path, threads))
        where.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(where, {"seconds": {str(fa).lower(): {str(b): t for b, t in by.items()}
                                              for fa, by in seconds.items()}})
    return faster(seconds, plain)


def kept(saved: dict) -> Seconds:
    """The seconds a file in SPECTOOL_CACHE/attention/ keeps."""
    return {fa: {b: float(saved["seconds"][str(fa).lower()][str(b)]) for b in BATCHES}
            for fa in (True, False)}


def faster(seconds: Seconds, plain: bool = False) -> bool:
    """Whether to run flash attention, from what each decode cost with it (True) and without
    (False): yes unless the plain kernel was faster (by more than MARGIN) over both decodes, or
    with `plain` by more than STEP_MARGIN over the one-token decode."""
    batches, margin = ((1,), STEP_MARGIN) if plain else (BATCHES, MARGIN)
    on, off = (sum(seconds[fa][b] for b in batches) for fa in (True, False))
    return off * (1 + margin) >= on


def kernel_seconds(path: str | os.PathLike, threads: int | None) -> Seconds:
    """What a decode of each of BATCHES costs after PROBE tokens of context with flash attention
    on (True) and off (False), on the CPU: two contexts on one load of the weights, each decoding
    RUN batches in a row as a generation does (the first not counted), in turn for ROUNDS rounds;
    the median of each."""
    with engine.Model(path, n_ctx=PROBE + (RUN + 1) * max(BATCHES), n_threads=threads,
                      n_gpu_layers=0, flash_attn=True) as on, on.beside(flash_attn=False) as off:
        x = [t % on.n_vocab for t in range(1000, 2000)]  # any tokens: attention is the cost
        kernels = {True: on, False: off}
        for m in kernels.values():
            m.sync(x[:PROBE], logits="none")
        samples: dict[tuple[bool, int], list[float]] = {(fa, b): [] for fa in kernels
                                                         for b in BATCHES}
        for i in range(ROUNDS):
            for fa in (True, False) if i % 2 else (False, True):  # neither always first
                for b in BATCHES:
                    for j in range(RUN + 1):
                        at = PROBE + j * b
                        t0 = time.perf_counter()
                        kernels[fa].eval(x[at : at + b], logits="all")
                        if j:
                            samples[fa, b].append(time.perf_counter() - t0)
                    kernels[fa].rollback(PROBE)
        return {fa: {b: statistics.median(samples[fa, b]) for b in BATCHES} for fa in kernels}


def _cache_path(path: str | os.PathLike, threads: int | None) -> Path:
    tag = file_tag(path, threads, engine.backend_info(), platform.machine(), os.cpu_count(),
                   cpu_name(), METHOD)
    return cache_dir("attention") / f"{Path(path).stem}-{tag}.json"
