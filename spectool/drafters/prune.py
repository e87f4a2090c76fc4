"""A faster draft model: the same weights with a smaller vocabulary.

On a CPU most of a small draft model's step is its output layer when the vocabulary is large (Gemma
3 270M, 262k tokens: 6.3 of 9.6 ms). A draft only proposes; the target verifies every token, so a
draft that can propose only the K tokens it is most likely to need loses a little acceptance and
gains a lot of speed. This module writes such a draft: the K most likely tokens (ranked by the
draft's own average next-token distribution over a calibration text it writes itself), plus every
special and byte token, with the embedding rows sliced to match. The kept ids are stored in the file
(`spectool.pruned.ids`), so DraftModel maps between the two vocabularies. The output of speculative
decoding is unchanged: only which drafts are offered changes.
"""

from __future__ import annotations

import os
from pathlib import Path

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.models.store import cache_dir, file_tag

KEY_IDS = "spectool.pruned.ids"
VOCAB_TENSORS = ("token_embd.weight", "output.weight")
TOKEN_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
CALIBRATION = [
    "The history of science is full of surprises.",
    "def parse(text):\n    \"\"\"Parse a config file.\"\"\"\n",
    "Question: How do I make a good cup of coffee?\nAnswer:",
    "Dear team,\n\nThank you for",
    "In 1969, the first",
    "import numpy as np\n\n",
]


def read_ids(path: str | os.PathLike) -> np.ndarray | None:
    """The original token ids a pruned draft keeps (its token i is the parent's ids[i]), or None."""
    import gguf

    field = gguf.GGUFReader(str(path)).fields.get(KEY_IDS)
    return None if field is None else np.array(field.contents(), dtype=np.int64)


def token_ranking(model, tokens_per_prompt: int = 160, seed: int = 0, progress=None) -> np.ndarray:
    """Average next-token probability of every token, over text the model samples itself from varied
    starts; `progress(done, total)` hears of each start."""
    from spectool.core.verify import Random, Sampling, distribution

    rng = Random(seed)
    s = Sampling(temp=0.9)
    total = np.zeros(model.n_vocab)
    for i, text in enumerate(CALIBRATION):
        if progress is not None:
            progress(i, len(CALIBRATION))
        model.reset()
        model.eval(model.tokenize(text))
        for _ in range(tokens_per_prompt):
            p = distribution(model.logits(-1), s)
            total[p.ids] += p.p
            t = p.sample(rng)
            if model.is_eog(t) or len(model.tokens) + 1 >= model.n_ctx:
                break
            model.eval([t])
    model.reset()
    return total


def prune(src: str | os.PathLike, dst: str | os.PathLike, keep: np.ndarray) -> Path:
    """Write `src` with only the token ids in `keep` (sorted), atomically."""
    import gguf

    keep = np.unique(np.asarray(keep, dtype=np.int64))
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    new_id = {int(old): new for new, old in enumerate(keep)}
    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".part")
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        for field in reader.fields.values():
            name = field.name
            if (
                name == gguf.Keys.General.ARCHITECTURE
                or name.startswith("GGUF.")
                or name == KEY_IDS
            ):
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            value = field.contents()
            if name in TOKEN_ARRAYS:
                value = [value[i] for i in keep]
            elif name.endswith("_token_id"):
                if int(value) not in new_id:
                    continue  # a special token we dropped: llama.cpp then has none of that kind
                value = new_id[int(value)]
            elif name == f"{arch}.vocab_size":
                value = len(keep)
            elif name == "tokenizer.ggml.merges":
                texts = set(reader.fields["tokenizer.ggml.tokens"].contents()[i] for i in keep)
                value = [m for m in value if m.replace(" ", "") in texts
                         and all(p in texts for p in m.split(" "))]
            writer.add_key_value(name, value, vtype, sub_type=sub)
        writer.add_array(KEY_IDS, [int(i) for i in keep])
        tensors = [(t, t.data[keep] if t.name in VOCAB_TENSORS else t.data) for t in reader.tensors]
        for t, data in tensors:
            writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t, data in tensors:
            writer.write_tensor_data(np.ascontiguousarray(data), tensor_endianess=reader.endianess)
        writer.close()
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def cached_path(path: str | os.PathLike, vocab: int) -> Path:
    """Where the pruned copy of `path` lives (see models/store.py)."""
    return cache_dir("pruned") / f"{Path(path).stem}-vocab{vocab}-{file_tag(path, vocab)}.gguf"


def pruned_draft(path: str | os.PathLike, vocab: int, progress=None, **model_options) -> Path:
    """A pruned copy of the draft at `path` keeping `vocab` tokens, made once and cached;
    `progress(done, total)` hears how the ranking of its tokens goes."""
    from spectool.llama.engine import Model

    out = cached_path(path, vocab)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)

    def rank() -> tuple:
        with Model(path, n_ctx=2048, **model_options) as m:
            # end-of-generation tokens stay proposable
            return (token_ranking(m, progress=progress), m.vocab_info(),
                    {i for i in range(m.n_vocab) if m.is_eog(i)})

    ranking, info, always = native.on_a_thread_of_its_own(rank)  # (its OpenMP threads end with it)
    # byte fallback
    always |= {i for i, t in enumerate(info.texts) if t.startswith(b"<0x") and len(t) == 6}
    always |= {i for i in (info.bos, info.eos) if i >= 0} | set(range(5))
    top = np.argsort(-ranking, kind="stable")
    keep = list(always)
    for i in top:
        if len(keep) >= vocab:
            break
        if int(i) not in always:
            keep.append(int(i))
    return prune(path, out, np.array(keep))
