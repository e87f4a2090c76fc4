"""llama-server's `/tokenize` (`content`, `add_special`, `parse_special`, `with_pieces`) and
`/detokenize` (`tokens`) for `spectool serve`, over the served model's own tokenizer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spectool.server.errors import invalid
from spectool.server.requests import load

if TYPE_CHECKING:
    from spectool.llama.engine import Model


def flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise invalid(name, "must be true or false")
    return value


def tokenize(body: dict, target: Model) -> dict:
    """`content` (a string, or llama-server's mix of strings and token ids) as tokens: ids, or with
    `with_pieces` {id, piece} where a piece that is not whole UTF-8 is its list of bytes, as
    llama-server answers. The BOS only with `add_special` (default false) and only before a leading
    string; special tokens' text is read as them unless `parse_special` is false."""
    content = body.get("content")
    add_special, parse_special = flag(body, "add_special", False), flag(body, "parse_special", True)
    with_pieces = flag(body, "with_pieces", False)
    if content is None:
        return {"tokens": []}
    parts = (content if isinstance(content, list) else [content] if isinstance(content, str)
             else [None])
    tokens: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            tokens += target.tokenize(part, add_special=add_special and i == 0,
                                      parse_special=parse_special)
        elif isinstance(part, int) and not isinstance(part, bool) and 0 <= part < target.n_vocab:
            tokens.append(part)
        else:
            raise invalid("content", f"must be a string or a list of strings and token ids (0 to "
                                     f"{target.n_vocab - 1})")
    if not with_pieces:
        return {"tokens": tokens}
    out = []
    for t in tokens:
        piece = target.piece(t, special=True)
        try:
            out.append({"id": t, "piece": piece.decode("utf-8")})
        except UnicodeDecodeError:
            out.append({"id": t, "piece": list(piece)})
    return {"tokens": out}


def detokenize(body: dict, target: Model) -> dict:
    """`tokens` as text, special tokens as their text (llama-server's tokens_to_str)."""
    tokens = body.get("tokens", [])
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < target.n_vocab
            for t in tokens):
        raise invalid("tokens", f"must be a list of token ids (0 to {target.n_vocab - 1})")
    text = b"".join(target.piece(t, special=True) for t in tokens)
    return {"content": text.decode("utf-8", errors="replace")}


def answer(path: str, raw: bytes, target: Model) -> dict:
    """The answer to a POST to /tokenize or /detokenize with body `raw` (runs in a thread)."""
    body = load(raw)
    return tokenize(body, target) if path == "/tokenize" else detokenize(body, target)
