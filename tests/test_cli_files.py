"""The files `spectool run` writes and reads (issue 58 items 6 and 12), each a real run on the tiny model: what it
writes (--stats-json, --lookup-cache) goes only to a regular file or a new path, through a symbolic link to one;
a directory, a device or a FIFO is refused in one line before anything runs, and left as it was; an input that
never ends (/dev/zero as --prediction, --grammar-file or stdin) is read up to a stated bound, then one line."""

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

SPECTOOL = [sys.executable, "-m", "spectool"]


def run(tiny, *args, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    """`spectool run` on the tiny model, under a 4 GiB address-space limit: a run that reads an endless file
    fails here, not the machine."""
    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run([*SPECTOOL, "run", "-m", str(tiny["target"]), "-n", "4", *map(str, args), "hi"],
                          capture_output=True, text=True, stdin=stdin, timeout=120, preexec_fn=limited)


def one_line(r, code=2) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""  # nothing generated
    return lines[0]


def devices(tmp_path: Path) -> dict[str, Path]:
    """What is not a regular file, made in `tmp_path`: a FIFO, a directory, a copy of /dev/null where this user
    may make device files (the probe's case), and a symbolic link to the FIFO."""
    made = {"fifo": tmp_path / "fifo", "dir": tmp_path / "dir", "link": tmp_path / "link"}
    os.mkfifo(made["fifo"])
    made["dir"].mkdir()
    made["link"].symlink_to(made["fifo"])
    try:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made["device"] = tmp_path / "null"
    except PermissionError:
        pass
    return made


@pytest.mark.parametrize("flag", ["--stats-json", "--lookup-cache"])
def test_what_is_not_a_regular_file_is_refused_before_the_run_and_left_alone(tiny, tmp_path, flag):
    """Item 6: a copy of /dev/null became a regular JSON file, a FIFO was replaced, and --lookup-cache on a
    device said "damaged; starting anew" and replaced it."""
    for kind, path in devices(tmp_path).items():
        before = os.lstat(path)
        line = one_line(run(tiny, flag, path))
        assert line.startswith(f"error: {flag} {path}: ") and ("regular file" in line or "directory" in line), line
        after = os.lstat(path)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), kind


@pytest.mark.parametrize("flag", ["--stats-json", "--lookup-cache"])
def test_a_symbolic_link_is_written_through(tiny, tmp_path, flag):
    """Item 6: a symbolic link was replaced by a regular file; it is written through, as editors do, and stays a
    link; a link whose file does not exist yet makes that file."""
    for name in ("made.json", "new.json"):
        target, link = tmp_path / name, tmp_path / f"link-{name}"
        if name == "made.json":
            target.write_text("{}\n" if flag == "--stats-json" else "")
        link.symlink_to(target)
        r = run(tiny, flag, link)
        assert r.returncode == 0, r.stderr
        assert link.is_symlink() and os.readlink(link) == str(target) and target.is_file()
        if flag == "--stats-json":
            assert json.loads(target.read_text())["n_generated"] > 0
        else:
            assert json.loads(target.read_text())["documents"]


def test_a_lookup_cache_in_a_missing_folder_is_refused_before_the_run(tiny, tmp_path):
    """Item 12: it warned only after the run, with exit 0."""
    path = tmp_path / "missing" / "cache.json"
    line = one_line(run(tiny, "--lookup-cache", path))
    assert line.startswith(f"error: --lookup-cache {path}: no such directory"), line


@pytest.mark.parametrize("flag", ["--prediction", "--grammar-file", "--json-schema-file", "stdin"])
def test_an_input_that_never_ends_is_read_up_to_its_bound(tiny, flag):
    """Items 6 and 12: /dev/zero as --prediction or --grammar-file was read until memory ran out (under a limit,
    an empty error message); stdin too. Each is read up to 64 MiB, then one line says so."""
    with open("/dev/zero", "rb") as zero:
        r = run(tiny, stdin=zero) if flag == "stdin" else run(tiny, flag, "/dev/zero")
    line = one_line(r)
    what = "stdin" if flag == "stdin" else f"{flag} /dev/zero"
    assert line == f"error: {what}: over 64 MiB; spectool reads at most that much", line
