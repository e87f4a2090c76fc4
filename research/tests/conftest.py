"""The research checks use the suite's own fixtures (tests/conftest.py: tiny generated models, the demo model)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "suite_conftest", Path(__file__).resolve().parents[2] / "tests" / "conftest.py")
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
globals().update({name: value for name, value in vars(_suite).items() if not name.startswith("__")})
