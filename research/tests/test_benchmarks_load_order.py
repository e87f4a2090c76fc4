"""The benchmark scripts load llama.cpp's libraries before numpy, as the product does (tests/test_load_order.py
says why and how it is seen); the same on a GPU host, where the other order segfaulted."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from test_load_order import order  # noqa: E402

BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("module", BENCHMARKS)
def test_importing_a_benchmark_loads_llama_cpp_before_numpy(module, tmp_path):
    assert order(f"import {module}", tmp_path, paths=(str(ROOT / "benchmarks"),)) in ("", "llama first")
