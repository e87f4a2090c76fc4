"""`ParallelModel`: a Model whose one context holds several sequences (its n_seq_max), decoded
together: one llama_decode for the tokens of many (`eval_seqs`), each sequence rolled back on its
own (`Model.rollback(n, seq)`). What each sequence holds is `seqs[i]` (`seqs[0]` is `tokens`, the
sequence every other Model method works on)."""

from __future__ import annotations

from typing import Sequence

from spectool.llama.engine import (DecodeError, Interrupt, Model, last_log_error,
                                   raise_pending_interrupt)
from spectool.llama.memory import kv_bytes_per_token
from spectool.llama.outputs import ROWS


class ParallelModel(Model):
    """A Model with `eval_seqs`: build it with `n_seq_max` > 1 (seq ids 0..n_seq_max-1) and
    `kv_unified`: one KV buffer for all sequences, or one stream each of n_ctx / n_seq_max cells
    (None: llama.cpp's default, one stream each). Its `n_ctx` is what one sequence may hold, as
    every check made for one generation measures it (the whole context: `n_ctx_total`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.n_ctx_total, self.n_ctx = self.n_ctx, self.n_ctx_seq

    def kv_cache_bytes(self) -> int:
        """What its KV cache takes, every sequence's cells (memory.kv_bytes_per_token)."""
        return self.n_ctx_total * kv_bytes_per_token(self.lib, self._model)

    def eval_seqs(self, parts: Sequence[tuple[int, Sequence[int]]], *,
                  logits: bool = True) -> list[int]:
        """One decode of several sequences' tokens, `parts` (seq id, tokens), each appended to
        what its sequence holds, every token with its logits row (or none); returns where each
        part's rows start among the decode's outputs (`logits(i)`). Whole rows only: nothing is
        sampled in the graph. The decode listeners, which follow sequence 0, do not hear of it."""
        n = sum(len(tokens) for _, tokens in parts)
        if n > self.n_batch:
            raise DecodeError(f"{n} tokens in one batch > n_batch {self.n_batch}")
        for s, tokens in parts:
            if len(self.seqs[s]) + len(tokens) > self.n_ctx_seq:
                raise DecodeError(f"context full: sequence {s} holds {len(self.seqs[s])} + "
                                  f"{len(tokens)} tokens > {self.n_ctx_seq}")
        if self._chain_output is not ROWS:
            self.sample_on_backend(ROWS)
            self._output_asked = None  # the next eval sets its chain again
        b, starts, j = self._batch, [], 0
        for s, tokens in parts:
            starts.append(j)
            self._b_token[j : j + len(tokens)] = tokens
            self._b_pos[j : j + len(tokens)] = range(len(self.seqs[s]),
                                                     len(self.seqs[s]) + len(tokens))
            for row in range(j, j + len(tokens)):
                b.seq_id[row][0] = s
            j += len(tokens)
        self._b_out[:n] = [logits] * n
        b.n_tokens, self._asked = n, ()  # eval writes its output flags again
        self._n_out, self._rows, self.output = n if logits else 0, None, ROWS
        rc = self.lib.llama_decode(self._ctx, b)
        for row in range(n):  # eval's rows all belong to sequence 0
            b.seq_id[row][0] = 0
        if rc != 0:
            self._n_out = 0
            for s, _ in parts:
                self.lib.llama_memory_seq_rm(self._mem, s, len(self.seqs[s]), -1)
            raise DecodeError(f"llama_decode failed (code {rc}) on {n} tokens of {len(parts)} "
                              f"sequences: {last_log_error()}")
        for s, tokens in parts:
            self.seqs[s] += tokens
        if Interrupt.pending:
            raise_pending_interrupt()
        return starts
