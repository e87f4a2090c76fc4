"""The lab loads llama.cpp's libraries before numpy, as the product does: each module of
spectool_lab, each benchmark script and each research script, imported first in a fresh interpreter
(tests/test_load_order.py says why and how it is seen, and its probe is the one run here); the same
on a GPU host, where the other order segfaulted."""

import importlib.util
import pkgutil
from pathlib import Path

import pytest

import spectool_lab

ROOT = Path(__file__).resolve().parent.parent
_PROBE = ROOT / "tests" / "test_load_order.py"  # by its path: the suite's probe, no lab module
_SPEC = importlib.util.spec_from_file_location("suite_load_order", _PROBE)
SUITE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(SUITE)

LAB = sorted(m.name for m in pkgutil.iter_modules(spectool_lab.__path__, "spectool_lab."))
SCRIPTS = [(folder, p.stem) for folder in ("benchmarks", "research")
           for p in sorted((ROOT / folder).glob("*.py")) if not p.stem.startswith("test_")]
FIRST = ("", "llama first")  # numpy never imported, or after llama.cpp's libraries


@pytest.mark.parametrize("module", ["spectool_lab", *LAB])
def test_importing_any_module_of_the_lab_loads_llama_cpp_before_numpy(module, tmp_path):
    assert SUITE.order(f"import {module}", tmp_path) in FIRST


@pytest.mark.parametrize("folder,script", SCRIPTS, ids=[f"{f}/{s}" for f, s in SCRIPTS])
def test_importing_a_script_loads_llama_cpp_before_numpy(folder, script, tmp_path):
    """As `python FOLDER/SCRIPT.py` imports it: its own folder first on the path."""
    assert SUITE.order(f"import {script}", tmp_path, paths=(str(ROOT / folder),)) in FIRST


def test_the_lab_and_the_scripts_are_all_here():
    """The lists above are not empty by a wrong path: the moved modules, a script of each folder."""
    assert {"spectool_lab.common", "spectool_lab.helpers", "spectool_lab.tinymodels"} <= set(LAB)
    assert ("benchmarks", "run") in SCRIPTS and ("research", "lookup_bound") in SCRIPTS
