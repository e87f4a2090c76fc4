"""llama.cpp's shared libraries, loaded before numpy's; its log, backend facts, the engine's errors,
and llama-cpp-python's own `Llama` as the benchmarks' baseline.

Every spectool module that imports numpy imports this one first, so that whichever way a program
comes in (the command line, `serve`, `worker`, the benchmarks, `import spectool.core.verify` from a
script) llama.cpp's libraries are mapped before numpy's. On an NVIDIA H200 (CUDA 13, numpy 2.5.2
with scipy-openblas 0.3.34) a process that had imported numpy first segfaulted inside
`llama_model_load_from_file` on every load, `-ngl 0` included, while the other order worked. `import
llama_cpp` gives the working order: its first module loads libllama and libggml*
(llama_cpp/llama_cpp.py) before its second imports numpy (llama_cpp/llama.py).

`spectool --help` imports neither. A program of your own that imports numpy before spectool should
import `spectool.llama.native` (or `llama_cpp`) before numpy (README, Troubleshooting).
"""


import collections
import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import llama_cpp  # noqa: F401 - the import is the point (before numpy)


T = TypeVar("T")


class EngineError(Exception):
    """Base class for errors raised by the engine; the message is meant for the user."""


class ModelLoadError(EngineError):
    """A model file is missing, not GGUF, truncated, or of an unsupported kind."""


class DoesNotFit(ModelLoadError):
    """The weights offloaded to a device did not fit its memory."""


class DecodeError(EngineError):
    """llama_decode failed (no KV slot, out of memory, aborted)."""


# --------------------------------------------------------------------------------------------------
# llama.cpp library: one-time backend init, log routing, a Ctrl-C that arrived inside llama.cpp


_LOCK = threading.Lock()
_STATE: dict = {"lib": None, "callback": None, "verbose": False}
_RECENT_LOG: collections.deque[str] = collections.deque(maxlen=40)


def set_verbose(verbose: bool) -> None:
    """Show llama.cpp's own log on stderr (for --debug); silent otherwise."""
    _STATE["verbose"] = verbose
    lib()


def verbose() -> bool:
    """Whether llama.cpp's log goes to stderr (set_verbose)."""
    return _STATE["verbose"]


def _on_log(level: int, text: bytes, _user_data) -> None:
    try:
        line = text.decode("utf-8", errors="replace") if text else ""
        _RECENT_LOG.append(line)
        if _STATE["verbose"]:
            os.write(2, line.encode())
    # Ctrl-C while llama.cpp was logging: it cannot cross llama.cpp's frames (ctypes
    except KeyboardInterrupt:
        # would print it and drop it), so it is raised once llama.cpp returns
        Interrupt.pending = True


class Interrupt:
    """A Ctrl-C that arrived inside a call into llama.cpp (see _on_log), not raised yet: `pending`
    is a plain attribute, so that Model.eval reads it after every decode without a call."""

    pending = False


def on_a_thread_of_its_own(fn: Callable[[], T]) -> T:
    """`fn()` run on a thread that ends when it returns: its result, or its exception raised here.
    For decodes outside a process's generating thread (a probe, a ranking): llama.cpp's CPU backend
    runs on OpenMP threads, a team per thread that decodes, kept until that thread ends. While a
    thread that decoded once lives beside the one generating, libgomp counts more threads than cores
    and has every team sleep between decodes: SmolLM2 on 2 cores decoded a token in 31 ms instead of
    12 for as long as it lived (research/notes/2026-12-06-run-to-run.md)."""
    with ThreadPoolExecutor(1, thread_name_prefix="spectool-probe") as pool:  # joined at the end
        return pool.submit(fn).result()


def take_interrupt() -> bool:
    """Whether a Ctrl-C arrived inside a call into llama.cpp since the last ask; clears it."""
    pending, Interrupt.pending = Interrupt.pending, False
    return pending


def raise_pending_interrupt() -> None:
    """Raise the Ctrl-C that arrived inside a call into llama.cpp, if one did."""
    if take_interrupt():
        raise KeyboardInterrupt


def lib():
    """llama_cpp, its log routed through ours and its backend initialised (once)."""
    if _STATE["lib"] is not None:
        return _STATE["lib"]
    with _LOCK:
        if _STATE["lib"] is None:
            callback = llama_cpp.llama_log_callback(_on_log)
            _STATE["callback"] = callback  # keep a reference: ctypes would free it
            llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _STATE["lib"] = llama_cpp
    return _STATE["lib"]


def bind(name: str, restype, argtypes):
    """A ctypes binding of our own to libllama's `name`, beside llama_cpp's (which converts every
    argument and result through its declared types): for a call on the hot path with arguments made
    once."""
    fn = lib().llama_cpp._lib[name]
    fn.restype, fn.argtypes = restype, argtypes
    return fn


# llama-ext.h's calls that llama_cpp_ext does not bind, for drafters/eagle3.py: llama.cpp exports
# them without extern "C", so by their C++ (Itanium) names on Linux and macOS
EXT_SYMBOLS = {
    "llama_model_target_layer_ids": "_Z28llama_model_target_layer_idsPK11llama_model",
    "llama_model_target_layer_ids_n": "_Z30llama_model_target_layer_ids_nPK11llama_model",
    "llama_set_embeddings_layer_inp": "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
    "llama_get_embeddings_layer_inp": "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
}


def bind_ext(name: str, restype, argtypes):
    """`bind` for one of EXT_SYMBOLS, under its C name or its C++ one, whichever the library has."""
    for symbol in (name, EXT_SYMBOLS[name]):
        try:
            return bind(symbol, restype, argtypes)
        except AttributeError:
            continue
    raise AttributeError(f"this llama.cpp build has no {name}")


def clear_log() -> None:
    """Forget the recent log, so that recent_log() says what the next call logs."""
    _RECENT_LOG.clear()


def recent_log() -> str:
    """llama.cpp's last 40 log lines, joined (for error messages)."""
    return " ".join(_RECENT_LOG)


def last_log_error() -> str:
    """The most telling line llama.cpp logged recently (for error messages), without its function
    prefix."""
    lines = [ln.strip() for ln in _RECENT_LOG if ln.strip()]
    for words in (("error",), ("failed", "unknown", "invalid", "unsupported", "truncat")):
        for line in reversed(lines):
            if any(w in line.lower() for w in words):
                return line.split("error loading model: ")[-1]
    return lines[-1] if lines else ""


def backend_info() -> dict:
    """Which backend llama.cpp was built with, and whether it can offload to a GPU."""
    llama = lib()
    return {
        "gpu_offload": bool(llama.llama_supports_gpu_offload()),
        "rpc": bool(llama.llama_supports_rpc()),
        "system_info": llama.llama_print_system_info().decode("utf-8", errors="replace").strip(),
        "llama_cpp_python": getattr(llama, "__version__", "?"),
    }


def avoid_amx() -> bool:
    """Whether to keep llama.cpp off its AMX kernels. On an Intel Sapphire Rapids VM (AMX_INT8 in
    llama.cpp's system info) the AMX matmul of llama-cpp-python 0.3.36 dies with SIGILL at its first
    `tilezero` on Gemma 3 270M Q4_K_M, on every run, while a plain C program's AMX tiles work on the
    same machine. AMX weights live in llama.cpp's "extra" buffer types, so a model loaded without
    them (`use_extra_bufts = False`, which also skips the repacked CPU layouts) never reaches that
    code. SPECTOOL_AMX=1 lets llama.cpp use AMX again."""
    if os.environ.get("SPECTOOL_AMX") == "1":
        return False
    return "AMX_INT8 = 1" in backend_info()["system_info"]




def reference_llama(path, **kwargs):
    """llama-cpp-python's own high-level `Llama(path, **kwargs)`, the baseline the benchmarks
    compare against, loaded with the buffer types `Model` loads with (avoid_amx); llama.cpp's log is
    routed through ours again afterwards (`Llama` takes it over)."""
    from llama_cpp import llama as high

    llama, default_params = lib(), high.llama_cpp.llama_model_default_params

    def params():
        p = default_params()
        p.use_extra_bufts = not avoid_amx()
        return p

    # where `Llama` takes its model parameters from
    high.llama_cpp.llama_model_default_params = params
    try:
        return high.Llama(str(path), **kwargs)
    finally:
        high.llama_cpp.llama_model_default_params = default_params
        llama.llama_log_set(_STATE["callback"], ctypes.c_void_p(0))
