"""The layers of docs/layout.md hold: no module imports from a layer above its own, none imports another module's
private names, and none is over 400 lines. Read from the source with `ast`, every import, those inside functions
too; no model is loaded (the same on a GPU host)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "spectool"

# what each layer may import from spectool, besides itself (docs/layout.md); the front ends may import anything
MAY_IMPORT = {
    "spectool.llama": set(),
    "spectool.models": {"spectool.llama"},
    "spectool.core": {"spectool.llama"},  # but speculative, the loop, which drives the drafters
    "spectool.core.speculative": {"spectool.llama", "spectool.drafters"},
    "spectool.drafters": {"spectool.llama", "spectool.core", "spectool.models"},
}


def modules() -> list[tuple[str, Path]]:
    return [(".".join(("spectool", *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__"), p)
            for p in sorted(ROOT.rglob("*.py"))]


def imports(path: Path, name: str) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every spectool import in the file, relative ones resolved."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("spectool")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[: -node.level] if path.name != "__init__.py" else name.split(".")
                base = ".".join([*package, *([base] if base else [])])
            if base.startswith("spectool"):
                out.append((base, [a.name for a in node.names]))
    return out


def layer(name: str) -> str | None:
    """The most specific entry of MAY_IMPORT that `name` belongs to (None: a front end)."""
    found = [k for k in MAY_IMPORT if name == k or name.startswith(k + ".")]
    return max(found, key=len) if found else None


def package(name: str) -> str:
    return ".".join(name.split(".")[:2])


@pytest.mark.parametrize("name,path", modules(), ids=[n for n, _ in modules()])
def test_no_import_runs_upward(name, path):
    mine = layer(name)
    if mine is None:
        return
    allowed = MAY_IMPORT[mine] | {package(name)}
    bad = [m for m, names in imports(path, name)
           if m != "spectool" and package(m) not in allowed and m not in allowed
           or m == "spectool" and any(n != "__version__" for n in names)]
    assert not bad, f"{name} ({mine}) imports {bad}; it may import {sorted(allowed)}"


@pytest.mark.parametrize("name,path", modules(), ids=[n for n, _ in modules()])
def test_no_private_name_crosses_a_module(name, path):
    bad = [(m, n) for m, names in imports(path, name) for n in names
           if n.startswith("_") and not n.startswith("__") and m != name]
    assert not bad, f"{name} imports private names {bad}"


@pytest.mark.parametrize("name,path", modules(), ids=[n for n, _ in modules()])
def test_no_module_is_over_400_lines(name, path):
    assert len(path.read_text().splitlines()) <= 400


def test_the_checks_can_fail(tmp_path):
    """The negative control: an upward import and a private name are found where they are."""
    f = tmp_path / "x.py"
    f.write_text("from spectool.session import open_session\nfrom spectool.llama.native import _lib\n")
    found = imports(f, "spectool.llama.x")
    assert ("spectool.session", ["open_session"]) in found and ("spectool.llama.native", ["_lib"]) in found
    assert layer("spectool.llama.x") == "spectool.llama" and layer("spectool.core.speculative") == \
        "spectool.core.speculative" and layer("spectool.cli") is None
