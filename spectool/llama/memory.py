"""What to tell the user when a model or its context does not fit in memory: how much was asked and
free, and what to try (fewer -ngl layers, a smaller -c); and the context that fits (-c 0)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from spectool.llama.devices import Device
from spectool.llama.native import DoesNotFit, ModelLoadError, last_log_error, lib, recent_log
from spectool.llama.vocab import meta_value


# -c 0's context: the trained one, unless its KV cache would take more than this share of the memory
# free where it goes (the rest: compute buffers, a draft model's cache, the corpus); never less than
# FLOOR tokens, the context -c defaulted to (a smaller one fails as a -c that does not fit fails)
KV_SHARE, FLOOR = 0.5, 4096


def kv_bytes_per_token(lib, model) -> int:
    """What one token of context costs in the KV cache: K and V, f16, in every layer (sliding-window
    layers counted whole: an upper bound)."""
    arch = meta_value(lib, model, "general.architecture")
    n_head = max(1, lib.llama_model_n_head(model))
    head_k = int(meta_value(lib, model, f"{arch}.attention.key_length")
                 or lib.llama_model_n_embd(model) // n_head)
    head_v = int(meta_value(lib, model, f"{arch}.attention.value_length") or head_k)
    return 2 * lib.llama_model_n_layer(model) * lib.llama_model_n_head_kv(model) * (head_k + head_v)


def free_bytes(usable: Sequence[Device]) -> int:
    """The memory free now on `usable` (the devices the layers went to), or in RAM (none)."""
    if usable:
        from spectool.llama.devices import devices

        handles = {d.handle for d in usable}
        return sum(d.free for d in devices() if d.handle in handles)
    meminfo = Path("/proc/meminfo")  # (Linux: what can be had without swapping, caches included)
    found = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo.read_text(), re.M) if (
        meminfo.exists()) else None
    return int(found[1]) * 1024 if found else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf(
        "SC_PAGE_SIZE")


def context_that_fits(lib, model, usable: Sequence[Device], n_seq: int = 1) -> int:
    """-c 0: the model's trained context for each of `n_seq` sequences (--parallel) where their KV
    cache takes at most KV_SHARE of the memory free where it goes, else the most that does (a
    multiple of 256), at least FLOOR tokens in all."""
    trained = int(lib.llama_model_n_ctx_train(model)) * n_seq
    fits = int(KV_SHARE * free_bytes(usable)) // max(1, kv_bytes_per_token(lib, model))
    return min(trained, max(FLOOR, fits // 256 * 256))


def metadata_kv_shape(lib, model) -> tuple[int, int] | None:
    """kv_bytes_per_token and the layers, read from the metadata of a model loaded vocab-only (whose
    hparams llama.cpp leaves unset); None where a count is not one number (per-layer heads)."""
    arch = meta_value(lib, model, "general.architecture")
    try:
        n_layer, n_head, n_embd = (int(meta_value(lib, model, f"{arch}.{key}") or 0) for key in (
            "block_count", "attention.head_count", "embedding_length"))
        n_head_kv = int(meta_value(lib, model, f"{arch}.attention.head_count_kv") or n_head)
        head_k = int(meta_value(lib, model, f"{arch}.attention.key_length")
                     or n_embd // max(1, n_head))
        head_v = int(meta_value(lib, model, f"{arch}.attention.value_length") or head_k)
    except ValueError:
        return None
    return 2 * n_layer * n_head_kv * (head_k + head_v), n_layer


def check_kv_fits(path: Path, n_ctx: int, n_seq: int, usable: Sequence[Device], ngl: int) -> None:
    """Before the weights load (the file's metadata only), for several sequences (--parallel) of a
    context of `n_ctx` tokens (-c; 0: context_that_fits, later): DoesNotFit, one line, where their
    KV cache is more than the memory free where it goes (the offloaded layers' share on `usable`,
    as `ngl` says, the rest in RAM). Unchecked where the metadata cannot be read: loading says
    why."""
    if n_seq > 1 and n_ctx > 0 and (full := kv_does_not_fit(path, n_ctx, n_seq, usable, ngl)):
        raise full


def kv_does_not_fit(path: Path, n_ctx: int, n_seq: int, usable: Sequence[Device],
                    ngl: int) -> DoesNotFit | None:
    """check_kv_fits's answer: the error where the KV cache does not fit, else None."""
    llama = lib()
    mparams = llama.llama_model_default_params()
    mparams.vocab_only = True
    model = llama.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        return None
    try:
        shape = metadata_kv_shape(llama, model)
    finally:
        llama.llama_model_free(model)
    if shape is None:
        return None
    per_token, n_layer = shape
    need = n_ctx * per_token
    offloaded = 0 if not usable else n_layer if ngl < 0 else min(ngl, n_layer)
    for layers, where in ((offloaded, usable), (n_layer - offloaded, ())):
        part, free = need * layers // max(1, n_layer), free_bytes(where)
        if part > free:
            name = ", ".join(d.name for d in where) or "RAM"
            return DoesNotFit(f"{n_seq} sequences of {n_ctx // n_seq} tokens (-c {n_ctx}, "
                              f"--parallel {n_seq}) need a KV cache of {part >> 20} MiB in {name} "
                              f"for {path.name}, which has {free >> 20} MiB free: try a smaller "
                              "-c or --parallel")
    return None


def ran_out_of_memory() -> bool:
    """Whether llama.cpp's recent log says an allocation failed."""
    log = recent_log().lower()
    return "alloc" in log or "out of memory" in log


def weights_do_not_fit(path: Path, usable: Sequence[Device], ngl: int) -> DoesNotFit:
    """The one-line answer to an offload of `ngl` layers (negative: all) of the model at `path` that
    ran out of device memory: how much was free, and a number of layers that should fit (the free
    share of the file, less a tenth for the context; fewer than failed)."""
    llama = lib()
    mparams = llama.llama_model_default_params()
    mparams.vocab_only = True  # the metadata only
    model = llama.llama_model_load_from_file(str(path).encode(), mparams)
    n_layer = 0
    if model:
        n_layer = int(meta_value(llama, model,
                                 f"{meta_value(llama, model, 'general.architecture')}.block_count")
                      or 0)
        llama.llama_model_free(model)
    free, size = sum(d.free for d in usable), path.stat().st_size
    tried = n_layer + 1 if ngl < 0 else ngl
    fit = max(0, min(tried - 1, int(0.9 * n_layer * free / size) if size else 0))
    where = ", ".join(d.name for d in usable)
    return DoesNotFit(f"{path.name} ({size >> 20} MiB) does not fit {where} ({free >> 20} MiB "
                      f"free): try -ngl {fit} (of its {n_layer} layers), or -ngl 0 for the CPU")


def no_context(path: Path, n_ctx: int, usable: Sequence[Device]) -> ModelLoadError:
    """Why llama.cpp made no context of `n_ctx` tokens (read from its recent log): where an
    allocation failed (a KV cache too large for -c), how much it wanted and how much memory was free
    on `usable` (none: RAM)."""
    log = recent_log()
    wanted = re.search(r"failed to allocate (?:\S+ )?buffer of size (\d+)", log)
    if not wanted:
        return ModelLoadError(f"llama.cpp could not create a context of {n_ctx} tokens for "
                              f"{path.name}: {last_log_error() or 'out of memory?'}")
    what = "its KV cache" if "kv cache" in log.lower() else "its buffers"
    if usable:
        where, free = ", ".join(d.name for d in usable), sum(d.free for d in usable)
    else:
        where, free = "RAM", os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return DoesNotFit(f"a context of {n_ctx} tokens for {path.name} does not fit: {what} needs "
                      f"{int(wanted[1]) >> 20} MiB and {where} has {free >> 20} MiB free; try a "
                      "smaller -c/--ctx-size")
