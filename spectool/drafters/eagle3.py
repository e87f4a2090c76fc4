"""An EAGLE-3 head (`-md HEAD.gguf`, llama.cpp's eagle3 architecture) as the drafter: what a head
file asks of its target (`head_facts`), its context beside the target's (`Eagle3Context`, fed the
target's hidden states at the head's three layers through the target's decode listener), and the
drafter that chains it (`Eagle3`), as common/speculative.cpp's draft-eagle3 does."""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.evidence import EAGLE3, Source
from spectool.drafters.mtp import HeadContext, Mtp, one_sequence
from spectool.llama.engine import DecodeError, Model, ModelLoadError, last_log_error
from spectool.llama.vocab import check_gguf_file

ARCH = "eagle3"


@dataclass(frozen=True)
class HeadFacts:
    """What an EAGLE-3 head reads of its target: the layers whose inputs it fuses (a layer id equal
    to the target's layer count: its last hidden state) and the target's hidden size."""

    layers: tuple[int, ...]
    target_hidden: int
    mode = "eagle3"  # the --spec that drafts with it

    def describe(self) -> str:
        """What the head is and reads (spectool check)."""
        return (f"an EAGLE-3 head; it reads the target's hidden states at layers "
                f"{', '.join(map(str, self.layers))} (width {self.target_hidden})")

    def problem(self, n_layer: int, n_embd: int) -> str | None:
        """Why the head cannot draft for a target of `n_layer` layers and width `n_embd`."""
        if n_embd != self.target_hidden:
            return f"the head reads a target of width {self.target_hidden}, not {n_embd}"
        if len(self.layers) != 3:
            return f"the head reads {len(self.layers)} target layers, not 3"
        if max(self.layers) > n_layer:
            return f"the head reads layer {max(self.layers)}; the target has {n_layer}"
        return None


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}


def _value(f, kind: int):
    """One GGUF metadata value of type `kind` read from `f` (arrays as lists)."""
    if kind == 8:
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n).decode("utf-8", errors="replace")
    if kind == 9:
        item, n = struct.unpack("<IQ", f.read(12))
        return [_value(f, item) for _ in range(n)]
    fmt = _SCALARS[kind]
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def gguf_metadata(path: Path, keys: set[str], arch: str = ARCH, tensors: bool = False) -> dict:
    """The values of `keys` in a GGUF file's metadata, read until all are found or the architecture
    is not `arch` (llama.cpp's meta_val_str gives no arrays, and a vocab-only load no
    architecture's own keys); with `tensors`, the whole metadata is read and "tensors" holds the
    names of the file's tensors (for `arch`'s files only)."""
    found: dict = {}
    with open(path, "rb") as f:
        _magic, _version, n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        for _ in range(n_kv):
            (n,) = struct.unpack("<Q", f.read(8))
            key = f.read(n).decode("utf-8", errors="replace")
            (kind,) = struct.unpack("<I", f.read(4))
            value = _value(f, kind)
            if key == "general.architecture" and value != arch:
                found[key] = value
                return found
            if key in keys:
                found[key] = value
                if len(found) == len(keys) and not tensors:
                    return found
        if tensors:
            found["tensors"] = {_tensor_name(f) for _ in range(n_tensors)}
    return found


def _tensor_name(f) -> str:
    """One tensor's name from its info in a GGUF file, the rest of the info skipped."""
    (n,) = struct.unpack("<Q", f.read(8))
    name = f.read(n).decode("utf-8", errors="replace")
    (n_dims,) = struct.unpack("<I", f.read(4))
    f.seek(8 * n_dims + 4 + 8, 1)  # its dims, type and offset
    return name


def head_metadata(path: str | Path, arch: str, names: Sequence[str],
                  tensors: bool = False) -> dict | None:
    """The values of `arch`'s keys `names` in a head file's metadata (gguf_metadata), or None
    where the file is of another architecture; an unreadable file is a ModelLoadError."""
    p = check_gguf_file(path)
    keys = {"general.architecture"} | {f"{arch}.{k}" for k in names}
    try:
        meta = gguf_metadata(p, keys, arch, tensors)
    except (OSError, struct.error, KeyError) as e:
        raise ModelLoadError(f"cannot read {p.name}'s metadata: {e}") from e
    return meta if meta.get("general.architecture") == arch else None


def head_facts(path: str | Path) -> HeadFacts | None:
    """The facts of an EAGLE-3 head file (its metadata only; None for any other model)."""
    meta = head_metadata(path, ARCH, ("target_layers", "target_hidden_size"))
    if meta is None:
        return None
    return HeadFacts(tuple(int(i) for i in meta.get(f"{ARCH}.target_layers", ())),
                     int(meta.get(f"{ARCH}.target_hidden_size", 0)))


def is_head(path: str | Path) -> bool:
    """Whether `path` is an EAGLE-3 head (a file that cannot be read is not)."""
    try:
        return head_facts(path) is not None
    except ModelLoadError:
        return False


class Eagle3Context(HeadContext):
    """An EAGLE-3 head in a context of its own beside the target's (ctx_other: the head borrows the
    target's token embeddings and output layer where it has none). Its encoder fuses the target's
    hidden states at the head's layers into g; its decoder at position p takes the token at p + 1
    with g at p (the target's, or its own output for the position before while it drafts), and
    predicts the token at p + 2. `mirror`, a decode listener of the target, keeps its cache in step
    with the target's decodes; `step` drafts one token. Its interface is MtpContext's: `step(token,
    pos, h)` takes the token at `pos` with the state of pos - 1."""

    name = "EAGLE-3 head"

    def __init__(self, target: Model, path: str | Path):
        self._beside(target, Path(path), head_facts(path), "an EAGLE-3 head")
        lib = self.lib
        self._model: Any = None
        self._enc: Any = None
        self._load(Path(path))
        self._mem = lib.llama_get_memory(self._ctx)
        self._make_batches()
        self._extract(True)
        # position -> g there (the encoder's output for the target's latest decode)
        self.h: dict[int, np.ndarray] = {}
        self._last_h = np.zeros(self.n_embd, np.float32)
        target.add_decode_listener(self.mirror)
        self.covered = 0  # the target's first positions mirrored here without a gap

    def _load(self, path: Path) -> None:
        self._load_beside(path, "an EAGLE-3 head")
        self._ext.llama_set_embeddings_nextn(self._ctx, True, True)  # output rows' only

    def _make_batches(self) -> None:
        """The decoder's batch (token ids and g side by side) and the encoder's (the target's
        features, one row of every layer's hidden state a position)."""
        lib, n = self.lib, self.target.n_batch
        self.n_batch = n
        self._side_by_side(n, self.n_embd)
        self._enc = self._feature_batch(n, True)

    def encode(self, n: int) -> np.ndarray:
        """g of the target's last decode of `n` tokens: the encoder on their fused features."""
        self._features(n)
        # the encoder ignores positions, but llama.cpp checks that they follow the cache's
        start = self.lib.llama_memory_seq_pos_max(self._mem, 0) + 1
        self._e_pos[:n] = np.arange(start, start + n, dtype=np.int32)
        self._enc.n_tokens = n
        rc = self.lib.llama_encode(self._ctx, self._enc)
        if rc != 0:
            raise DecodeError(f"the EAGLE-3 encoder failed (code {rc}): {last_log_error()}")
        return np.ctypeslib.as_array(self._ext.llama_get_embeddings_nextn(self._ctx),
                                     shape=(n, self.n_embd)).copy()

    def mirror(self, tokens: Sequence[int], pos0: int) -> None:
        """After the target decoded `tokens` from position pos0: g of each, and the pairs (token at
        p + 1, g at p) the decoder's cache holds from pos0 - 1 (g kept from an earlier decode) to
        the last but one; the last waits for the next token (propose's first step)."""
        n = len(tokens)
        g = self.encode(n)
        first = max(pos0 - 1, 0)
        self.lib.llama_memory_seq_rm(self._mem, 0, first, -1)
        m = 0
        if pos0:
            self._b_token[0], self._b_h[0] = tokens[0], self.h.get(pos0 - 1, self._last_h)
            m = 1
        self._b_token[m:m + n - 1] = tokens[1:]
        self._b_h[m:m + n - 1] = g[: n - 1]
        m += n - 1
        self._b_pos[:m] = np.arange(first, first + m, dtype=np.int32)
        self._b_out[:m] = 0
        if m:
            self._decode(m)
        self.h = {pos0 + i: g[i] for i in range(n)} | {p: v for p, v in self.h.items() if p < pos0}
        self._last_h = self.h[pos0 + n - 1]
        if pos0 <= self.covered:
            self.covered = pos0 + n

    def step(self, token: int, pos: int, h: np.ndarray) -> np.ndarray:
        """The decoder on `token` (the token at `pos`) with `h` (g at pos - 1, or this head's own
        state for the token before), at position pos - 1: its logits row predicts the token at
        pos + 1; returns the head's pre-norm state, the next step's g."""
        self.lib.llama_memory_seq_rm(self._mem, 0, pos - 1, -1)
        self._b_token[0], self._b_pos[0], self._b_out[0], self._b_h[0] = token, pos - 1, 1, h
        self._decode(1)
        return np.ctypeslib.as_array(self._ext.llama_get_embeddings_nextn_ith(self._ctx, 0),
                                     shape=(self.n_embd,)).copy()

    def close(self) -> None:
        lib = self.lib
        if self._batch is not None:
            self._batch.token = ctypes.POINTER(lib.llama_token)()  # ours, not llama_batch_init's
            lib.llama_batch_free(self._batch)
            self._batch = None
        if self._enc is not None:
            lib.llama_batch_free(self._enc)
            self._enc = None
        self._free_beside()


class Eagle3(Mtp):
    """The EAGLE-3 head as the drafter: Mtp's chain (from the last position whose hidden state the
    target computed, through any tokens after it, then on the head's own outputs) over an
    Eagle3Context, its tokens counted as the head's."""

    source, evidence = Source.eagle3, EAGLE3
