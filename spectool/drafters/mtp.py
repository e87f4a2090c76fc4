"""The target's own MTP (NextN) head as the drafter: its context (`MtpContext`, beside the target's,
through the target Model's public handles and decode listener) and the drafter that chains it
(`Mtp`)."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import Any, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.llama.engine import DecodeError, Model, ModelLoadError, last_log_error
from spectool.llama.outputs import ROWS
from spectool.core.grammar import Constraint
from spectool.core.evidence import MTP, Evidence
from spectool.core.evidence import Source
from spectool.core.verify import Random, Sampling
from spectool.core.protocol import EMPTY, Draft, Drafter, Estimate, no_grammar
from spectool.drafters.draw import draw


class HeadContext:
    """What a head's context beside its target (MtpContext, eagle3.Eagle3Context) shares: it hears
    the target's decodes from `covered` on (its `mirror`, a decode listener), decodes its own batch
    and hands out its rows."""

    name = "MTP context"  # in error messages
    output = ROWS  # rows are read on the host (verify.token_at / dist_at)
    target: Model
    covered: int
    lib: Any
    _ctx: Any
    _model: Any = None
    _ext: Any
    facts: Any  # a head file's facts: its layers (eagle3.py, dflash.py)
    n_layer: int  # the target's
    _e_x: np.ndarray
    _e_pos: np.ndarray
    _batch: Any
    n_embd: int
    n_vocab: int

    def catch_up(self) -> int:
        """Mirror what the target's cache holds that this head has not seen (a target that decoded
        before the head was there): those tokens are decoded again by the target, whose hidden
        states are only there right after a decode. Returns how many."""
        target = self.target
        start = min(self.covered, len(target.tokens))
        missing = target.tokens[start:]
        if missing:
            target.rollback(start)
            target.eval(missing, logits="none")
        return len(missing)

    def _side_by_side(self, n: int, n_embd: int) -> Any:
        """The head's decoder batch of `n` rows, token ids and `n_embd`-wide hidden states side by
        side (`_b_token`, `_b_pos`, `_b_out`, `_b_h` over it), each row of sequence 0."""
        lib = self.lib
        self._batch = b = lib.llama_batch_init(n, n_embd, 1)
        self._tokens = (lib.llama_token * n)()
        b.token = self._tokens
        self._b_token = np.ctypeslib.as_array(self._tokens, shape=(n,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(n,))
        self._b_out = np.ctypeslib.as_array(b.logits, shape=(n,))
        self._b_h = np.ctypeslib.as_array(b.embd, shape=(n, n_embd))
        one_sequence(b, n)
        return b

    def _beside(self, target: Model, path: Path, facts: Any, kind: str) -> None:
        """Check a head file's `facts` (None: the file is not `kind`, "an EAGLE-3 head") against
        `target`, and take the target's handles and sizes; a ModelLoadError says why not."""
        if facts is None:
            raise ModelLoadError(f"{path.name} is not {kind}")
        self.lib = native.lib()
        self.n_layer = int(self.lib.llama_model_n_layer(target.llama_model))
        problem = facts.problem(self.n_layer, target.n_embd)
        if problem:
            raise ModelLoadError(f"{path.name} cannot draft for {target.path.name}: {problem}")
        from llama_cpp import llama_cpp_ext

        self._ext, self.target, self.facts = llama_cpp_ext, target, facts
        self.n_vocab, self.n_ctx = target.n_vocab, target.n_ctx
        self._ctx = self._batch = None

    def _load_beside(self, path: Path, kind: str) -> None:
        """Load the head file `path` (a `kind`, for messages) into `_model`, with its own context
        `_ctx` beside the target's (ctx_other: the head borrows what it lacks of the target's)."""
        lib, target = self.lib, self.target
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = 999 if target.n_offloaded else 0
        mparams.use_extra_bufts = not native.avoid_amx()
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise ModelLoadError(f"cannot load {path.name}: {last_log_error()}")
        if int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model))) != self.n_vocab:
            self.close()
            raise ModelLoadError(f"{path.name} has another vocabulary than {target.path.name}")
        self.n_embd = int(lib.llama_model_n_embd(self._model))
        self._ctx = lib.llama_init_from_model(self._model, self._cparams())
        if not self._ctx:
            self.close()
            raise ModelLoadError(f"llama.cpp could not make a context for {path.name} ({kind}): "
                                 f"{last_log_error() or 'out of memory?'}")

    def _cparams(self) -> Any:
        """The head's context parameters: the target's context, batch and threads, beside the
        target's context (ctx_other)."""
        target = self.target
        cparams = self.lib.llama_context_default_params()
        cparams.n_ctx = target.n_ctx
        cparams.n_batch = cparams.n_ubatch = target.n_batch
        cparams.n_threads = cparams.n_threads_batch = target.n_threads
        cparams.no_perf = True
        cparams.ctx_other = target.llama_context
        return cparams

    def _feature_batch(self, n: int, output: bool) -> Any:
        """A batch of `n` rows of the target's features (`_e_pos`, `_e_x` over it): each its
        hidden states at the head's layers side by side, of sequence 0, an output row or not."""
        width = len(self.facts.layers) * self.target.n_embd
        e = self.lib.llama_batch_init(n, width, 1)
        self._e_pos = np.ctypeslib.as_array(e.pos, shape=(n,))
        self._e_x = np.ctypeslib.as_array(e.embd, shape=(n, width))
        np.ctypeslib.as_array(e.logits, shape=(n,))[:] = int(output)
        one_sequence(e, n)
        return e

    def _extract(self, on: bool) -> None:
        """Have the target keep (or stop keeping) its hidden states at the head's layers (a layer
        id equal to its layer count: its last hidden state)."""
        ctx = self.target.llama_context
        if not ctx:
            return
        set_inp = native.bind_ext("llama_set_embeddings_layer_inp", None,
                                  [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool])
        for lid in self.facts.layers:
            if lid < self.n_layer:
                set_inp(ctx, lid, on)
            else:
                self._ext.llama_set_embeddings_nextn(ctx, on, False)

    def _features(self, n: int) -> None:
        """The target's last decode's hidden states at the head's layers, side by side, into the
        feature batch's first `n` rows."""
        d, ctx = self.target.n_embd, self.target.llama_context
        layer_inp = native.bind_ext("llama_get_embeddings_layer_inp",
                                    ctypes.POINTER(ctypes.c_float),
                                    [ctypes.c_void_p, ctypes.c_uint32])
        for k, lid in enumerate(self.facts.layers):
            ptr = (layer_inp(ctx, lid) if lid < self.n_layer
                   else self._ext.llama_get_embeddings_nextn(ctx))
            self._e_x[:n, k * d:(k + 1) * d] = np.ctypeslib.as_array(ptr, shape=(n, d))

    def _free_beside(self) -> None:
        """Free the context and model _load_beside made, the target no longer heard or asked to
        keep the head's layers."""
        if self._ctx:
            self.target.remove_decode_listener(self.mirror)
            self._extract(False)
            self.lib.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            self.lib.llama_model_free(self._model)
            self._model = None

    def mirror(self, tokens: Sequence[int], pos0: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _decode(self, n: int) -> None:
        self._batch.n_tokens = n
        rc = self.lib.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise DecodeError(f"llama_decode failed in the {self.name} (code {rc}): "
                              f"{last_log_error()}")

    def logits(self, i: int = -1) -> np.ndarray:
        ptr = self.lib.llama_get_logits_ith(self._ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))


class MtpContext(HeadContext):
    """The MTP (NextN) head of a target loaded with `load_mtp`, in a context of its own (llama.cpp's
    LLAMA_CONTEXT_TYPE_MTP, as common/speculative.cpp's draft-mtp makes it). Its input at position p
    is the token there with the target's hidden state at p - 1 (llama_get_embeddings_nextn); its
    output predicts the token at p + 1, and its own hidden state feeds its next position while it
    drafts. `mirror`, a decode listener of the target, keeps its cache in step with the target's
    decodes; `step` drafts one token."""

    def __init__(self, target: Model):
        if not target.n_nextn:
            raise ModelLoadError(f"{target.path.name} has no MTP heads (NextN layers)")
        from llama_cpp import llama_cpp_ext

        lib = self.lib = native.lib()
        self._ext = llama_cpp_ext
        self.target = target
        self.n_vocab = target.n_vocab
        self.n_ctx = target.n_ctx
        self.n_embd = target.n_embd
        cparams = self._cparams()
        cparams.ctx_type = lib.LLAMA_CONTEXT_TYPE_MTP
        self._ctx = lib.llama_init_from_model(target.llama_model, cparams)
        if not self._ctx:
            raise ModelLoadError(f"llama.cpp could not make an MTP context for {target.path.name}: "
                                 f"{last_log_error() or 'out of memory?'}")
        other = llama_cpp_ext.llama_get_ctx_other(self._ctx)
        if other and _address(other) == _address(target.llama_context):
            # Gemma 4's assistants: all heads in one graph over the target's own cache
            lib.llama_free(self._ctx)
            raise ModelLoadError(f"{target.path.name}'s MTP heads share the target's cache: not "
                                 "supported yet")
        self._mem = lib.llama_get_memory(self._ctx)
        # every row's hidden state
        llama_cpp_ext.llama_set_embeddings_nextn(target.llama_context, True, False)
        llama_cpp_ext.llama_set_embeddings_nextn(self._ctx, True, True)  # the output rows' only
        n = self.n_batch = target.n_batch
        self._side_by_side(n, self.n_embd)
        # position -> the target's hidden state there (its latest decode)
        self.h: dict[int, np.ndarray] = {}
        self._last_h = np.zeros(self.n_embd, np.float32)
        target.add_decode_listener(self.mirror)  # from now on every target decode reaches the head
        self.covered = 0  # the target's first positions mirrored here without a gap

    def mirror(self, tokens: Sequence[int], pos0: int) -> None:
        """After the target decoded `tokens` from position pos0: the same tokens here, each with the
        target's hidden state at the position before it (the first with the one kept from an earlier
        decode, zeros at the start), and the target's states kept for drafting."""
        n = len(tokens)
        rows = np.ctypeslib.as_array(
            self._ext.llama_get_embeddings_nextn(self.target.llama_context), shape=(n, self.n_embd)
        )
        self.lib.llama_memory_seq_rm(self._mem, 0, pos0, -1)
        self._b_token[:n] = tokens
        self._b_pos[:n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self._b_out[:n] = 0
        self._b_h[0] = self.h.get(pos0 - 1, self._last_h) if pos0 else 0.0
        self._b_h[1:n] = rows[: n - 1]
        self._decode(n)
        self.h = {pos0 + i: rows[i].copy() for i in range(n)} | {p: v for p, v in self.h.items()
                                                                 if p < pos0}
        self._last_h = self.h[pos0 + n - 1]
        if pos0 <= self.covered:
            self.covered = pos0 + n

    def step(self, token: int, pos: int, h: np.ndarray) -> np.ndarray:
        """The head on `token` at `pos` with hidden state `h` (the target's at pos - 1, or this
        head's own output for the token before): its logits row predicts the token at pos + 1;
        returns the head's hidden state."""
        self.lib.llama_memory_seq_rm(self._mem, 0, pos, -1)
        self._b_token[0], self._b_pos[0], self._b_out[0], self._b_h[0] = token, pos, 1, h
        self._decode(1)
        return np.ctypeslib.as_array(self._ext.llama_get_embeddings_nextn_ith(self._ctx, 0),
                                     shape=(self.n_embd,)).copy()

    def close(self) -> None:
        if self._batch is not None:
            # ours, not llama_batch_init's
            self._batch.token = ctypes.POINTER(self.lib.llama_token)()
            self.lib.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            self.target.remove_decode_listener(self.mirror)
            if self.target.llama_context:
                self._ext.llama_set_embeddings_nextn(self.target.llama_context, False, False)
            self.lib.llama_free(self._ctx)
            self._ctx = None


def one_sequence(batch: Any, n: int) -> None:
    """Every one of a llama_batch's `n` rows in sequence 0 alone."""
    np.ctypeslib.as_array(batch.n_seq_id, shape=(n,))[:] = 1
    for i in range(n):
        batch.seq_id[i][0] = 0


def _address(pointer) -> int | None:
    return ctypes.cast(pointer, ctypes.c_void_p).value


class Mtp(Drafter):
    """The target's own MTP (NextN) head as the drafter (MtpContext, which mirrors the target's
    decodes into the head's context as they happen), and a draft chains the head from the last
    position whose hidden state the target computed, through any tokens after it (a hybrid's lookup
    tokens), then on its own outputs, as llama.cpp's draft-mtp does. Its rows go through the
    target's sampler chain, so q is the distribution each draft was drawn from."""

    source, evidence = Source.mtp, MTP  # what its drafts are counted as (Eagle3's: the head's)

    def __init__(self, head, p_min: float = 0.0):
        self.head, self.p_min = head, p_min

    def start(self, history: Sequence[int], constraint: Constraint | None = None) -> None:
        no_grammar(constraint)
        # the target's prefill reached the head through its listener, unless it came earlier
        self.head.catch_up()

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> list[Evidence]:
        return [self.evidence] * max(0, min(k_max, self.head.n_ctx - len(history)))

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: Random,
                constraint: Constraint | None = None) -> Draft:
        head, n = self.head, len(history)
        k = min(k, head.n_ctx - n)
        # the last position whose hidden state the target made
        q0 = min(n - 2, len(head.target.tokens) - 1)
        h = head.h.get(q0)
        if k <= 0 or h is None:
            return EMPTY
        t0 = time.perf_counter()
        # tokens the target has not seen yet (lookup's, in a hybrid draft)
        for pos in range(q0 + 1, n - 1):
            h = head.step(history[pos], pos, h)
        catch_up = time.perf_counter() - t0 if n - 1 - (q0 + 1) > 2 else 0.0
        h = head.step(history[-1], n - 1, h)  # the first draft's row

        # draft i at position n + i, on the head's own hidden state
        def advance(token: int, i: int) -> None:
            nonlocal h
            h = head.step(token, n + i, h)

        recent = list(history[-sampling.window:]) if sampling.window else []
        tokens, qs = draw(head, 0, k, advance, sampling, rng, recent, self.p_min,
                          constraint=constraint)
        return (Draft(tokens, None if sampling.greedy else qs, self.source, catch_up) if tokens
                else EMPTY)
