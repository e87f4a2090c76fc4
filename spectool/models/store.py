"""Files spectool writes: what it derives from a model file (in SPECTOOL_CACHE, default
~/.cache/spectool), always replaced whole."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path


def cache_dir(kind: str) -> Path:
    return Path(os.environ.get("SPECTOOL_CACHE") or Path.home() / ".cache" / "spectool") / kind


def file_tag(path: str | os.PathLike, *extra: object) -> str:
    """A short name for this version of the file (path, size, mtime) and whatever else the result
    depends on."""
    path = Path(path)
    st = path.stat()
    key = ":".join(str(x) for x in (path.resolve(), st.st_size, st.st_mtime_ns, *extra))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def write_json_atomic(path: str | os.PathLike, obj, indent: int | None = 2) -> None:
    """Write JSON to a temporary file beside `path`, flushed to the disk, then rename: readers see
    the old file or the new one, after a crash too. A symbolic link is written through (the file it
    names is replaced, as editors do); what is not a regular file (a device, a FIFO) is never
    replaced: an OSError."""
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    text = json.dumps(obj, indent=indent, separators=None if indent else (",", ":")) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
