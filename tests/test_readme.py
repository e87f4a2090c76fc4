"""The README (and docs/) stay true where a machine can check them: every `spectool ...` command line parses with
spectool's own command line, every flag named exists, the defaults the README states are the ones `--help`
shows, and the README's install brings what its serve command needs, which answers."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import typer

from spectool.cli import app

ROOT = Path(__file__).resolve().parents[1]
# flags of other tools that the README and docs name (pip's, llama.cpp's own, the agent clients' in serve.md), and
# click's own
OTHER_TOOLS = {"--force-reinstall", "--no-cache-dir", "--fit", "--spec-type", "--help", "--version", "--config",
               "--message", "--skip-git-repo-check"}


def commands() -> dict:
    return typer.main.get_command(app).commands


def command_lines(text: str) -> list[str]:
    """The spectool invocations of a Markdown text: lines of its code blocks and inline code spans, from
    `spectool` on (after `&&` or a pipe), bracketed optional parts unwrapped."""
    blocks = text.split("```")[1::2]
    spans = re.findall(r"`([^`\n]+)`", "".join(text.split("```")[0::2]))
    out = []
    for line in [ln for b in blocks for ln in b.splitlines()] + spans:
        for part in re.split(r"&&|\|", line):
            part = part.strip()
            if part.startswith("spectool "):
                out.append(part.replace("[", "").replace("]", ""))
    return out


def parse_problem(line: str) -> str | None:
    """Why `line` does not parse as a spectool command (None when it does)."""
    words = shlex.split(line, comments=True)[1:]
    if not words or words[0].startswith("-"):
        return None  # `spectool --help`, `spectool --version`
    cmd = commands().get(words[0])
    if cmd is None:
        return f"{line!r}: no command {words[0]!r}"
    try:
        cmd.make_context(words[0], words[1:])
    except Exception as e:  # noqa: BLE001 - typer's own click: its Exit (after --help) and its usage errors
        if type(e).__name__ == "Exit":
            return None
        if not hasattr(e, "format_message"):
            raise
        return f"{line!r}: {e.format_message()}"
    return None


BENCHMARK = re.compile(r"python (benchmarks|research)/(\w+)\.py((?: +--?[\w-]+(?: +[\w.]+)?)*)")


def benchmark_flag_problems(text: str) -> tuple[str, list[str]]:
    """`text` without its `python benchmarks/NAME.py ...` (or research/) command lines, and the flags on those
    lines that their script's own argparse does not declare."""
    out = []
    for folder, name, flags in BENCHMARK.findall(text):
        script = (ROOT / folder / f"{name}.py").read_text()
        declared = set(re.findall(r'add_argument\("(--[\w-]+)"', script))
        out += [f"{flag} is not an option of {folder}/{name}.py" for flag in re.findall(r"--[\w-]+", flags)
                if flag not in declared]
    return BENCHMARK.sub("", text), out


def flag_problems(text: str) -> list[str]:
    """The --flags named anywhere in `text` that no spectool command has (a benchmark's, on its command line, that
    its script has)."""
    known = {o for c in commands().values() for p in c.params for o in p.opts + p.secondary_opts}
    text, out = benchmark_flag_problems(text)
    for flag, star in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])(-?\*?)", text):
        if flag in OTHER_TOOLS or flag in known or (star.endswith("*") and any(k.startswith(flag) for k in known)):
            continue
        out.append(f"{flag} is not an option of any spectool command")
    return sorted(set(out))


OPTIONS = "## Options and llama.cpp"  # docs/usage.md's section: the one table of defaults that differ


def stated_defaults(text: str) -> list[tuple[str, str, str]]:
    """(command, flag, the default stated) from the table of options that differ from llama.cpp (docs/usage.md):
    "0 (`run`, `serve`), 0.8 (`chat`)" states per command; a plain value is `run`'s."""
    section = text.split(OPTIONS, 1)[1].split("\n## ", 1)[0]
    out = []
    for row in re.findall(r"^\|(.+)\|$", section, re.M):
        cells = [c.strip() for c in row.split("|")]
        flags = re.findall(r"`(-[\w-]+)`", cells[0])
        if not flags or len(cells) < 2:
            continue
        values = [v.strip() for v in cells[1].split(" / ")] if len(flags) > 1 else [cells[1]]
        for flag, value in zip(flags, values):
            groups = re.findall(r"([^,()]+?)\s*\(([^)]*)\)", value) or [(value, "`run`")]
            for v, cmds in groups:
                for cmd in re.findall(r"`(\w+)`", cmds):
                    out.append((cmd, flag, v.strip(" ,")))
    return out


def default_problem(cmd_name: str, flag: str, stated: str) -> str | None:
    param = next(p for p in commands()[cmd_name].params if flag in p.opts)
    shown = param.default
    if shown is None:  # no single default: --help says it in words, which must hold the number stated
        number = re.findall(r"[\d.]+", stated)
        ok = bool(number) and number[-1] in (param.help or "")
    else:
        first = re.sub(r"[`:]", "", stated.split()[0])
        try:
            ok = float(first) == float(shown)
        except ValueError:
            ok = first == str(shown)
    return None if ok else f"{cmd_name} {flag}: the README says {stated!r}, --help shows {shown!r}"


def problems(text: str) -> list[str]:
    out = [p for line in command_lines(text) if (p := parse_problem(line))]
    out += flag_problems(text)
    if OPTIONS in text:
        out += [p for c, f, v in stated_defaults(text) if (p := default_problem(c, f, v))]
    return out


def test_the_readme_commands_flags_and_defaults_are_spectools():
    text = (ROOT / "README.md").read_text()
    lines = command_lines(text)
    assert len(lines) >= 10 and any(ln.startswith("spectool run --pair demo") for ln in lines)
    assert problems(text) == []


def test_the_table_of_defaults_states_them_as_help_shows_them():
    text = (ROOT / "docs" / "usage.md").read_text()
    assert len(stated_defaults(text)) >= 9
    assert problems(text) == []


@pytest.mark.parametrize("doc", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_the_docs_commands_and_flags_are_spectools(doc):
    assert problems((ROOT / "docs" / doc).read_text()) == []


def test_the_check_fails_on_a_flag_or_default_that_is_not_so():
    """The checks above can fail: a made-up flag in a command and in the prose, a command that does not exist,
    and a default that is not the one --help shows are each reported."""
    text = (ROOT / "README.md").read_text()
    bad = text.replace("spectool run --pair demo --stop Question:", "spectool run --pair demo --stop-at Question:")
    assert any("--stop-at" in p for p in problems(bad))
    assert any("--sampler-seed" in p for p in problems(text + "\nUse `--sampler-seed 3`.\n"))
    assert any("no command" in p for p in problems(text + "\n```bash\nspectool generate hi\n```\n"))
    assert problems(text + "\nRun `python benchmarks/structured.py --draft --prompts 8`.\n") == problems(text)
    assert any("--drafts is not an option of benchmarks/structured.py" in p
               for p in problems(text + "\nRun `python benchmarks/structured.py --drafts`.\n"))
    text = (ROOT / "docs" / "usage.md").read_text()
    wrong = text.replace("| `-c` | 4096 (`run`", "| `-c` | 8192 (`run`")
    assert wrong != text and any("-c" in p and "8192" in p for p in problems(wrong))
    wrong = text.replace("0.8 (`chat`) | 0.8 |", "0.7 (`chat`) | 0.8 |")
    assert wrong != text and any("chat --temp" in p for p in problems(wrong))


# -- the README's install, then its serve command ----------------------------------------------------------------
def readme_section(title: str) -> str:
    return (ROOT / "README.md").read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_install_brings_what_serve_needs():
    """`pip install -e ".[EXTRAS]"` as the README's install says: the installed package requires the server's
    libraries without any extra beyond those."""
    from importlib.metadata import requires

    extras = set(re.search(r'pip install -e "\.\[([\w,]+)\]"', readme_section("Install"))[1].split(","))
    installed = set()
    for req in requires("spectool"):
        name, _, marker = req.partition(";")
        extra = re.search(r'extra == "(\w+)"', marker)
        if extra is None or extra[1] in extras:
            installed.add(re.split(r"[<>=!~ \[]", name.strip())[0].lower())
    assert {"starlette", "uvicorn"} <= installed, sorted(installed)


@pytest.mark.realmodel
def test_the_readme_serve_command_answers(tmp_path):
    """The README's `spectool serve` line, run by the installed `spectool` (on a free port instead of 8080), answers
    /health and the README's curl request to /v1/chat/completions."""
    import json
    import sys
    import urllib.request

    from spectool_lab.helpers import free_port, stop, wait_until_up

    section = readme_section("Serve the OpenAI API")
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    serve_line = next(ln for ln in block.splitlines() if ln.startswith("spectool serve "))
    curl = " ".join(ln.rstrip("\\").strip() for ln in block.splitlines() if not ln.startswith("spectool "))
    url = re.search(r"curl -s (\S+)", curl)[1]
    body = json.loads(shlex.split(curl)[shlex.split(curl).index("-d") + 1])
    port = free_port()
    exe = str(Path(sys.executable).parent / "spectool")  # the console script the install made
    words = shlex.split(serve_line, comments=True)
    proc = subprocess.Popen([exe, *words[1:], "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(proc, lambda: urllib.request.urlopen(base + "/health", timeout=1).status == 200, "server", 300)
        req = urllib.request.Request(url.replace("http://127.0.0.1:8080", base), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            reply = json.loads(r.read())
        assert r.status == 200 and reply["choices"][0]["message"]["content"].strip(), reply
    finally:
        code, err = stop(proc)
    assert "Traceback" not in err and "error" not in err.lower(), err
