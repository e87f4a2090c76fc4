"""A DFlash head (`-md HEAD.gguf`, llama.cpp's dflash architecture: block-diffusion drafting) as the
drafter: what a head file asks of its target (`head_facts`), its context beside the target's
(`DflashContext`: the target's inputs at the head's layers injected into the head's cache at the
target's positions, through the target's decode listener), and the drafter that denoises a whole
block in one decode (`Dflash`), as common/speculative.cpp's draft-dflash does (plain DFlash: not
DSpark's Markov head, not DFlash2's selector)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.evidence import DFLASH, Evidence, Source
from spectool.core.grammar import Constraint
from spectool.core.protocol import EMPTY, Draft, Drafter, Estimate, no_grammar
from spectool.core.verify import Random, Sampling
from spectool.drafters.eagle3 import head_metadata
from spectool.drafters.mtp import HeadContext, one_sequence
from spectool.llama.engine import DecodeError, Model, ModelLoadError, last_log_error

ARCH = "dflash"
TOP_K = 10  # draft-dflash reads each block position through a top-k 10 sampler


@dataclass(frozen=True)
class HeadFacts:
    """What a DFlash head reads of its target: the layers whose inputs it fuses, the width it was
    made for, the block it denoises (`block_size`: the last token and block_size - 1 masks), whether
    its block attends causally, and whether it is DFlash2 (a selector) or DSpark (a Markov head),
    which spectool does not run."""

    layers: tuple[int, ...]
    width: int
    block_size: int
    causal: bool = False
    selector: bool = False
    markov: bool = False
    mode = "dflash"  # the --spec that drafts with it

    def describe(self) -> str:
        """What the head is and reads (spectool check)."""
        return (f"a DFlash head; it reads the target's inputs at layers "
                f"{', '.join(map(str, self.layers))} (width {self.width}) and drafts up to "
                f"{self.block_size - 1} tokens a block (block size {self.block_size})")

    def problem(self, n_layer: int, n_embd: int) -> str | None:
        """Why the head cannot draft for a target of `n_layer` layers and width `n_embd`."""
        if self.selector:
            return "the head is a DFlash2 head (a selector): not supported yet"
        if self.markov:
            return "the head is a DSpark head (a Markov head): not supported yet"
        if n_embd != self.width:
            return f"the head reads a target of width {self.width}, not {n_embd}"
        if not self.layers:
            return "the head names no target layers"
        if max(self.layers) >= n_layer:  # llama.cpp keeps the inputs of the target's layers only
            return f"the head reads layer {max(self.layers)}; the target has {n_layer}"
        if self.block_size < 2:
            return f"the head's block size is {self.block_size}: it drafts nothing"
        return None


def head_facts(path: str | Path) -> HeadFacts | None:
    """The facts of a DFlash head file (its metadata only; None for any other model)."""
    meta = head_metadata(path, ARCH, ("target_layers", "embedding_length", "block_size",
                                      "attention.causal", "selector_top_k"), tensors=True)
    if meta is None:
        return None
    return HeadFacts(tuple(int(i) for i in meta.get(f"{ARCH}.target_layers", ())),
                     int(meta.get(f"{ARCH}.embedding_length", 0)),
                     int(meta.get(f"{ARCH}.block_size", 16)),  # llama.cpp's default
                     bool(meta.get(f"{ARCH}.attention.causal", False)),
                     int(meta.get(f"{ARCH}.selector_top_k", 0)) > 0,
                     "markov_w1.weight" in meta.get("tensors", ()))  # as llama.cpp tells DSpark


def is_head(path: str | Path) -> bool:
    """Whether `path` is a DFlash head (a file that cannot be read is not)."""
    try:
        return head_facts(path) is not None
    except ModelLoadError:
        return False


class DflashContext(HeadContext):
    """A DFlash head in a context of its own beside the target's (ctx_other: the head borrows the
    target's token embeddings and output layer where it has none). `mirror`, a decode listener of
    the target, injects the target's inputs at the head's layers into the head's cache at the
    target's positions (its fc and norm, then each layer's K and V: an embeddings batch); `draft`
    decodes the noise block [last token, mask, ...] after them, non-causally, and reads its
    tokens. The cache past the target's positions is dropped before each."""

    name = "DFlash head"

    def __init__(self, target: Model, path: str | Path):
        self._beside(target, Path(path), head_facts(path), "a DFlash head")
        lib, facts = self.lib, self.facts
        self._inject: Any = None
        self._load_beside(Path(path), "a DFlash head")
        self.mask = int(lib.llama_vocab_mask(lib.llama_model_get_vocab(self._model)))
        if self.mask < 0:
            self.close()
            raise ModelLoadError(f"{Path(path).name} names no mask token "
                                 "(tokenizer.ggml.mask_token_id)")
        self._ext.llama_set_embeddings_nextn(self._ctx, True, True)  # as draft-dflash does
        lib.llama_set_causal_attn(self._ctx, facts.causal)
        self._mem = lib.llama_get_memory(self._ctx)
        self._make_batches()
        self._extract(True)
        target.add_decode_listener(self.mirror)
        self.covered = 0  # the target's first positions mirrored here without a gap

    @property
    def n_max(self) -> int:
        """The most tokens a draft has: the block's masks."""
        return self.facts.block_size - 1

    def _make_batches(self) -> None:
        """The noise block's batch (token ids) and the injection's (the target's features, one row
        of every layer's input a position)."""
        lib, n = self.lib, self.target.n_batch
        self._batch = b = lib.llama_batch_init(self.facts.block_size, 0, 1)
        self._b_token = np.ctypeslib.as_array(b.token, shape=(self.facts.block_size,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(self.facts.block_size,))
        np.ctypeslib.as_array(b.logits, shape=(self.facts.block_size,))[:] = 1
        one_sequence(b, self.facts.block_size)
        self._inject = self._feature_batch(n, False)

    def mirror(self, tokens: Sequence[int], pos0: int) -> None:
        """After the target decoded `tokens` from position pos0: their features, injected into
        the head's cache at the same positions (what was there from pos0 on is dropped first)."""
        n = len(tokens)
        self._features(n)
        self._e_pos[:n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.lib.llama_memory_seq_rm(self._mem, 0, pos0, -1)
        self._inject.n_tokens = n
        rc = self.lib.llama_decode(self._ctx, self._inject)
        if rc != 0:
            raise DecodeError(f"the DFlash injection failed (code {rc}): {last_log_error()}")
        if pos0 <= self.covered:
            self.covered = pos0 + n

    def draft(self, last: int, pos: int, n: int, p_min: float) -> list[int]:
        """The block [last, mask * n] at pos.. decoded at once: the top token of each mask's row,
        up to the first whose probability among the row's TOP_K best is below `p_min`."""
        self.lib.llama_memory_seq_rm(self._mem, 0, pos, -1)
        self._b_token[0], self._b_token[1:n + 1] = last, self.mask
        self._b_pos[:n + 1] = np.arange(pos, pos + n + 1, dtype=np.int32)
        self._decode(n + 1)
        tokens: list[int] = []
        for i in range(1, n + 1):
            row = self.logits(i)
            t = int(np.argmax(row))
            top = np.partition(row, -TOP_K)[-TOP_K:] if len(row) > TOP_K else row
            if 1.0 / float(np.exp(top - row[t], dtype=np.float32).sum()) < p_min:
                break
            tokens.append(t)
        return tokens

    def close(self) -> None:
        lib = self.lib
        for batch in (self._batch, self._inject):
            if batch is not None:
                lib.llama_batch_free(batch)
        self._batch = self._inject = None
        self._free_beside()


class Dflash(Drafter):
    """The DFlash head as the drafter: after the target decoded the history but its last token,
    one decode of the noise block drafts up to `n_max` tokens (the session's --draft-max, at most
    the head's block less one), of which a step takes the first k, as llama.cpp's draft-dflash
    drafts n_max and cuts to the budget. Its drafts are the head's top tokens, at any temperature:
    deterministic (q one-hot), so the acceptance rule stays exact."""

    source, evidence = Source.dflash, DFLASH

    def __init__(self, head: DflashContext, p_min: float = 0.0, n_max: int = 0):
        self.head, self.p_min = head, p_min
        self.n_max = min(n_max, head.n_max) if n_max > 0 else head.n_max

    def start(self, history: Sequence[int], constraint: Constraint | None = None) -> None:
        no_grammar(constraint)
        # the target's prefill reached the head through its listener, unless it came earlier
        self.head.catch_up()

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> list[Evidence]:
        return [self.evidence] * max(0, min(k_max, self.n_max, self.head.n_ctx - len(history)))

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: Random,
                constraint: Constraint | None = None) -> Draft:
        head, n = self.head, len(history)
        k = min(k, self.n_max, head.n_ctx - n)
        # the head needs the target's features of every token before the last
        if k <= 0 or min(head.covered, len(head.target.tokens)) < n - 1:
            return EMPTY
        n_block = min(self.n_max, head.n_ctx - n)
        tokens = head.draft(history[-1], n - 1, n_block, self.p_min)[:k]
        return Draft(tokens, None, self.source) if tokens else EMPTY
