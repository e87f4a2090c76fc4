"""A model file's facts outside decoding: whether a path can be a GGUF file, what a loaded model's
file says (`Facts`: its vocabulary, tokens to text and back, metadata), and text from a stream of
tokens (`Detokenizer`)."""

from __future__ import annotations

import codecs
import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from spectool.llama.native import ModelLoadError

GGUF_MAGIC = b"GGUF"


def check_gguf_file(path: str | os.PathLike) -> Path:
    """Fail early, with a readable message, on a path that cannot be a GGUF model."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelLoadError(f"model path is a directory, not a .gguf file: {p}")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"cannot read model file {p}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {p}")
    return p


def meta_value(lib, model, key: str) -> str | None:
    """A GGUF metadata value of a loaded llama.cpp model (a llama_model pointer), as text (None when
    absent)."""
    buf = ctypes.create_string_buffer(1024)
    n = lib.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    if n < 0:
        return None
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        lib.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class VocabInfo:
    """What decides whether two models' token ids mean the same text (models/compat.py)."""

    type: int
    n_tokens: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool
    texts: tuple[bytes, ...]


class Detokenizer:
    """Turns a stream of tokens into text without ever emitting half a UTF-8 character."""

    def __init__(self, piece: Callable[[int], bytes]):
        self._piece = piece
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tokens: Iterable[int]) -> str:
        return self._dec.decode(b"".join(self._piece(t) for t in tokens))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)

    def ahead(self, tokens: Iterable[int]) -> list[str]:
        """The text each of `tokens` would add, fed one at a time after what was fed so far; nothing
        is fed (what a draft would read as, were it accepted)."""
        state = self._dec.getstate()
        try:
            return [self._dec.decode(self._piece(t)) for t in tokens]
        finally:
            self._dec.setstate(state)


class Facts:
    """What a loaded model's file says, outside decoding: text to tokens and back, end-of-generation
    tokens, metadata, the chat template and the vocabulary (VocabInfo). Model (engine.py) is one."""

    def __init__(self, lib, model):
        """`lib`: llama_cpp (native.lib()); `model`: a loaded `llama_model *`, kept while this
        object is used."""
        self.lib, self._weights = lib, model
        self._vocab = lib.llama_model_get_vocab(model)
        self.n_vocab = lib.llama_vocab_n_tokens(self._vocab)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}

    # -- text
    # ----------------------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (self.lib.llama_token * n_max)()
        n = self.lib.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special,
                                    parse_special)
        if n < 0:
            n_max = -n
            buf = (self.lib.llama_token * n_max)()
            n = self.lib.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special,
                                        parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token; special tokens render as nothing unless `special` (then as their
        text, as llama-server's /tokenize and /detokenize show them)."""
        p = None if special else self._pieces.get(token)
        if p is None:
            buf = ctypes.create_string_buffer(64)
            n = self.lib.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self.lib.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
            p = buf.raw[:n]
            if not special:
                self._pieces[token] = p
        return p

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def detokenizer(self) -> Detokenizer:
        return Detokenizer(self.piece)

    def first_eog(self, tokens: Sequence[int]) -> int:
        """The index of the first end-of-generation token in `tokens` (len(tokens) if none)."""
        for i, token in enumerate(tokens):
            if self._eog.get(token) or (token not in self._eog and self.is_eog(token)):
                return i
        return len(tokens)

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(self.lib.llama_vocab_is_eog(self._vocab, token))
        return eog

    # -- facts
    # ---------------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        return meta_value(self.lib, self._weights, key)

    @property
    def architecture(self) -> str:
        return self.meta("general.architecture") or "?"

    def fim_tokens(self) -> dict[str, int]:
        """The vocabulary's fill-in-the-middle tokens that it has, by llama.cpp's names: pre, suf,
        mid (all three needed for FIM), pad, rep (repository), sep (file separator)."""
        lib, v = self.lib, self._vocab
        found = {name: getattr(lib, f"llama_vocab_fim_{name}")(v)
                 for name in ("pre", "suf", "mid", "pad", "rep",
                                                                               "sep")}
        return {name: int(t) for name, t in found.items() if t >= 0}  # LLAMA_TOKEN_NULL is -1

    def added_bos(self) -> list[int]:
        """The BOS that tokenize(add_special=True) puts first, as a list: empty where the vocabulary
        adds none."""
        lib, v = self.lib, self._vocab
        return [int(lib.llama_vocab_bos(v))] if lib.llama_vocab_get_add_bos(v) else []

    def chat_template(self) -> str | None:
        t = self.lib.llama_model_chat_template(self._weights, None)
        return t.decode("utf-8", errors="replace") if t else None

    def vocab_info(self) -> VocabInfo:
        lib, v = self.lib, self._vocab
        return VocabInfo(
            type=lib.llama_vocab_type(v),
            n_tokens=self.n_vocab,
            bos=lib.llama_vocab_bos(v),
            eos=lib.llama_vocab_eos(v),
            add_bos=bool(lib.llama_vocab_get_add_bos(v)),
            add_eos=bool(lib.llama_vocab_get_add_eos(v)),
            texts=tuple(lib.llama_vocab_get_text(v, i) or b"" for i in range(self.n_vocab)),
        )
