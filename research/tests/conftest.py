"""The research checks use the suite's own fixtures (tests/conftest.py: tiny generated models, the demo model),
the module pytest already imported where tests/ runs in the same session."""

import importlib.util
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parents[2] / "tests" / "conftest.py"
_suite = sys.modules.get("conftest")
if _suite is None or Path(getattr(_suite, "__file__", "")).resolve() != SUITE:
    _spec = importlib.util.spec_from_file_location("suite_conftest", SUITE)
    _suite = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_suite)
globals().update({name: value for name, value in vars(_suite).items() if not name.startswith("__")})
