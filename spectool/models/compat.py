"""Can a draft model draft for a target? llama.cpp's rule: same vocabulary type, same BOS/EOS ids
and add-BOS/EOS flags, vocabulary sizes within 128 of each other, identical token text from id 5 up
to the smaller size."""

from __future__ import annotations

from spectool.llama.vocab import VocabInfo

MAX_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5


def vocab_differences(target: VocabInfo, draft: VocabInfo, limit: int = 5) -> list[str]:
    """Readable reasons why `draft` cannot draft for `target` (empty when compatible); at most
    `limit` token mismatches are listed."""
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
        out.append(f"vocabulary sizes differ by more than {MAX_SIZE_DIFFERENCE}: target "
                   f"{target.n_tokens}, draft {draft.n_tokens}")
    n = min(target.n_tokens, draft.n_tokens)
    mismatches = [i for i in range(FIRST_CHECKED_TOKEN, n) if target.texts[i] != draft.texts[i]]
    for i in mismatches[:limit]:
        out.append(f"token {i} differs: target {target.texts[i]!r}, draft {draft.texts[i]!r}")
    if len(mismatches) > limit:
        out.append(f"... and {len(mismatches) - limit} more differing tokens")
    return out


def check_files(target, draft=None, debug: bool = False):
    """`spectool check`: (the VocabInfo and MTP head count of each file, the reasons DRAFT cannot
    draft for TARGET: empty when it can or no draft is given)."""
    from spectool.llama import engine

    engine.set_verbose(debug)
    facts = []
    for path in [target] + ([draft] if draft else []):
        with engine.Model(path, n_ctx=64) as m:
            facts.append((m.vocab_info(), m.n_nextn))
    return facts, (vocab_differences(facts[0][0], facts[1][0]) if draft else [])


def check_head(target, head, debug: bool = False):
    """`spectool check TARGET HEAD` for a head (`head`: an EAGLE-3 or DFlash head's HeadFacts):
    ([the target's VocabInfo and MTP head count], [what the head is and reads, whether it can
    draft for the target])."""
    from spectool.llama import engine

    engine.set_verbose(debug)
    with engine.Model(target, n_ctx=64) as m:
        n_layer = int(m.lib.llama_model_n_layer(m.llama_model))
        facts, problem = (m.vocab_info(), m.n_nextn), head.problem(n_layer, m.n_embd)
    verdict = (f"cannot draft for the target: {problem}" if problem else
               f"compatible: the head drafts for the target with --spec {head.mode} (auto picks "
               "it)")
    return [facts], [head.describe(), verdict]
