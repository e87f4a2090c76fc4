"""`ParallelModel`: a Model whose one context holds several sequences (its n_seq_max), decoded
together: one llama_decode for the tokens of many (`eval_seqs`), each sequence rolled back on its
own (`Model.rollback(n, seq)`). What each sequence holds is `seqs[i]` (`seqs[0]` is `tokens`, the
sequence every other Model method works on).

A draft tree is verified in one decode too (`eval_tree`, then `keep_path`): each node is a row
at the position of its depth, in the sequences of the leaves under it, each leaf a spare sequence
that holds a copy of the history; llama.cpp's mask reads a row's first sequence id, so a node sees
the history and its ancestors, never a sibling's branch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from spectool.llama.engine import (DecodeError, Interrupt, Model, last_log_error,
                                   raise_pending_interrupt)
from spectool.llama.memory import kv_bytes_per_token
from spectool.llama.outputs import ROWS


@dataclass(frozen=True)
class Tree:
    """A draft tree: node i holds `tokens[i]` and follows node `parents[i]`; node 0, the root (the
    last token taken, not yet in the cache), has parent -1, every other a parent before it."""

    tokens: Sequence[int]
    parents: Sequence[int]

    def __post_init__(self):
        if len(self.tokens) != len(self.parents) or not self.tokens or self.parents[0] != -1 \
                or any(not 0 <= p < i for i, p in enumerate(self.parents) if i):
            raise ValueError("a tree's first node is its root; every other follows one before it")

    def depth(self, i: int) -> int:
        return 0 if i == 0 else 1 + self.depth(self.parents[i])

    def leaves(self) -> list[int]:
        """Its leaves, in order."""
        inner = set(self.parents)
        return [i for i in range(len(self.tokens)) if i not in inner]

    def under(self, i: int) -> list[int]:
        """The leaves whose path passes through node `i`, in order."""
        return [leaf for leaf in self.leaves() if i in self.path(leaf)]

    def path(self, i: int) -> list[int]:
        """The nodes from the root to node `i`."""
        return ([] if i == 0 else self.path(self.parents[i])) + [i]


class ParallelModel(Model):
    """A Model with `eval_seqs`: build it with `n_seq_max` > 1 (seq ids 0..n_seq_max-1) and
    `kv_unified`: one KV buffer for all sequences, or one stream each of n_ctx / n_seq_max cells
    (None: llama.cpp's default, one stream each). Its `n_ctx` is what one sequence may hold, as
    every check made for one generation measures it (the whole context: `n_ctx_total`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._leaf_seqs: dict[int, int] = {}  # a tree's leaves' sequences until keep_path
        self.n_ctx_total, self.n_ctx = self.n_ctx, self.n_ctx_seq
        self.kv_unified = bool(kwargs.get("kv_unified"))  # (llama.cpp's default: a stream each)

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

    def eval_tree(self, tree: Tree, seq: int = 0, spare: Sequence[int] | None = None) -> None:
        """One decode of `tree` after what sequence `seq` holds, every node with its logits row
        (`logits(i)`: the target after node i's path). Leaf k of the tree takes the empty sequence
        `spare[k]` (None: the ids after `seq`'s), which first gets a copy of `seq`'s history. Then
        `keep_path` settles it. Needs a unified KV cache (one stream for every sequence)."""
        if not self.kv_unified:  # llama.cpp copies a sequence's cells only within one stream
            raise DecodeError("a draft tree needs a unified KV cache (--kv-unified)")
        leaves, pos0 = tree.leaves(), len(self.seqs[seq])
        spare = list(spare if spare is not None else range(seq + 1, seq + 1 + len(leaves)))
        if len(spare) < len(leaves) or any(not 0 <= s < self.n_seq_max or s == seq or self.seqs[s]
                                           for s in spare[: len(leaves)]):
            raise DecodeError(f"a tree of {len(leaves)} leaves needs as many empty sequences")
        if pos0 + max(map(tree.depth, range(len(tree.tokens)))) >= self.n_ctx_seq:
            raise DecodeError(f"context full: sequence {seq} holds {pos0} tokens")
        b, n = self._batch, len(tree.tokens)
        if n > self.n_batch:
            raise DecodeError(f"a tree of {n} nodes > n_batch {self.n_batch}")
        self._leaf_seqs = dict(zip(leaves, spare))
        for leaf in leaves:  # (emptied first: a tree an error left unsettled leaves cells behind)
            self.lib.llama_memory_seq_rm(self._mem, self._leaf_seqs[leaf], -1, -1)
            self.lib.llama_memory_seq_cp(self._mem, seq, self._leaf_seqs[leaf], 0, pos0)
        if self._chain_output is not ROWS:
            self.sample_on_backend(ROWS)
            self._output_asked = None
        self._b_token[:n] = tree.tokens
        self._b_pos[:n] = [pos0 + tree.depth(i) for i in range(n)]
        for i in range(n):
            ids = ([seq] if i == 0 else []) + [self._leaf_seqs[leaf] for leaf in tree.under(i)]
            b.n_seq_id[i] = len(ids)
            for k, s in enumerate(ids):
                b.seq_id[i][k] = s
        self._b_out[:n] = [True] * n
        b.n_tokens, self._asked = n, ()
        self._n_out, self._rows, self.output = n, None, ROWS
        rc = self.lib.llama_decode(self._ctx, b)
        for i in range(n):
            b.n_seq_id[i], b.seq_id[i][0] = 1, 0
        self._tree, self._tree_seq = tree, seq
        if rc != 0:
            self._n_out = 0
            self.lib.llama_memory_seq_rm(self._mem, seq, pos0, -1)
            self.drop_tree()
            raise DecodeError(f"llama_decode failed (code {rc}) on a tree of {n} nodes: "
                              f"{last_log_error()}")
        self.seqs[seq].append(tree.tokens[0])  # the root is the sequence's (rollback drops it)
        if Interrupt.pending:
            raise_pending_interrupt()

    def keep_path(self, path: Sequence[int]) -> None:
        """After `eval_tree`: the nodes of `path` (the root, then each accepted node a child of the
        one before) are appended to the sequence; the rest of the tree and the leaves' sequences
        are dropped."""
        tree, seq = self._tree, self._tree_seq
        if not path or list(path) != tree.path(path[-1]):
            raise ValueError(f"{list(path)} is not a path from the tree's root")
        pos0 = len(self.seqs[seq]) - 1  # the root's position
        # the path's cells are those of any leaf under its last node, at the path's positions
        leaf = self._leaf_seqs[tree.under(path[-1])[0]]
        self.lib.llama_memory_seq_cp(self._mem, leaf, seq, pos0 + 1, pos0 + len(path))
        self.seqs[seq] += [tree.tokens[i] for i in path[1:]]
        self.drop_tree()

    def drop_tree(self) -> None:
        """The last tree's leaves' sequences emptied: by `keep_path`, or where an error came between
        it and `eval_tree` (the sequence itself rolls back as any does)."""
        for s in self._leaf_seqs.values():
            self.lib.llama_memory_seq_rm(self._mem, s, -1, -1)
        self._leaf_seqs = {}
