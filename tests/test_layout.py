"""The rules docs/layout.md states hold in the source: each package imports only what its row of the layout's table
allows (read from the table itself, so the two cannot drift), no import cycle runs between packages, no module
imports another's private names, every module is in the layout, and the sizes: no function over 50 lines, no
line over 100 characters, no module over 500 lines, at most 8 modules directly under spectool/. Read with `ast`,
every import, those inside functions too; nothing is run and no model is loaded (the same on a GPU host). Each
check has a negative control."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPECTOOL = ROOT / "spectool"
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
            out += [(a.name, []) for a in node.names if a.name.startswith("spectool")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join([*here[: len(here) - node.level + 1], *([base] if base else [])])
            if base.startswith("spectool"):
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
