"""Can a draft model draft for a target? llama.cpp's rule: same vocabulary type, same BOS/EOS ids and
add-BOS/EOS flags, vocabulary sizes within 128 of each other, identical token text from id 5 up to the
smaller size."""

from __future__ import annotations

from spectool.engine import VocabInfo

MAX_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5


def vocab_differences(target: VocabInfo, draft: VocabInfo, limit: int = 5) -> list[str]:
    """Readable reasons why `draft` cannot draft for `target` (empty when compatible); at most `limit` token
    mismatches are listed."""
    out = []
    if target.type != draft.type:
        out.append(f"vocabulary type differs: target {target.type}, draft {draft.type}")
    for name in ("bos", "eos"):
        a, b = getattr(target, name), getattr(draft, name)
        if a != b:
            out.append(f"{name.upper()} token differs: target {a}, draft {b}")
    for name in ("add_bos", "add_eos"):
        a, b = getattr(target, name), getattr(draft, name)
        if a != b:
            out.append(f"{name} flag differs: target {a}, draft {b}")
    if abs(target.n_tokens - draft.n_tokens) > MAX_SIZE_DIFFERENCE:
        out.append(f"vocabulary sizes differ by more than {MAX_SIZE_DIFFERENCE}: target {target.n_tokens}, "
                   f"draft {draft.n_tokens}")
    n = min(target.n_tokens, draft.n_tokens)
    mismatches = [i for i in range(FIRST_CHECKED_TOKEN, n) if target.texts[i] != draft.texts[i]]
    for i in mismatches[:limit]:
        out.append(f"token {i} differs: target {target.texts[i]!r}, draft {draft.texts[i]!r}")
    if len(mismatches) > limit:
        out.append(f"... and {len(mismatches) - limit} more differing tokens")
    return out


def check_files(target, draft, debug: bool = False):
    """`spectool check`: (target's VocabInfo, draft's VocabInfo, the reasons it cannot draft) of two GGUF files."""
    from spectool import engine

    engine.set_verbose(debug)
    with engine.Model(target, n_ctx=64) as t, engine.Model(draft, n_ctx=64) as d:
        ti, di = t.vocab_info(), d.vocab_info()
    return ti, di, vocab_differences(ti, di)
