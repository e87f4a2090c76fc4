"""The attention kernel on a CPU (spectool/attention.py): measured once per model and machine, kept, and
what the user asks for where they ask."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spectool import attention


def test_flash_attention_is_kept_unless_the_plain_kernel_is_faster_by_the_margin():
    assert attention.faster({True: 1.0, False: 1.0})
    assert attention.faster({True: 1.0 + attention.MARGIN / 2, False: 1.0})
    assert not attention.faster({True: 1.0 + 2 * attention.MARGIN, False: 1.0})
    assert attention.faster({True: 0.5, False: 1.0})


@pytest.mark.parametrize("asked, flash", [("on", True), ("off", False)])
def test_on_and_off_are_as_asked_and_measure_nothing(tiny, tmp_path, monkeypatch, asked, flash):
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    assert attention.chosen(tiny["target"], 1, "auto", asked) is flash
    assert not (tmp_path / "attention").exists()


def test_auto_on_a_cpu_measures_both_kernels_once_and_keeps_the_faster(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    flash = attention.chosen(tiny["target"], 1, 0)
    [kept] = (tmp_path / "attention").glob("*.json")
    saved = json.loads(kept.read_text())
    seconds = {fa == "true": s for fa, s in saved["seconds"].items()}
    assert set(seconds) == {True, False} and all(s > 0 for s in seconds.values())
    assert flash is saved["flash_attn"] is attention.faster(seconds)
    # kept: the next run reads the choice instead of measuring (the file says the other kernel now)
    kept.write_text(json.dumps({**saved, "flash_attn": not flash}))
    assert attention.chosen(tiny["target"], 1, 0) is (not flash)
    # a damaged file is measured again and replaced whole
    kept.write_text('{"flash_attn": ')
    assert attention.chosen(tiny["target"], 1, 0) in (True, False)
    assert set(json.loads(kept.read_text())) == {"flash_attn", "seconds"}


def test_a_table_of_costs_is_kept_per_kernel(tiny, tmp_path, monkeypatch):
    """A batch's price depends on the kernel (SmolLM2 on a 2-core Xeon: a batch of 16 after 1,024 tokens of context
    cost 242 ms with flash attention, 84 ms without): each has its own cost table (cost_files.path_for)."""
    from spectool import cost_files
    from spectool.llama import engine

    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    names = set()
    for flash in (True, False):
        with engine.Model(tiny["target"], n_ctx=256, n_threads=1, flash_attn=flash) as m:
            assert m.offload()["flash_attn"] is flash
            names.add(cost_files.path_for(m, None, 1, None, 256))
    assert len(names) == 2


def test_the_kernel_is_an_option(tiny, tmp_path):
    from test_rpc import generate

    draft = ("-md", str(tiny["draft"]), "--spec", "draft")
    _, off = generate(tiny, tmp_path, "-fa", "off", *draft)
    _, on = generate(tiny, tmp_path, "--flash-attn", "on", *draft)
    for model in ("target", "draft"):  # a draft model runs the kernel chosen for it as the target does
        assert off["offload"][model]["flash_attn"] is False and on["offload"][model]["flash_attn"] is True


def test_auto_chooses_the_draft_s_kernel_too(tiny, tmp_path, monkeypatch):
    from test_rpc import generate

    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    _, stats = generate(tiny, tmp_path, "-md", str(tiny["draft"]), "--spec", "draft", "-ngld", "0")
    kept = {json.loads(f.read_text())["flash_attn"] for f in (tmp_path / "attention").glob(f"{tiny['draft'].stem}-*")}
    assert kept == {stats["offload"]["draft"]["flash_attn"]}


PROBE_THREADS = """
import os, sys, time
from spectool import attention
from spectool.llama import native

def threads():  # this process's threads now, once any that are ending have ended
    time.sleep(0.2)
    return len(os.listdir("/proc/self/task"))

path, on_main = sys.argv[1], sys.argv[2] == "main"
native.lib()
before = threads()
if on_main:  # the control: the probe's decodes on this thread, as they ran before
    attention.decode_seconds(path, 2, False)
else:
    attention.chosen(path, 2, 0)
print(before, threads(), "libgomp" in open("/proc/self/maps").read())
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_the_probe_leaves_no_threads_of_llama_cpp_behind(tiny, tmp_path):
    """Measured on a thread of its own: an OpenMP team left on the main thread by the probe would have every team
    sleep between decodes while a server's generation threads decode (2.6x slower on SmolLM2, 2 cores)."""
    env = {**os.environ, "SPECTOOL_CACHE": str(tmp_path)}
    counts = {}
    for where in ("main", "own"):
        p = subprocess.run([sys.executable, "-c", PROBE_THREADS, str(tiny["target"]), where], capture_output=True,
                           text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        before, after, openmp = p.stdout.split()
        counts[where] = int(after) - int(before)
    assert counts["own"] == 0
    assert openmp == "False" or counts["main"] > 0  # the control: with OpenMP, decoding on the main thread leaves its team
