"""Draft trees verified in one decode (ParallelModel.eval_tree and keep_path), on the generated tiny
target: each node's row is the row that decoding its path one sequence at a time gives, up to the
rounding of another batch shape (docs/exactness.md); a node never sees a sibling's branch; after
keep_path the sequence holds the accepted path alone, and what runs beside it in other sequences is
untouched."""

import numpy as np
import pytest
from exactness import N_JOINT, N_RUNS, SAMPLING, chi2_rejects, exact_joint
from spectool_lab.helpers import tokens_of

from spectool.core.verify import Sampling, accept_tree, distribution, greedy_token
from spectool.generate.loop import GenerationConfig
from spectool.llama.engine import DecodeError
from spectool.llama.parallel import ParallelModel, Tree

PROMPT = "def add(a, b):\n    return a + b\n\ndef greet(name):"
# another batch shape rounds a little differently; a different history is far from it (test_parallel)
CLOSE, FAR = 1e-2, 0.1


@pytest.fixture(scope="module")
def trees(tiny):
    with ParallelModel(tiny["target"], n_ctx=8 * 256, n_threads=2, n_seq_max=8,
                       kv_unified=True) as m:
        yield m


def shape(target):
    """A tree of 8 nodes over 4 leaves: root x; a and b after it; c, d after a; e after b, f after
    e; g after f, h after e (depths 1-4)."""
    words = target.tokenize(" the cat sat on a mat and ran", add_special=False)
    return Tree(tokens=[target.tokenize(PROMPT)[-1], *words[:7]],
                parents=[-1, 0, 0, 1, 1, 2, 5, 5])


def alone(target, tokens):
    """The row a one-sequence model gives after `tokens`, decoded as one prompt."""
    target.reset()
    target.eval(tokens)
    return target.logits().copy()


def test_each_node_s_row_is_its_path_s_row_decoded_alone(target, trees):
    history = target.tokenize(PROMPT)[:-1]
    tree = shape(target)
    trees.reset()
    trees.eval(history, logits="none")
    trees.eval_tree(tree)
    rows = [trees.logits(i).copy() for i in range(len(tree.tokens))]
    for i, row in enumerate(rows):
        path = [tree.tokens[j] for j in tree.path(i)]
        assert np.abs(row - alone(target, history + path)).max() < CLOSE, i
    # the negative control: node e (after b) against the history that runs through its sibling a
    sibling = [tree.tokens[j] for j in (0, 1, 5)]
    assert np.abs(rows[5] - alone(target, history + sibling)).max() > FAR
    trees.keep_path([0])
    assert trees.seqs[0] == history + tree.tokens[:1]


def test_the_kept_path_is_the_sequence_and_the_rest_is_gone(target, trees):
    """keep_path([root, b, e]): the sequence holds the history and that path, the leaves' sequences
    are empty, and the next decode is the one after that path alone (a branch left in the cache
    would move it)."""
    history = target.tokenize(PROMPT)[:-1]
    tree = shape(target)
    trees.reset()
    trees.eval(history, logits="none")
    trees.eval_tree(tree)
    trees.keep_path([0, 2, 5])
    kept = history + [tree.tokens[i] for i in (0, 2, 5)]
    assert trees.seqs[0] == kept
    mem = trees.lib.llama_get_memory(trees._ctx)
    assert all(trees.lib.llama_memory_seq_pos_max(mem, s) == -1 for s in range(1, 8))
    assert trees.lib.llama_memory_seq_pos_max(mem, 0) == len(kept) - 1
    nxt = target.tokenize(" now", add_special=False)
    trees.eval_seqs([(0, nxt)])
    assert np.abs(trees.logits(len(nxt) - 1) - alone(target, kept + nxt)).max() < CLOSE
    with pytest.raises(ValueError, match="not a path"):
        trees.keep_path([0, 5])


def test_a_tree_beside_another_sequence_leaves_it_untouched(target, trees):
    """In a batch: sequence 3 holds its own prompt; a tree on sequence 0 takes spare sequences 4-7,
    and sequence 3's next row is still what its prompt alone gives. Spare sequences must be empty."""
    history, other = target.tokenize(PROMPT)[:-1], target.tokenize("The quick brown fox")
    tree = shape(target)
    trees.reset()
    trees.eval_seqs([(0, history), (3, other[:-1])], logits=False)
    with pytest.raises(DecodeError, match="needs as many empty sequences"):
        trees.eval_tree(tree, spare=[3, 4, 5, 6])
    trees.eval_tree(tree, spare=[4, 5, 6, 7])
    assert np.abs(trees.logits(7) - alone(target, history + [tree.tokens[i] for i in tree.path(7)])
                  ).max() < CLOSE
    trees.keep_path([0, 1])
    trees.eval_seqs([(3, other[-1:])])
    assert np.abs(trees.logits(0) - alone(target, other)).max() < CLOSE
    assert trees.seqs[3] == other and trees.seqs[0] == history + [tree.tokens[i] for i in (0, 1)]


def test_a_tree_needs_a_unified_cache(tiny, target):
    """With a stream of cells for each sequence, llama.cpp cannot copy the history into a leaf's
    sequence (it aborts the process): refused before, in one line."""
    with ParallelModel(tiny["target"], n_ctx=4 * 256, n_threads=2, n_seq_max=4) as m:
        m.eval(target.tokenize(PROMPT)[:-1], logits="none")
        with pytest.raises(DecodeError, match="needs a unified KV cache"):
            m.eval_tree(shape(target))


LOOP = "the dog the fox the dog the fox the dog the fox the dog the"  # the tiny target loops after it


def top(target, history, k=2):
    """The target's k likeliest tokens after `history` (one-sequence model)."""
    target.sync(history)
    return [int(t) for t in np.argsort(-target.logits())[:k]]


def grown(target, history):
    """A deterministic tree for `history` (its last token the root): the target's top two after it,
    the top two after each of those, and the top one after the first's first (9 nodes, depth 3)."""
    tokens, parents = [history[-1]], [-1]
    for a in top(target, history):
        tokens.append(a), parents.append(0)
        at = len(tokens) - 1
        for b in top(target, history + [a]):
            tokens.append(b), parents.append(at)
    tokens.append(top(target, history + tokens[1:3], k=1)[0]), parents.append(2)
    return Tree(tokens, parents)


class TreeSteps:
    """Steps of trees from `grown`, verified by eval_tree, each node's row read as `sampling`'s
    distribution (or argmax), cached by history (the rows are fixed by it)."""

    def __init__(self, trees, target, sampling):
        self.trees, self.target, self.s, self.cache = trees, target, sampling, {}

    def rows(self, history):
        if tuple(history) not in self.cache:
            tree = grown(self.target, history)
            self.trees.reset()
            self.trees.eval(history[:-1], logits="none")
            self.trees.eval_tree(tree)
            rows = [self.trees.logits(i).astype(np.float32) for i in range(len(tree.tokens))]
            self.trees.keep_path([0])
            self.cache[tuple(history)] = tree, rows
        return self.cache[tuple(history)]

    def generate(self, prompt, n, token_of, rule=accept_tree, depths=None):
        """n tokens after `prompt`, a tree step at a time; `token_of(row)` the target's token from
        a node's row; each step's accepted depth into `depths`."""
        out = []
        while len(out) < n and not (out and self.target.is_eog(out[-1])):
            tree, rows = self.rows(prompt + out)
            path, t = rule(lambda i: token_of(rows[i]), tree.tokens, tree.parents)
            out += [tree.tokens[i] for i in path[1:]] + [t]
            if depths is not None:
                depths.append(len(path) - 1)
        return out


def test_greedy_tree_steps_equal_plain_decoding(target, trees):
    """Greedy: walking each tree along the target's argmax gives plain greedy decoding's tokens,
    with steps that accept 2 and 3 nodes deep."""
    prompt, depths = target.tokenize(LOOP), []
    steps = TreeSteps(trees, target, Sampling())
    got = steps.generate(prompt, 24, lambda row: greedy_token(row, Sampling()), depths=depths)
    plain = tokens_of(GenerationConfig(target, None, max_tokens=24), prompt)
    assert got[:24] == plain and max(depths) >= 2


def sampled(trees, target, rule=accept_tree):
    """Counts of the first N_JOINT tokens over N_RUNS seeded tree generations at temperature 1."""
    steps, counts, depths = TreeSteps(trees, target, SAMPLING), {}, []
    prompt = target.tokenize(LOOP)
    for seed in range(N_RUNS):
        rng = np.random.default_rng(seed)
        out = steps.generate(prompt, N_JOINT, lambda row: distribution(row, SAMPLING).sample(rng),
                             rule, depths)
        out = out[: next((j for j, t in enumerate(out) if target.is_eog(t)), N_JOINT)]
        counts[tuple(out[:N_JOINT])] = counts.get(tuple(out[:N_JOINT]), 0) + 1
    return counts, depths


def test_sampled_tree_steps_follow_the_target_distribution(target, trees):
    """Chi-square over 3,000 seeded runs of the joint distribution of the first three tokens, each
    step a tree of width 2 and depth up to 3 from the target's top tokens (deterministic branches:
    drawn from the row, the child that holds the draw followed), against the target alone."""
    counts, depths = sampled(trees, target)
    assert {1, 2} <= set(depths)  # siblings and depth exercised
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, target.tokenize(LOOP), SAMPLING),
                                       N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"


def test_a_wrong_tree_rule_is_caught(target, trees):
    """The check above can fail: drawing every node's token from the root's row rejects."""
    def root_row_everywhere(token_at, tokens, parents):
        return accept_tree(lambda i: token_at(0), tokens, parents)

    counts, _ = sampled(trees, target, root_row_everywhere)
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, target.tokenize(LOOP), SAMPLING),
                                       N_RUNS)
    assert rejects, f"chi2 {stat:.1f} <= {crit:.1f}"
