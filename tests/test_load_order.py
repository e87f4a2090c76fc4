"""llama.cpp's shared libraries are loaded before numpy, whichever way a program comes into spectool
(spectool/llama/native.py says why: on an H200 with CUDA 13 the other order segfaulted on every model load).

On a CPU build the wrong order does not crash, so these tests check the order itself, the same way on a CPU and on
a GPU host: a finder placed first on `sys.meta_path` looks, when numpy is first imported, whether llama.cpp's
library is already mapped into the process (/proc/self/maps; elsewhere, whether llama_cpp's loader module ran).
"""

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import os, sys

def llama_loaded():
    if os.path.exists("/proc/self/maps"):
        with open("/proc/self/maps") as f:
            return "libllama" in f.read()
    return hasattr(sys.modules.get("llama_cpp.llama_cpp"), "_lib")

class Probe:
    seen = False

    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and not Probe.seen:
            Probe.seen = True
            with open(os.environ["ORDER_FILE"], "w") as f:
                f.write("llama first" if llama_loaded() else "numpy first")
        return None

sys.meta_path.insert(0, Probe())
"""


def order(code: str, tmp_path, *args: str, paths: tuple[str, ...] = ()) -> str:
    """Run `code` after the probe in a fresh interpreter: what the probe saw when numpy came in ('' if never)."""
    out = tmp_path / "order.txt"
    env = dict(os.environ, ORDER_FILE=str(out), PYTHONPATH=os.pathsep.join([str(ROOT), *paths]))
    cp = subprocess.run([sys.executable, "-c", PROBE + code, *args], env=env, capture_output=True, text=True,
                        timeout=120, cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr[-2000:]
    return out.read_text() if out.exists() else ""


MODULES = sorted(m.name for m in pkgutil.walk_packages([str(ROOT / "spectool")], "spectool.")
                 if m.name != "spectool.__main__")


@pytest.mark.parametrize("module", MODULES)
def test_importing_any_module_loads_llama_cpp_before_numpy(module, tmp_path):
    assert order(f"import {module}", tmp_path) in ("", "llama first")


def test_the_command_line_loads_llama_cpp_before_numpy(tiny, tmp_path):
    code = "import runpy; runpy.run_module('spectool', run_name='__main__')"
    argv = "import sys; sys.argv = ['spectool', 'run', '-m', sys.argv[1], '-n', '4', '-q', 'The quick brown fox']\n"
    assert order(argv + code, tmp_path, str(tiny["target"])) == "llama first"


def test_the_probe_sees_the_wrong_order(tmp_path):
    """The check can fail: numpy imported by hand before spectool is caught."""
    assert order("import numpy, spectool.core.verify", tmp_path) == "numpy first"


def test_the_test_run_itself_loaded_llama_cpp_first():
    import conftest

    assert not conftest.NUMPY_BEFORE_LLAMA
