"""A model file re-quantized with llama.cpp's own quantizer (llama_model_quantize): the F16 and F32
variants of the demo model that the tests and benchmarks measure exactness and speed on."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from spectool.llama import native
from spectool.llama.engine import EngineError, check_gguf_file, last_log_error


def quantize(src: str | os.PathLike, dst: str | os.PathLike, ftype: str, *,
             threads: int | None = None) -> Path:
    """Write `src` re-quantized to `ftype` ("F32", "F16", "Q8_0", "Q4_K_M"...) at `dst`,
    atomically."""
    lib = native.lib()
    code = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if ftype.upper() == "F32":
        code = lib.LLAMA_FTYPE_ALL_F32
    if code is None:
        raise EngineError(f"unknown quantization type {ftype!r}")
    src, dst = check_gguf_file(src), Path(dst)
    tmp = dst.with_name(dst.name + ".part")
    params = lib.llama_model_quantize_default_params()
    params.ftype = code
    params.allow_requantize = True
    params.nthread = threads or (os.cpu_count() or 1)
    rc = lib.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise EngineError(f"quantizing {src.name} to {ftype} failed: {last_log_error()}")
    os.replace(tmp, dst)
    return dst
