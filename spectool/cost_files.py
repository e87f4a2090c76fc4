"""The cost tables kept between runs, in SPECTOOL_CACHE/costs/: one per target, draft and settings,
so that the next run starts from what this machine charged (controller.Costs). A table is input like
any other: read through Costs.from_json, which drops what it could not have written, and replaced
whole."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from spectool.models.store import cache_dir, file_tag, write_json_atomic
from spectool.core.costs import Costs


def path_for(target, draft, threads: int | None, rpc: str | None, ctx_size: int) -> Path:
    """Where the table of this target (and draft) with these settings is kept. Its name carries
    everything a price depends on: the model files (path, size, modification time), threads,
    offload, RPC workers, context, and the build and CPU (llama.cpp's system info: backend, CPU
    features; the llama-cpp-python version; the CPU's model name, its architecture and core count),
    so a table from another build, CPU or thread count is never read."""
    import platform

    from spectool.llama.engine import backend_info

    tag = file_tag(target.path, draft.path if draft is not None else "", threads, target.offload(),
                   draft.offload() if draft is not None else None, rpc or "", ctx_size,
                   backend_info(),
                   platform.machine(), os.cpu_count(), cpu_name())
    return cache_dir("costs") / f"{Path(target.path).stem}-{tag}.json"


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), or '' where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform

    return platform.processor()


def load(path: Path | None, max_batch: int) -> tuple[Costs | None, str | None]:
    """The table at `path` (None where there is none) and a one-line warning where some or all of it
    was damaged: what could not be read is measured afresh and never written back."""
    if path is None or not path.exists():
        return None, None
    try:
        costs = Costs.from_json(json.loads(path.read_text()), max_batch=max_batch)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        return (
            None,
            f"warning: the cost table {path} could not be read ({type(e).__name__}): "
            "measuring costs afresh",
        )
    if costs.rejected:
        n = costs.rejected
        return (
            costs,
            f"warning: dropped {n} invalid entr{'y' if n == 1 else 'ies'} of the cost table "
            f"{path}: measuring afresh",
        )
    return costs, None


def save(path: Path, costs: Costs, about: dict) -> None:
    """Replace the table at `path` with `costs` (and what it is for, for `spectool info`); a cache
    that cannot be written costs only speed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"about": about, **costs.to_json()})
    except OSError:
        pass


@dataclass
class Table:
    path: Path
    about: dict
    costs: Costs | None  # None: unreadable


def tables(target: str | os.PathLike | None = None) -> list[Table]:
    """The saved tables, newest first; with `target`, only those of that model file."""
    folder = cache_dir("costs")
    found = []
    newest_first = (sorted(folder.glob("*.json"), key=lambda p: -p.stat().st_mtime)
                    if folder.is_dir() else [])
    for path in newest_first:
        try:
            obj = json.loads(path.read_text())
            about = obj.get("about") if isinstance(obj.get("about"), dict) else {}
            costs = Costs.from_json(obj)
        except (OSError, ValueError, AttributeError):
            about, costs = {}, None
        if target is None or about.get("target") == str(Path(target).resolve()):
            found.append(Table(path, about, costs))
    return found


def describe(t: Table) -> str:
    """One line: what the table is for, and what it holds (Costs.describe)."""
    name = Path(t.about.get("target", t.path.stem)).name
    if t.about.get("draft"):
        name += f" + {Path(t.about['draft']).name}"
    settings = ", ".join(f"{k} {t.about[k]}" for k in ("threads", "ctx")
                         if t.about.get(k) is not None)
    held = t.costs.describe() if t.costs is not None else "unreadable: the next run measures afresh"
    return f"{name}{f' ({settings})' if settings else ''}: {held}"


def reset(target: str | os.PathLike | None = None) -> int:
    """Remove the saved tables (of one model file, with `target`): the next runs measure afresh. How
    many."""
    gone = tables(target)
    for t in gone:
        t.path.unlink(missing_ok=True)
    return len(gone)
