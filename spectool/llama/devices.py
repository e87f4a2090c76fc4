"""ggml's devices and its RPC backend, the RPC worker, and the report of what this installation can
do.

llama-cpp-python binds neither devices nor RPC, so they are bound here with ctypes, against the
libggml that llama-cpp-python loaded (dlsym on its handle also finds what libggml-base defines).
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from spectool.llama.native import EngineError, backend_info, last_log_error, lib, verbose
from spectool.llama.native import set_verbose  # noqa: F401 - re-exported

DEVICE_TYPES = ("CPU", "GPU", "IGPU", "ACCEL")  # enum ggml_backend_dev_type
REINSTALL_RPC = ('this llama-cpp-python was built without RPC; reinstall it with -DGGML_RPC=on '
                 'added to the CMAKE_ARGS of your build, e.g. CMAKE_ARGS="-DGGML_RPC=on" for the '
                 'CPU or CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=on" for CUDA: pip install '
                 '--force-reinstall --no-cache-dir llama-cpp-python')


class RpcError(EngineError):
    """An RPC worker is unreachable, or this build has no RPC backend."""


_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
# libggml bound once, the abort callback, the RPC workers
_GGML: dict = {"lib": None, "abort": None, "rpc": []}


def _ggml():
    if _GGML["lib"] is None:
        llama = lib()
        libdir = Path(llama.__file__).parent / "lib"
        path = next((libdir / n for n in ("libggml.so", "libggml.dylib", "ggml.dll")
                     if (libdir / n).exists()), None)
        g = ctypes.CDLL(str(path) if path else "libggml.so")
        p, size = ctypes.c_void_p, ctypes.c_size_t
        for name, res, args in (
            ("ggml_backend_dev_count", size, []), ("ggml_backend_dev_get", p, [size]),
            ("ggml_backend_dev_name", ctypes.c_char_p, [p]),
            ("ggml_backend_dev_description", ctypes.c_char_p, [p]),
            ("ggml_backend_dev_memory", None, [p, ctypes.POINTER(size), ctypes.POINTER(size)]),
            ("ggml_backend_dev_type", ctypes.c_int, [p]), ("ggml_backend_dev_backend_reg", p, [p]),
            ("ggml_backend_reg_name", ctypes.c_char_p, [p]),
            ("ggml_backend_reg_by_name", p, [ctypes.c_char_p]),
            ("ggml_backend_reg_get_proc_address", p, [p, ctypes.c_char_p]),
            ("ggml_backend_register", None, [p]),
            ("ggml_set_abort_callback", p, [_ABORT_CALLBACK]),
            ("ggml_version", ctypes.c_char_p, []),
            ("ggml_commit", ctypes.c_char_p, []),
        ):
            fn = getattr(g, name)
            fn.restype, fn.argtypes = res, args
        _GGML["lib"] = g
    return _GGML["lib"]


@dataclass(frozen=True)
class Device:
    """One of llama.cpp's devices: CPU, a GPU, or a remote device behind an RPC worker."""

    name: str
    description: str
    type: str  # CPU | GPU | IGPU | ACCEL
    backend: str  # CPU, CUDA, Metal, RPC, ...
    free: int  # bytes
    total: int
    handle: int = 0

    @property
    def offloads(self) -> bool:
        """Whether model layers can go here (llama.cpp offloads to GPU and integrated GPU
        devices)."""
        return self.type in ("GPU", "IGPU")

    @property
    def remote(self) -> bool:
        return self.backend == "RPC"

    def to_json(self) -> dict:
        return {"name": self.name, "description": self.description, "type": self.type,
                "backend": self.backend,
                "memory_free": self.free, "memory_total": self.total}


def devices() -> list[Device]:
    """Every device llama.cpp can use now, RPC workers that were added included."""
    g = _ggml()
    out = []
    for i in range(g.ggml_backend_dev_count()):
        d = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        kind = g.ggml_backend_dev_type(d)
        reg = g.ggml_backend_dev_backend_reg(d)
        out.append(Device(g.ggml_backend_dev_name(d).decode(),
                          (g.ggml_backend_dev_description(d) or b"").decode(),
                          DEVICE_TYPES[kind] if 0 <= kind < len(DEVICE_TYPES) else str(kind),
                          g.ggml_backend_reg_name(reg).decode() if reg else "?", free.value,
                          total.value, d))
    return out


def versions() -> dict:
    """llama-cpp-python's version, and the llama.cpp and ggml it was built from."""
    llama, g = lib(), _ggml()
    return {"llama_cpp_python": getattr(llama, "__version__", "?"),
            "llama_cpp": llama.llama_version().decode(),
            "ggml": g.ggml_version().decode(), "ggml_commit": g.ggml_commit().decode()}


def parse_gpu_layers(value: str | int) -> int | str:
    """`-ngl` as llama.cpp reads it: a number of layers, `auto` or `all` (a negative number also
    means all)."""
    text = str(value).strip().lower()
    if text in ("auto", "all"):
        return text
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"expected a number of layers, 'auto' or 'all', not {value!r}") from None
    return "all" if n < 0 else n


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """`--rpc HOST:PORT[,HOST:PORT...]`."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RpcError(f"--rpc expects HOST:PORT[,HOST:PORT...], not {item!r}")
        out.append((host.strip("[]"), int(port)))
    return out


def _unreachable(host: str, port: int, timeout: float) -> str | None:
    """Why a TCP connection to the worker does not open (None when it does)."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def _gone(host: str, port: int, probes: int = 4) -> bool:
    """Whether a worker no longer answers. A worker that was just killed can still accept a
    connection for a moment (its process closes the connection ggml used before its listening
    socket), so one answer is not taken as proof of life: it is probed again, 0.1 s apart."""
    for i in range(probes):
        if _unreachable(host, port, timeout=1.0):
            return True
        if i < probes - 1:
            time.sleep(0.1)
    return False


def _rpc_proc(name: str):
    g = _ggml()
    reg = g.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RpcError(REINSTALL_RPC)
    return g.ggml_backend_reg_get_proc_address(reg, name.encode())


def _on_abort(message: bytes) -> None:
    """ggml is about to abort(): with RPC workers in use, that is almost always a worker gone
    mid-run. Say which, in one line, keep the text written so far, and exit 1 instead of dumping
    core."""
    lost = [f"{h}:{p}" for h, p in _GGML["rpc"] if _gone(h, p)]
    # ggml's message reads "path/to/file.cpp:566: what happened"
    why = [ln.split(": ", 1)[-1] if ".c" in ln.split(": ", 1)[0] else ln
           for ln in (message or b"").decode("utf-8", errors="replace").strip().splitlines()]
    line = (f"error: lost the RPC worker {', '.join(lost)} "
            f"({why[0] if why else 'connection closed'})" if lost
            else f"error: llama.cpp aborted: {why[0] if why else '?'}")
    if verbose():
        os.write(2, (message or b"") + b"\n")
    os.write(2, (line + "\n").encode())
    exit_now(1)


def add_rpc_workers(endpoints: Sequence[tuple[str, int]]) -> None:
    """Register RPC workers as llama.cpp devices before any model loads, as llama.cpp's `--rpc`
    does. A worker that does not answer is an error naming it; a worker lost later ends the process
    with one line (_on_abort)."""
    add = ctypes.CFUNCTYPE(ctypes.c_void_p,
                           ctypes.c_char_p)(_rpc_proc("ggml_backend_rpc_add_server"))
    for host, port in endpoints:
        why = _unreachable(host, port, timeout=5.0)
        if why:
            raise RpcError(f"cannot reach the RPC worker {host}:{port} ({why}); is `spectool "
                           "worker` running there?")
    g = _ggml()
    if _GGML["abort"] is None:
        _GGML["abort"] = _ABORT_CALLBACK(_on_abort)
        g.ggml_set_abort_callback(_GGML["abort"])
    for host, port in endpoints:
        if (host, port) in _GGML["rpc"]:
            continue
        _GGML["rpc"].append((host, port))
        reg = add(f"{host}:{port}".encode())
        if not reg:
            raise RpcError(f"the RPC worker {host}:{port} offers no devices")
        g.ggml_backend_register(reg)


def serve_rpc(host: str, port: int, threads: int) -> None:
    """Run llama.cpp's RPC server here (what its `rpc-server` tool does): the local GPUs, else the
    CPU, offered to clients on host:port. Blocks; run it in a thread."""
    start = ctypes.CFUNCTYPE(
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    )(_rpc_proc("ggml_backend_rpc_start_server"))
    chosen = worker_devices()
    arr = (ctypes.c_void_p * len(chosen))(*[d.handle for d in chosen])
    start(f"{host}:{port}".encode(), None, threads, len(chosen), arr)


def exit_now(code: int) -> None:
    """Leave at once (a thread is inside llama.cpp and cannot be joined), flushing C's stdout and
    Python's."""
    import sys

    try:
        sys.stdout.flush()
        ctypes.CDLL(None).fflush(None)
    except Exception:  # noqa: BLE001 - leaving regardless
        pass
    os._exit(code)


def worker_devices() -> list[Device]:
    """What a worker offers: its GPUs, else its CPU (llama.cpp's rpc-server rule)."""
    local = [d for d in devices() if not d.remote]
    return [d for d in local if d.type not in ("CPU", "ACCEL")] or [d for d in local
                                                                    if d.type == "CPU"][:1]


def resolve_gpu_layers(value: int | str, *, local_only: bool = False) -> tuple[int, list[Device]]:
    """(n_gpu_layers for llama.cpp, the devices the layers may go to). `auto`: every layer when
    there is a device to offload to (a GPU, or an RPC worker unless `local_only`), none
    otherwise."""
    value = parse_gpu_layers(value)
    if value == 0:
        return 0, []
    offloading = [d for d in devices() if d.offloads]
    usable = [d for d in offloading if not (local_only and d.remote)]
    if value == "auto":
        return (-1, usable) if usable else (0, [])
    if not usable:  # asked for explicitly, with no local GPU: the remote devices, if any
        usable = offloading
    return (-1 if value == "all" else int(value)), usable



def run_worker(host: str, port: int, threads: int | None, say) -> None:
    """`spectool worker`: llama.cpp's RPC server on host:port until Ctrl-C or SIGTERM (then the
    process exits at once: the server thread sits inside llama.cpp and cannot be joined). `say`
    prints a line to the user."""
    import signal
    import socket
    import threading

    if not backend_info()["rpc"]:
        raise RpcError(REINSTALL_RPC)
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise RpcError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    if host not in ("127.0.0.1", "localhost", "::1"):
        say(f"WARNING: Host ('{host}') is != '127.0.0.1'\n         Never expose the RPC server to "
            "an open network!\n"
            # llama.cpp's rpc-server says it so
            "         This is an experimental feature and is not secure!")
    n = threads or os.cpu_count() or 1
    names = ", ".join(f"{d.name} ({d.description})" for d in worker_devices())
    say(f"serving {names} with {n} threads on {host}:{port}; Ctrl-C stops")
    server = threading.Thread(target=serve_rpc, args=(host, port, n), daemon=True)

    def stop(signum, frame):
        say("stopped")
        exit_now(143 if signum == signal.SIGTERM else 130)

    # SIGINT too: a worker started from a script's background job comes with SIGINT ignored
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        while server.is_alive():
            server.join(0.2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    raise RpcError(f"llama.cpp's RPC server stopped: {last_log_error() or 'see --debug'}")


def installation_info(rpc: str | None) -> dict:
    """What this llama.cpp can do here (`spectool info`): versions, CPU features, devices (with the
    RPC workers of `rpc` added), GPU offload, RPC support and threads."""
    if rpc:
        add_rpc_workers(parse_endpoints(rpc))
    b, found = backend_info(), devices()
    return {**versions(), "system_info": b["system_info"],
            # gpu_offload: a local GPU to offload to (what -ngl auto uses); llama.cpp's own
            # llama_supports_gpu_offload() also says yes for a CPU build with RPC in it
            "gpu_offload": any(d.offloads and not d.remote for d in found), "rpc": b["rpc"],
            "threads": os.cpu_count() or 1, "devices": [d.to_json() for d in found]}
