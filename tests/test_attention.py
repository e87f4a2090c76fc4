"""The attention kernel on a CPU (spectool/attention.py): measured once per model and machine, kept, and
what the user asks for where they ask."""

from __future__ import annotations

import json

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
