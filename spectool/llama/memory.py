"""What to tell the user when a model or its context does not fit in memory: how much was asked and
free, and what to try (fewer -ngl layers, a smaller -c)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from spectool.llama.devices import Device
from spectool.llama.native import DoesNotFit, ModelLoadError, last_log_error, lib, recent_log
from spectool.llama.vocab import meta_value


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
