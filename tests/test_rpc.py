"""GPU-offload defaults, `spectool info`, and llama.cpp's RPC backend with a real `spectool worker` process on
127.0.0.1: remote generation must be token-for-token the local one.

On a host with a local GPU, `--rpc` with `-ngl auto` splits the target's layers over the local GPU(s) and the worker
(backend "CUDA0, RPC0"), and the draft goes to the local GPU: the tests expect that split there, and the CPU-only
layout elsewhere (`local_gpus()`). The worker itself serves its GPU there, its CPU here."""

import json
import os
import signal
import subprocess
import time

import pytest
from spectool_lab.helpers import SPECTOOL, accepts, free_port, other_addresses, refuses, spectool, start, stop, wait_until_up

from spectool.llama import devices, engine

PROMPT = "The quick brown fox"


class Worker:
    def __init__(self, *args, env=None):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = start(["worker", "--port", self.port, "-t", "1", *args], env=env)
        wait_until_up(self.proc, lambda: accepts(self.port), "worker", timeout=60)

    def stop(self, sig=signal.SIGINT):
        return stop(self.proc, sig)


@pytest.fixture(scope="module")
def worker():
    if not engine.backend_info()["rpc"]:
        pytest.fail("llama-cpp-python was built without RPC: install as the README says "
                    "(CMAKE_ARGS=\"-DGGML_RPC=on\" pip install -e \".[test]\")")
    w = Worker()
    yield w
    w.stop()


def local_gpus() -> list:
    return [d for d in devices.devices() if d.offloads and not d.remote]


def generate(tiny, tmp_path, *args):
    """stdout and --stats-json of a greedy run on the tiny target."""
    stats = tmp_path / f"stats-{time.monotonic_ns()}.json"
    p = spectool("run", "-m", str(tiny["target"]), "-n", "48", "-t", "1", "-q", "--stats-json", str(stats), *args,
                 PROMPT)
    assert p.returncode == 0, p.stderr
    return p.stdout, json.loads(stats.read_text())


def test_gpu_layers_read_as_llama_cpp_reads_them(tiny):
    assert devices.parse_gpu_layers("auto") == "auto" and devices.parse_gpu_layers("ALL") == "all"
    assert devices.parse_gpu_layers("12") == 12 and devices.parse_gpu_layers(0) == 0
    assert devices.parse_gpu_layers("-1") == "all"  # llama.cpp: a negative number is every layer
    with pytest.raises(ValueError):
        devices.parse_gpu_layers("most")
    p = spectool("run", "-m", str(tiny["target"]), "-ngl", "most", PROMPT)
    assert p.returncode == 2 and "most" in p.stderr and "Traceback" not in p.stderr
    with pytest.raises(devices.RpcError, match="HOST:PORT"):
        devices.parse_endpoints("127.0.0.1")
    assert devices.parse_endpoints("a:1, b:50052") == [("a", 1), ("b", 50052)]
    p = spectool("run", "-m", str(tiny["target"]), "--rpc", "127.0.0.1", PROMPT)
    assert p.returncode == 2 and "HOST:PORT" in p.stderr and "Traceback" not in p.stderr


def test_auto_offloads_everything_to_a_gpu_and_nothing_without_one(tiny, tmp_path):
    """`-ngl auto` (the default) on this machine: all layers when llama.cpp sees a GPU device, none on a CPU build;
    `-ngl 0` always keeps them on the CPU. The stats name the backend and the layers."""
    gpus = local_gpus()
    _, auto = generate(tiny, tmp_path)
    _, cpu = generate(tiny, tmp_path, "-ngl", "0")
    n_layers = auto["offload"]["target"]["of"]
    flash = cpu["offload"]["target"]["flash_attn"]  # measured on the CPU (spectool/attention.py)
    assert n_layers >= 2 and cpu["offload"]["target"] == {"backend": "CPU", "devices": [], "layers": 0,
                                                          "of": n_layers, "flash_attn": flash}
    assert flash in (True, False)
    if gpus:
        assert auto["offload"]["target"]["layers"] == n_layers
        assert auto["offload"]["target"]["backend"] == ", ".join(d.name for d in gpus)
    else:
        assert auto["offload"]["target"] == cpu["offload"]["target"]


def test_info_json_names_versions_devices_and_folders():
    p = spectool("info", "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert {"spectool", "llama_cpp_python", "llama_cpp", "ggml", "system_info", "gpu_offload", "rpc", "threads",
            "devices", "paths"} <= set(info)
    assert "AVX" in info["system_info"] or "NEON" in info["system_info"]
    assert info["threads"] == os.cpu_count() and info["rpc"] is engine.backend_info()["rpc"]
    cpu = [d for d in info["devices"] if d["type"] == "CPU"]
    assert cpu and cpu[0]["memory_total"] > 0
    assert set(info["paths"]) == {"cache", "models_cache", "config"}
    text = spectool("info")
    assert text.returncode == 0 and "GPU offload" in text.stdout and "device CPU" in text.stdout


def test_greedy_output_through_a_worker_equals_the_local_output(worker, tiny, tmp_path):
    """Plain, prompt lookup and draft-model decoding, each with the target's layers on the worker (and on the local
    GPU, where there is one): the same text as the same mode run locally on the CPU; the draft stays local."""
    gpus = local_gpus()
    for mode in (["--spec", "none"], ["--spec", "lookup"], ["-md", str(tiny["draft"]), "--spec", "draft"]):
        local, _ = generate(tiny, tmp_path, *mode, "-ngl", "0")
        remote, stats = generate(tiny, tmp_path, *mode, "--rpc", worker.endpoint)
        assert remote == local and len(local) > 20, mode
        target = stats["offload"]["target"]
        assert target["layers"] == target["of"]
        assert target["devices"] == [f"{d.name} ({d.description})" for d in gpus] + [f"RPC0 ({worker.endpoint})"]
        if "draft" in mode:
            draft = stats["offload"]["draft"]
            assert draft["backend"] == (", ".join(d.name for d in gpus) or "CPU") and stats["n_drafted"] > 0


def test_info_lists_the_remote_devices(worker):
    p = spectool("info", "--json", "--rpc", worker.endpoint)
    assert p.returncode == 0, p.stderr
    remote = [d for d in json.loads(p.stdout)["devices"] if d["backend"] == "RPC"]
    assert [d["description"] for d in remote] == [worker.endpoint] and remote[0]["memory_total"] > 0


def test_an_unreachable_worker_is_one_line_naming_it(tiny):
    port = free_port()  # nothing listens there
    p = spectool("run", "-m", str(tiny["target"]), "--rpc", f"127.0.0.1:{port},127.0.0.1:1", "-n", "5", PROMPT)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and f"127.0.0.1:{port}" in p.stderr
    assert "cannot reach the RPC worker" in p.stderr and "Traceback" not in p.stderr


def test_a_worker_lost_mid_generation_keeps_the_text_and_names_the_worker(tiny, tmp_path):
    local, _ = generate(tiny, tmp_path, "-ngl", "0", "-n", "1500")
    w = Worker()
    p = subprocess.Popen([*SPECTOOL, "run", "-m", str(tiny["target"]), "--rpc", w.endpoint, "-n", "1500", "-t", "1",
                          "-q", PROMPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.read(10)  # generation is under way on the worker
    w.proc.kill()
    w.proc.wait()
    rest, err = p.communicate(timeout=60)
    out, err = (first + rest).decode(), err.decode()
    assert p.returncode == 1 and len(first) == 10
    assert err.strip().splitlines() == [f"error: lost the RPC worker {w.endpoint} "
                                         "(Remote RPC server crashed or returned malformed response)"], err
    assert local.startswith(out) and len(out) < len(local)  # what was generated before the loss is kept


def test_the_worker_binds_loopback_unless_told_and_warns_when_told(tiny):
    w = Worker()
    try:
        assert other_addresses() and all(refuses(addr, w.port) for addr in other_addresses())
    finally:
        code, err = w.stop()
    assert code == 130 and "stopped" in err and "WARNING" not in err and "Traceback" not in err  # Ctrl-C
    open_worker = Worker("--host", "0.0.0.0")
    try:  # the check above can fail: bound to every address, the worker answers on them
        assert not any(refuses(addr, open_worker.port) for addr in other_addresses())
    finally:
        code, err = open_worker.stop(signal.SIGTERM)
    assert code == 143 and "Never expose the RPC server to an open network" in err
    busy = Worker()
    try:
        p = spectool("worker", "--port", str(busy.port))
        assert p.returncode == 1 and f"cannot listen on 127.0.0.1:{busy.port}" in p.stderr
    finally:
        busy.stop()


@pytest.mark.realmodel
def test_weights_that_do_not_fit_the_device_are_one_line_with_a_number_to_try(gemma_q4):
    """A device that runs out of memory while the weights load. The device is a worker whose address space is
    capped (RLIMIT_AS) 64 MiB above what it uses idle, so the 241 MiB of Gemma 3 270M Q4_K_M cannot be allocated
    there, as on a GPU too small for the model. On a GPU host both processes are kept off the GPU
    (CUDA_VISIBLE_DEVICES empty), so that the worker is the only device, as here."""
    import re
    import resource

    cpu_only = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    w = Worker(env=cpu_only)
    try:
        vm = int(re.search(r"VmSize:\s+(\d+) kB", open(f"/proc/{w.proc.pid}/status").read()).group(1)) << 10
        resource.prlimit(w.proc.pid, resource.RLIMIT_AS, (vm + (64 << 20), resource.RLIM_INFINITY))
        p = spectool("run", "-m", str(gemma_q4), "--rpc", w.endpoint, "-n", "4", PROMPT, env=cpu_only)
        assert p.returncode == 1 and p.stdout == "" and "Traceback" not in p.stderr
        line = p.stderr.strip()
        assert "\n" not in line and re.fullmatch(
            r"error: gemma-3-270m-q4_k_m\.gguf \(\d+ MiB\) does not fit RPC0 \(\d+ MiB free\): "
            r"try -ngl (\d+) \(of its 18 layers\), or -ngl 0 for the CPU", line), line
        assert int(re.search(r"try -ngl (\d+)", line).group(1)) < 19  # fewer layers than failed
        assert spectool("run", "-m", str(gemma_q4), "--rpc", w.endpoint, "-ngl", "0", "-n", "4",
                        PROMPT, env=cpu_only).returncode == 0  # and what it says to try instead works
    finally:
        w.stop()


def test_the_live_panel_names_the_backend_and_the_layers(worker, tiny, tmp_path):
    from rich.console import Console

    from spectool.core.stats import Stats
    from spectool.cli.display import stats_table

    _, stats = generate(tiny, tmp_path, "-md", str(tiny["draft"]), "--spec", "draft", "--rpc", worker.endpoint)
    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    console.print(stats_table(Stats(mode="draft", n_generated=1, offload=stats["offload"])))
    n, gpus = stats["offload"]["target"]["of"], ", ".join(d.name for d in local_gpus())
    m = stats["offload"]["draft"]["of"]
    draft = f"{gpus} {m}/{m} layers" if gpus else "CPU"
    assert f"backend  {gpus + ', ' if gpus else ''}RPC0 {n}/{n} layers;  draft {draft}" in console.export_text()
