"""The attention kernel on a CPU (spectool/attention.py): measured once per model and machine, kept, and
what the user asks for where they ask."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spectool import attention


def timed(on: tuple[float, float], off: tuple[float, float]) -> dict[bool, dict[int, float]]:
    """Seconds a decode of one token and of a verification took with flash attention on and off."""
    return {True: dict(zip(attention.BATCHES, on)), False: dict(zip(attention.BATCHES, off))}


def test_flash_attention_is_kept_unless_the_plain_kernel_is_faster_by_the_margin():
    m, step = attention.MARGIN, attention.STEP_MARGIN
    assert attention.faster(timed((1, 1), (1, 1))) and attention.faster(timed((1, 1), (1, 1)), plain=True)
    assert attention.faster(timed((1 + m, 1 + m), (1, 1)))
    assert not attention.faster(timed((1.01 + m, 1.01 + m), (1, 1)))
    assert not attention.faster(timed((1, 1.1), (1, 1))) and attention.faster(timed((0.5, 1), (1, 1)))
    # a model that decodes a token a step (--spec none, a draft) is timed by that decode alone, with its margin
    assert attention.faster(timed((1, 2), (1, 1)), plain=True)
    assert attention.faster(timed((1 + step / 2, 1), (1, 1)), plain=True)
    assert not attention.faster(timed((1 + 2 * step, 1), (1, 1)), plain=True)


@pytest.mark.parametrize("asked, flash", [("on", True), ("off", False)])
def test_on_and_off_are_as_asked_and_measure_nothing(tiny, tmp_path, monkeypatch, asked, flash):
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    assert attention.chosen(tiny["target"], 1, "auto", asked) is flash
    assert not (tmp_path / "attention").exists()


def test_auto_on_a_cpu_measures_both_kernels_once_and_keeps_the_faster(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    flash = attention.chosen(tiny["target"], 1, 0)
    [kept] = (tmp_path / "attention").glob("*.json")
    seconds = attention.kept(json.loads(kept.read_text()))
    assert all(s > 0 for by in seconds.values() for s in by.values())
    assert flash is attention.faster(seconds)
    # kept: the next run reads the seconds instead of measuring, for either use of the model
    kept.write_text(json.dumps({"seconds": {"true": {"1": 1.0, "8": 10.0}, "false": {"1": 1.0, "8": 5.0}}}))
    assert attention.chosen(tiny["target"], 1, 0) is False and attention.chosen(tiny["target"], 1, 0, plain=True)
    # a damaged file is measured again and replaced whole
    kept.write_text('{"seconds": ')
    assert attention.chosen(tiny["target"], 1, 0) in (True, False)
    assert set(json.loads(kept.read_text())) == {"seconds"} and attention.kept(json.loads(kept.read_text()))


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
    kept = {attention.faster(attention.kept(json.loads(f.read_text())), plain=True)
            for f in (tmp_path / "attention").glob(f"{tiny['draft'].stem}-*")}
    assert kept == {stats["offload"]["draft"]["flash_attn"]}


def test_auto_chooses_for_what_the_target_decodes(tiny, tmp_path, monkeypatch):
    """A kept file whose one-token decode ties and whose verification runs faster without flash attention: a
    target that verifies drafts runs without it, one that decodes a token a step (--spec none) with it."""
    from test_rpc import generate

    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    generate(tiny, tmp_path, "--spec", "none")
    [kept] = (tmp_path / "attention").glob(f"{tiny['target'].stem}-*")
    kept.write_text(json.dumps({"seconds": {"true": {"1": 1.0, "8": 10.0}, "false": {"1": 1.0, "8": 5.0}}}))
    for spec, flash in (("none", True), ("lookup", False)):
        _, stats = generate(tiny, tmp_path, "--spec", spec)
        assert stats["offload"]["target"]["flash_attn"] is flash


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
    attention.kernel_seconds(path, 2)
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


def test_a_choice_kept_by_an_older_measurement_is_measured_again(tiny, tmp_path, monkeypatch):
    """The measurement's version is in the kept file's name: a choice kept by an older, less careful one (which
    chose the slower kernel here, research/notes/2026-12-07-kernel-choice.md) is not read."""
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    monkeypatch.setattr(attention, "METHOD", attention.METHOD - 1)
    attention.chosen(tiny["target"], 1, 0)
    [old] = (tmp_path / "attention").glob("*.json")
    old.write_text(json.dumps({**json.loads(old.read_text()), "seconds": "kept by the older method"}))
    monkeypatch.undo()
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    attention.chosen(tiny["target"], 1, 0)
    assert len(list((tmp_path / "attention").glob("*.json"))) == 2
    assert json.loads(old.read_text())["seconds"] == "kept by the older method"
