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
from itertools import accumulate
from typing import Mapping, Sequence

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

    def __init__(self, *args, slots: int | None = None, **kwargs):
        """`slots` (with `kv_unified`): that many sequences generate, the others hold draft trees'
        leaves; each of the first holds at most n_ctx / slots tokens, as one stream each would."""
        super().__init__(*args, **kwargs)
        # each tree's sequence: the tree, and its leaves' sequences, until keep_path
        self._trees: dict[int, tuple[Tree, dict[int, int]]] = {}
        if slots and kwargs.get("kv_unified"):
            self.n_ctx_seq = self.n_ctx // slots
        self.n_ctx_total, self.n_ctx = self.n_ctx, self.n_ctx_seq
        self.kv_unified = bool(kwargs.get("kv_unified"))  # (llama.cpp's default: a stream each)

    def kv_cache_bytes(self) -> int:
        """What its KV cache takes, every sequence's cells (memory.kv_bytes_per_token)."""
        return self.n_ctx_total * kv_bytes_per_token(self.lib, self._model)

    def eval_seqs(self, parts: Sequence[tuple[int, Sequence[int] | Tree]], *,
                  logits: bool = True, spares: Mapping[int, Sequence[int]] | None = None
                  ) -> list[int]:
        """One decode of several sequences' tokens, `parts` (seq id, tokens), each appended to
        what its sequence holds, every token with its logits row (or none); returns where each
        part's rows start among the decode's outputs (`logits(i)`). A part may be a draft Tree
        instead (node i's row: the target after node i's path), which `keep_path` then settles: its
        leaf k takes the empty sequence `spares[seq][k]` (none given: the ids after `seq`'s), which
        first gets a copy of `seq`'s history; trees need a unified KV cache (one stream for every
        sequence). Whole rows only: nothing is sampled in the graph. The decode listeners, which
        follow sequence 0, do not hear of it."""
        leaves = {s: self._leaves(s, part, spares) for s, part in parts if isinstance(part, Tree)}
        taken = [s for s, _ in parts] + [leaf for m in leaves.values() for leaf in m.values()]
        if len(set(taken)) < len(taken):
            raise DecodeError("two parts of one decode share a sequence")
        rows = [self._rows_of(s, part, leaves.get(s, {})) for s, part in parts]
        n = sum(map(len, rows))
        if n > self.n_batch:
            raise DecodeError(f"{n} tokens in one batch > n_batch {self.n_batch}")
        for (s, _), its in zip(parts, rows):
            if its and max(pos for _, pos, _ in its) >= self.n_ctx_seq:
                raise DecodeError(f"context full: sequence {s} holds {len(self.seqs[s])} + "
                                  f"{len(its)} tokens > {self.n_ctx_seq}")
        self._plant({s: (part, leaves[s]) for s, part in parts if isinstance(part, Tree)})
        if self._chain_output is not ROWS:
            self.sample_on_backend(ROWS)
            self._output_asked = None  # the next eval sets its chain again
        b, starts = self._batch, list(accumulate(map(len, rows), initial=0))[:-1]
        for j, (token, pos, ids) in enumerate(row for its in rows for row in its):
            self._b_token[j], self._b_pos[j], b.n_seq_id[j] = token, pos, len(ids)
            for k, s in enumerate(ids):
                b.seq_id[j][k] = s
        self._b_out[:n] = [logits] * n
        b.n_tokens, self._asked = n, ()  # eval writes its output flags again
        self._n_out, self._rows, self.output = n if logits else 0, None, ROWS
        rc = self.lib.llama_decode(self._ctx, b)
        for j in range(n):  # eval's rows all belong to sequence 0
            b.n_seq_id[j], b.seq_id[j][0] = 1, 0
        if rc != 0:
            self._n_out = 0
            for s, _ in parts:
                self.lib.llama_memory_seq_rm(self._mem, s, len(self.seqs[s]), -1)
            self.drop_tree()
            raise DecodeError(f"llama_decode failed (code {rc}) on {n} tokens of {len(parts)} "
                              f"sequences: {last_log_error()}")
        for s, part in parts:  # (a tree's root is its sequence's: a rollback drops it)
            self.seqs[s] += part.tokens[:1] if isinstance(part, Tree) else part
        if Interrupt.pending:
            raise_pending_interrupt()
        return starts

    def _rows_of(self, seq: int, part: Sequence[int] | Tree,
                 leaves: Mapping[int, int]) -> list[tuple[int, int, list[int]]]:
        """A part's rows: (token, position, sequence ids), a tree's nodes in the sequences of the
        leaves under them (`leaves`: each leaf's)."""
        pos0 = len(self.seqs[seq])
        if not isinstance(part, Tree):
            return [(t, pos0 + i, [seq]) for i, t in enumerate(part)]
        return [(t, pos0 + part.depth(i),
                 ([seq] if i == 0 else []) + [leaves[leaf] for leaf in part.under(i)])
                for i, t in enumerate(part.tokens)]

    def _leaves(self, seq: int, tree: Tree,
                spares: Mapping[int, Sequence[int]] | None) -> dict[int, int]:
        """Each leaf of `seq`'s tree with the empty sequence it takes: `spares[seq]`'s, else the
        ids after `seq`."""
        if not self.kv_unified:  # llama.cpp copies a sequence's cells only within one stream
            raise DecodeError("a draft tree needs a unified KV cache (--kv-unified)")
        leaves = tree.leaves()
        spare = list(spares[seq] if spares is not None and seq in spares
                     else range(seq + 1, seq + 1 + len(leaves)))
        if len(spare) < len(leaves) or any(not 0 <= s < self.n_seq_max or s == seq or self.seqs[s]
                                           for s in spare[: len(leaves)]):
            raise DecodeError(f"a tree of {len(leaves)} leaves needs as many empty sequences")
        return dict(zip(leaves, spare))

    def _plant(self, trees: Mapping[int, tuple[Tree, dict[int, int]]]) -> None:
        """Each tree's leaves' sequences (emptied first: a tree an error left unsettled leaves
        cells behind) given a copy of their sequence's history."""
        self.drop_tree()
        for seq, (tree, leaves) in trees.items():
            self._trees[seq] = (tree, leaves)
            for leaf in leaves.values():
                self.lib.llama_memory_seq_rm(self._mem, leaf, -1, -1)
                self.lib.llama_memory_seq_cp(self._mem, seq, leaf, 0, len(self.seqs[seq]))

    def eval_tree(self, tree: Tree, seq: int = 0, spare: Sequence[int] | None = None) -> None:
        """One decode of `tree` after what sequence `seq` holds (`eval_seqs` of that tree alone,
        its leaves in the sequences `spare`)."""
        self.eval_seqs([(seq, tree)], spares=None if spare is None else {seq: spare})

    def keep_path(self, path: Sequence[int], seq: int = 0) -> None:
        """After `eval_seqs` with a tree for sequence `seq`: the nodes of `path` (the root, then
        each accepted node a child of the one before) are appended to the sequence; the rest of the
        tree and its leaves' sequences are dropped."""
        if seq not in self._trees:
            raise ValueError(f"sequence {seq} has no draft tree to settle")
        tree, leaf_seq = self._trees[seq]
        if not path or list(path) != tree.path(path[-1]):
            raise ValueError(f"{list(path)} is not a path from the tree's root")
        pos0 = len(self.seqs[seq]) - 1  # the root's position
        # the path's cells are those of any leaf under its last node, at the path's positions
        leaf = leaf_seq[tree.under(path[-1])[0]]
        self.lib.llama_memory_seq_cp(self._mem, leaf, seq, pos0 + 1, pos0 + len(path))
        self.seqs[seq] += [tree.tokens[i] for i in path[1:]]
        self.drop_tree(seq)

    def drop_tree(self, seq: int | None = None) -> None:
        """Sequence `seq`'s tree's leaves' sequences emptied (None: every tree's): by `keep_path`,
        or where an error came between it and `eval_seqs` (the sequence itself rolls back as any
        does)."""
        for s in [seq] if seq is not None else list(self._trees):
            for leaf in self._trees.pop(s, (None, {}))[1].values():
                self.lib.llama_memory_seq_rm(self._mem, leaf, -1, -1)
