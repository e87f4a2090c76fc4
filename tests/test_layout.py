"""The rules docs/layout.md states hold in the source: each package imports only what its row of the layout's table
allows (read from the table itself, so the two cannot drift), no import cycle runs between packages, no module
imports another's private names, every module is in the layout, and the sizes: no function over 50 lines, no
line over 100 characters, no module over 500 lines, at most 8 modules directly under spectool/.
Outside the package (the layout's last paragraph): spectool imports nothing of the lab, the lab
package (spectool_lab, in tests/spectool_lab/) no folder's own modules, no folder another folder's,
and none of them edits the interpreter's import path. Read with `ast`, every import, those inside
functions too; nothing is run and no model is loaded (the same on a GPU host). Each check has a
negative control."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPECTOOL = ROOT / "spectool"
LAB = ROOT / "tests" / "spectool_lab"  # the package spectool_lab (pyproject.toml)
FOLDERS = ("tests", "benchmarks", "research")  # each imports its own modules by name
LAYOUT = ROOT / "docs" / "layout.md"
SESSION = "session"  # the layout's name for the modules directly under spectool/: the session layer
ENTRY = "spectool.__main__"  # `python -m spectool`: the command line's entry point, above every layer
FUNCTION_LINES, LINE_CHARS, MODULE_LINES, TOP_MODULES = 50, 100, 500, 8


def rules(text: str) -> dict[str, set[str]]:
    """Each package's allowed imports, from the rows of the layout's table of packages: `| `spectool/NAME/` |
    job | `a`, `b` |` (the session layer: `spectool/*.py`; `anything`: every package)."""
    out = {}
    for name, allowed in re.findall(r"^\| \*\*`spectool/([\w*.]+)/?`\*\* \|[^|]*\| ([^|]*) \|$", text, re.M):
        package = SESSION if name == "*.py" else name
        out[package] = set(re.findall(r"`(\w+)`", allowed)) if "anything" not in allowed else {"*"}
    return out


def modules(root: Path = SPECTOOL) -> list[tuple[str, Path]]:
    return [(".".join(("spectool", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"), p)
            for p in sorted(root.rglob("*.py"))]


def package(name: str) -> str:
    """The layout's package of a module: its folder under spectool/, or the session layer."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (SPECTOOL / parts[1]).is_dir()) else SESSION


def imports(path: Path, name: str) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every spectool import in the file, relative ones resolved."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.split(".")[0] == "spectool"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join([*here[: len(here) - node.level + 1], *([base] if base else [])])
            if base.split(".")[0] == "spectool":
                out.append((base, [a.name for a in node.names]))
    return out


def targets(module: str, names: list[str]) -> list[str]:
    """The modules an import reaches: `from spectool.server import app` reaches spectool.server.app."""
    found = [f"{module}.{n}" for n in names if (SPECTOOL.parent / f"{module}.{n}".replace(".", "/")).exists()
             or (SPECTOOL.parent / (f"{module}.{n}".replace(".", "/") + ".py")).exists()]
    return found or [module]


def upward(name: str, path: Path, allowed: dict[str, set[str]]) -> list[str]:
    """The imports of module `name` that its package's row does not allow."""
    mine = package(name)
    bad = []
    for module, names in imports(path, name):
        if module == "spectool" and names == ["__version__"]:
            continue
        for reached in targets(module, names):
            theirs = package(reached) if reached != "spectool" else SESSION
            if theirs != mine and "*" not in allowed[mine] and theirs not in allowed[mine]:
                bad.append(reached)
    return bad


ALLOWED = rules(LAYOUT.read_text())
MODULES = modules()


def test_the_layout_states_a_rule_for_every_package():
    packages = {package(n) for n, _ in MODULES if n != ENTRY}
    assert packages == set(ALLOWED), f"packages {sorted(packages)}, rules for {sorted(ALLOWED)}"


@pytest.mark.parametrize("name,path", [m for m in MODULES if m[0] != ENTRY], ids=[n for n, _ in MODULES
                                                                                 if n != ENTRY])
def test_no_import_runs_back_up(name, path):
    bad = upward(name, path, ALLOWED)
    assert not bad, f"{name} ({package(name)}) imports {bad}; it may import {sorted(ALLOWED[package(name)])}"


def package_graph(mods=MODULES) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in mods:
        if name == ENTRY:
            continue
        for module, names in imports(path, name):
            for reached in targets(module, names):
                a, b = package(name), package(reached) if reached != "spectool" else SESSION
                if a != b:
                    graph.setdefault(a, set()).add(b)
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph, None where it has none (a depth-first search)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    return next((found for node in sorted(graph) if node not in state and (found := visit(node, [node]))), None)


def test_no_import_cycle_between_packages():
    assert cycle(package_graph()) is None


@pytest.mark.parametrize("name,path", MODULES, ids=[n for n, _ in MODULES])
def test_no_private_name_crosses_a_module(name, path):
    bad = [(m, n) for m, names in imports(path, name) for n in names
           if n.startswith("_") and not n.startswith("__") and m != name]
    assert not bad, f"{name} imports private names {bad}"


def test_every_module_is_in_the_layout():
    text = LAYOUT.read_text()
    def named(p: Path) -> bool:  # by its path within its package: `engine.py`, `tools/calls.py`
        parts = p.relative_to(SPECTOOL).parts
        return f"`{'/'.join(parts[1:] if len(parts) > 2 else parts[-1:])}`" in text or f"`spectool/{p.name}`" in text

    missing = [n for n, p in MODULES if p.name != "__init__.py" and not named(p)]
    assert not missing, f"docs/layout.md does not name {missing}"


def long_functions(path: Path) -> list[str]:
    return [f"{path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > FUNCTION_LINES]


def long_lines(path: Path) -> list[str]:
    return [f"{path.name}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1) if len(line) > LINE_CHARS]


@pytest.mark.parametrize("name,path", MODULES, ids=[n for n, _ in MODULES])
def test_the_sizes(name, path):
    """Functions, not files, are the unit of size; a module stays readable whole."""
    assert not long_functions(path)
    assert not long_lines(path)
    assert len(path.read_text().splitlines()) <= MODULE_LINES


def test_few_modules_stand_directly_under_spectool():
    top = [p.name for p in SPECTOOL.glob("*.py")]
    assert len(top) <= TOP_MODULES, top


# -- outside the package: the lab ------------------------------------------------------------------
def own_modules(folder: str) -> set[str]:
    """The names a folder's files import one another by (pytest, and `python FOLDER/x.py`, put the
    folder on the path)."""
    return {p.stem for p in (ROOT / folder).glob("*.py")}


def lab_files() -> list[tuple[str, Path]]:
    """(owner, file) for each Python file outside spectool/: the lab package's, each folder's."""
    return [("spectool_lab", p) for p in sorted(LAB.rglob("*.py"))] + \
        [(f, p) for f in FOLDERS for p in sorted((ROOT / f).glob("*.py"))]


def top_imports(path: Path) -> set[str]:
    """The top-level names of the absolute imports of a file, those inside functions too."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.add((node.module or "").split(".")[0])
    return out


def reaches_across(owner: str, path: Path) -> list[str]:
    """What a file of `owner` (spectool, spectool_lab or a folder) imports that it may not: the
    product nothing of the lab, the lab no folder's modules, a folder no other folder's."""
    others = set().union(*(own_modules(f) for f in FOLDERS if f != owner))
    if owner == "spectool":
        others.add("spectool_lab")
    return sorted(top_imports(path) & others)


def import_path_edits(path: Path) -> list[int]:
    """The lines where a file reaches for sys's `path` (what the lab's package replaced)."""
    def reaches(n: ast.AST) -> bool:
        if isinstance(n, ast.ImportFrom):
            return n.module == "sys" and "path" in {a.name for a in n.names}
        return isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name) \
            and n.value.id == "sys"

    return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if reaches(n)]


OUTSIDE = [("spectool", p) for _, p in MODULES] + lab_files()


@pytest.mark.parametrize("owner,path", OUTSIDE, ids=[str(p.relative_to(ROOT)) for _, p in OUTSIDE])
def test_no_import_reaches_across_the_lab(owner, path):
    assert not reaches_across(owner, path), f"{path.name} imports {reaches_across(owner, path)}"
    assert not import_path_edits(path), f"{path.name} edits the path: {import_path_edits(path)}"


def test_the_lab_is_a_package_and_the_folders_hold_what_it_does_not():
    assert (LAB / "__init__.py").exists()
    assert {"common", "replay", "helpers", "tinymodels"} <= {p.stem for p in LAB.glob("*.py")}
    assert not own_modules("tests") & {"helpers", "tinymodels", "llamacpp", "loadmix"}
    assert not own_modules("benchmarks") & {"common", "replay"}


def test_the_lab_checks_can_fail(tmp_path):
    """The negative controls: an import of another folder's script, of the lab from the product, and
    an edit of the import path are each caught."""
    f = tmp_path / "x.py"
    f.write_text("import sys\nimport lookup_bound\nfrom spectool_lab.common import models\n"
                 "sys." + "path.insert(0, '.')\n")  # in two pieces: a grep finds the name nowhere
    assert reaches_across("benchmarks", f) == ["lookup_bound"]
    assert reaches_across("research", f) == []
    assert reaches_across("spectool", f) == ["lookup_bound", "spectool_lab"]
    assert reaches_across("spectool_lab", f) == ["lookup_bound"]
    assert import_path_edits(f) == [4]
    assert ("spectool_lab.common", ["models"]) not in imports(f, "spectool.x")  # not spectool's


def test_the_checks_can_fail(tmp_path):
    """The negative controls: a made-up tree with an upward import, a private name, a cycle, a long function and a
    long line is caught by each check."""
    f = tmp_path / "x.py"
    f.write_text("from spectool.session import open_session\nfrom spectool.llama.native import _lib\n"
                 "def f():\n" + "    pass\n" * FUNCTION_LINES + "# " + "x" * LINE_CHARS + "\n")
    assert upward("spectool.llama.x", f, ALLOWED) == ["spectool.session"]
    assert upward("spectool.cli.x", f, ALLOWED) == []
    assert ("spectool.llama.native", ["_lib"]) in imports(f, "spectool.llama.x")
    assert long_functions(f) and long_lines(f)
    assert cycle({"core": {"drafters"}, "drafters": {"generate"}, "generate": {"core"}}) is not None
    assert cycle({"core": {"llama"}, "drafters": {"core", "llama"}}) is None
    assert rules("| **`spectool/a/`** | its job | `b`, `c` |\n| **`spectool/*.py`** | x | anything |\n") == \
        {"a": {"b", "c"}, SESSION: {"*"}}
    assert package("spectool.server.app") == "server" and package("spectool.session") == SESSION
