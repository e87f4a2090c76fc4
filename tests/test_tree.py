"""Draft trees verified in one decode (ParallelModel.eval_tree and keep_path), on the generated tiny
target: each node's row is the row that decoding its path one sequence at a time gives, up to the
rounding of another batch shape (docs/exactness.md); a node never sees a sibling's branch; after
keep_path the sequence holds the accepted path alone, and what runs beside it in other sequences is
untouched."""

import numpy as np
import pytest
from exactness import N_JOINT, N_RUNS, SAMPLING, chi2_rejects, exact_joint
from spectool_lab.helpers import SplitHybrid, tokens_of

from spectool.cli.display import summary_line
from spectool.core.controller import Controller
from spectool.core.costs import Costs
from spectool.core.evidence import Evidence, Source
from spectool.core.protocol import Branch, Draft, Drafter
from spectool.core.stats import Stats
from spectool.core.verify import Sampling, accept_tree, distribution, greedy_token
from spectool.drafters.builder import for_generation
from spectool.drafters.hybrid import Hybrid
from spectool.drafters.lookup import PromptLookup
from spectool.generate.batch import Batch
from spectool.generate.loop import GenerationConfig, speculative_generate
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
    with pytest.raises(ValueError, match="not a path"):
        trees.keep_path([0, 5])
    trees.keep_path([0, 2, 5])
    kept = history + [tree.tokens[i] for i in (0, 2, 5)]
    assert trees.seqs[0] == kept
    mem = trees.lib.llama_get_memory(trees._ctx)
    assert all(trees.lib.llama_memory_seq_pos_max(mem, s) == -1 for s in range(1, 8))
    assert trees.lib.llama_memory_seq_pos_max(mem, 0) == len(kept) - 1
    nxt = target.tokenize(" now", add_special=False)
    trees.eval_seqs([(0, nxt)])
    assert np.abs(trees.logits(len(nxt) - 1) - alone(target, kept + nxt)).max() < CLOSE
    with pytest.raises(ValueError, match="no draft tree"):  # settled once
        trees.keep_path([0, 2, 5])


def test_a_tree_left_unsettled_does_not_reach_the_next(target, trees):
    """A tree an error left before keep_path (its leaves' cells still in the cache), the sequence rolled back as the
    loop's end does: the next tree's rows are still each path's decoded alone."""
    history = target.tokenize(PROMPT)[:-1]
    trees.reset()
    trees.eval(history, logits="none")
    trees.eval_tree(shape(target))  # never settled
    trees.rollback(len(history))
    other = Tree(tokens=[shape(target).tokens[0], *target.tokenize(" a big", add_special=False)[:2]],
                 parents=[-1, 0, 0])
    trees.eval_tree(other)
    rows = [trees.logits(i).copy() for i in range(len(other.tokens))]
    for i, row in enumerate(rows):
        assert np.abs(row - alone(target, history + [other.tokens[j] for j in other.path(i)])).max() < CLOSE, i
    trees.keep_path([0])


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


def test_two_trees_and_a_chain_in_one_decode(target, trees):
    """A forest: sequences 0 and 1 each verify a tree (leaves in spares 3-4 and 5-6) beside sequence 2's chain, in
    one decode; every row is its path's decoded alone, each keep_path settles its own sequence, the chain's is
    appended, and the next decode of each follows its kept path alone. Two parts may not share a sequence."""
    words = target.tokenize(" the cat sat on a mat", add_special=False)
    hist = [target.tokenize(t) for t in (PROMPT, "The quick brown fox", "for i in range(10):")]
    forest = [Tree([hist[0][-1], words[0], words[1], words[2]], [-1, 0, 1, 0]),
              Tree([hist[1][-1], words[3], words[4]], [-1, 0, 0])]
    chain = [hist[2][-1], *words[:2]]
    trees.reset()
    trees.eval_seqs([(s, h[:-1]) for s, h in enumerate(hist)], logits=False)
    with pytest.raises(DecodeError, match="share a sequence"):
        trees.eval_seqs([(0, forest[0]), (1, forest[1])], spares={0: [3, 4], 1: [4, 5]})
    starts = trees.eval_seqs([(0, forest[0]), (1, forest[1]), (2, chain)], spares={0: [3, 4], 1: [5, 6]})
    for s, part in enumerate(forest):
        for i in range(len(part.tokens)):
            path = [part.tokens[j] for j in part.path(i)]
            assert np.abs(trees.logits(starts[s] + i) - alone(target, hist[s][:-1] + path)).max() < CLOSE, (s, i)
    assert np.abs(trees.logits(starts[2] + 2) - alone(target, hist[2] + words[:2])).max() < CLOSE
    rows = [trees.logits(i).copy() for i in range(starts[2])]  # (settling moves cells, never the rows)
    trees.keep_path([0, 3], 0)
    trees.keep_path([0, 2], 1)
    assert all(np.array_equal(trees.logits(i), row) for i, row in enumerate(rows))
    kept = [hist[0] + [words[2]], hist[1] + [words[4]], hist[2] + words[:2]]
    assert [trees.seqs[s] for s in range(3)] == kept
    nxt = target.tokenize(" now", add_special=False)
    starts = trees.eval_seqs([(s, nxt) for s in range(3)])
    for s in range(3):
        assert np.abs(trees.logits(starts[s] + len(nxt) - 1) - alone(target, kept[s] + nxt)).max() < CLOSE, s


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


# -- draft trees in the loop: lookup's other followers beside its chain, one decode ---------------------------
def free_rows(**kw):
    """A controller whose decodes cost the same at any number of rows (its priors, untimed): every sibling
    lookup offers pays for its row, so each step with alternatives verifies a tree."""
    return Controller(costs=Costs(unmeasured=1.0, jump_prior=0.0, slope_prior=0.0), timed=False, **kw)


def tree_run(trees, prompt, s, n, draft_tree, seed=0, ctl=None):
    st = Stats()
    g = GenerationConfig(trees, for_generation(PromptLookup(), False), s, ctl or free_rows(), max_tokens=n,
                         seed=seed, draft_tree=draft_tree)
    return tokens_of(g, prompt, st), st


# after "cat the" (never seen) lookup's longest match is "the", followed by "dog" and "fox": it drafts one, a
# tree holds the other, and the target, which loops on LOOP, draws either
FORKS = LOOP + " cat the"


def test_greedy_generation_with_trees_is_plain_decoding(target, trees):
    """Trees on (`draft_tree`), steps verify siblings beside their chains; the tokens are plain greedy decoding's.
    `draft_tree=0` verifies chains alone."""
    prompt = target.tokenize(FORKS)
    plain = tokens_of(GenerationConfig(target, None, max_tokens=40), prompt)
    got, st = tree_run(trees, prompt, Sampling(), 40, 4)
    assert got == plain and st.tree_steps and st.tree_branches >= st.tree_steps, st.to_json()["tree"]
    chains, st0 = tree_run(trees, prompt, Sampling(), 40, 0)
    assert chains == plain and st0.tree_steps == 0
    # every chain drafts the target's second choice and holds its first beside: each path takes the sibling
    st = Stats()
    g = GenerationConfig(trees, Runners(target, swap=True), Sampling(), free_rows(k_max=2, adaptive=False),
                         max_tokens=40, draft_tree=4)
    assert tokens_of(g, prompt, st) == plain and st.tree_taken == st.tree_steps == st.n_steps, st.to_json()
    assert f"trees {st.n_steps} steps, {st.tree_branches} siblings, {st.n_steps} taken;" in summary_line(st)


class Runners(Drafter):
    """A deterministic drafter of the target's own greedy chain (its top token after the history, then after that,
    ...), offering the target's second choice at each depth as a sibling (cached by history): at temperature 1 the
    target draws the chain's token or its sibling often, so both kinds of path are walked."""

    def __init__(self, target, swap=False, source=Source.lookup):
        self.target, self.swap, self.cache = target, swap, {}  # swap: the second choices drafted, the first beside
        self.source = source  # (whose siblings they are, as the controller learns their shares)

    def start(self, history, constraint=None):
        pass

    def peek(self, history, k_max, estimate=None, final=None):
        return [Evidence.lookup(8)] * k_max

    def chain(self, history, k):
        key = (tuple(history), k)
        if key not in self.cache:
            chain, seconds = [], []
            for _ in range(k):
                first, second = self.top([*history, *chain])[:: -1 if self.swap else 1]
                chain.append(first), seconds.append(second)
            self.cache[key] = chain, seconds
        return self.cache[key]

    def top(self, history):
        return top(self.target, history)

    def propose(self, history, k, sampling, rng, constraint=None):
        return Draft(self.chain(history, k)[0], None, Source.lookup)

    def branches(self, history, chain, width):
        return [Branch(d, t, 0.5, self.source) for d, t in enumerate(self.chain(history, len(chain))[1])]


class Wrong(Runners):
    """Runners of the target's third choices, with its fourth beside: the chain's token refused at its first depth
    each step, and the sibling there never the target's."""

    def top(self, history):
        return top(self.target, history, 4)[2:]


def test_the_siblings_shares_are_scaled_by_how_they_turned_out(target, trees):
    """The controller learns from each step how the siblings at the depth where the chain broke turned out, for each
    source apart: Runners' siblings (offered at 1/2, as lookup's) always taken raise lookup's scale to near 2, Wrong's
    never taken lower it to its floor (SHARE_FLOOR, where a sure sibling still pays on a machine where rows are cheap),
    and a draft model's scale stays as it was; a sibling the untimed controller's prices take at its offered share is
    then left out (Controller.branch), and beside it another source's is still taken."""
    from spectool.core.controller import SHARE_FLOOR
    from spectool.core.evidence import Evidence

    prompt = target.tokenize(LOOP)
    scales = {}
    for name, drafter, source in (("right", Runners(target, swap=True), Source.lookup),
                                  ("wrong", Wrong(target), Source.lookup),
                                  ("right, as a draft model's", Runners(target, True, Source.draft), Source.draft)):
        ctl = free_rows(k_max=2, adaptive=False)
        g = GenerationConfig(trees, drafter, Sampling(), ctl, max_tokens=40, draft_tree=4)
        st = Stats()
        tokens_of(g, prompt, st)
        assert st.tree_steps > 10, st.to_json()
        scales[name] = ctl.share_scale(source)
        other = Source.draft if source is Source.lookup else Source.lookup
        assert ctl.share_scale(other) == 1.0  # (the other source's: as offered)
    assert scales["right"] > 1.6 and scales["right, as a draft model's"] > 1.6 and scales["wrong"] == SHARE_FLOOR
    ctl, keys = Controller(timed=False), [Evidence.lookup(2)] * 3
    sibling, other = Branch(0, 7, 0.9, Source.draft), Branch(0, 8, 0.9, Source.lookup)
    assert ctl.branch(keys, [sibling], 1) == [sibling]
    for _ in range(40):
        ctl.observe_siblings({Source.draft: 0.9}, None)
    assert ctl.branch(keys, [sibling], 1) == [] and ctl.branch(keys, [sibling, other], 1) == [other]


def test_a_tree_as_wide_as_the_sequences_allow(target, trees):
    """`draft_tree` above what the target's sequences hold: a spare sequence for each leaf, the siblings' and the
    chain's end, so at most n_seq_max - 2 siblings a step, and the text stays plain decoding's."""
    prompt = target.tokenize(LOOP)
    g = GenerationConfig(trees, Runners(target, swap=True), Sampling(), free_rows(k_max=8, adaptive=False),
                         max_tokens=24, draft_tree=trees.n_seq_max)
    steps = list(speculative_generate(g, prompt))
    plain = tokens_of(GenerationConfig(target, None, max_tokens=24), prompt)
    assert [t for s in steps for t in s.tokens] == plain and max(s.branches for s in steps) == trees.n_seq_max - 2


def sampled_with_trees(target, trees):
    """Counts of the first N_JOINT tokens over N_RUNS seeded generations at temperature 1, each step a tree of
    Runners' chain of 2 and its 2 siblings, and the runs' summed stats."""
    counts, runs, drafter = {}, [], Runners(target)
    prompt = target.tokenize(LOOP)
    for seed in range(N_RUNS):
        st = Stats()
        g = GenerationConfig(trees, drafter, SAMPLING, free_rows(k_max=2, adaptive=False), max_tokens=N_JOINT,
                             seed=seed, draft_tree=4)
        out = tokens_of(g, prompt, st)
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
        runs.append(st)
    return counts, Stats.summed(runs)


def test_sampled_generation_with_trees_follows_the_target_distribution(target, trees):
    """Chi-square over 3,000 seeded runs of the joint distribution of the first three tokens, against the target
    alone; the accepted paths took a sibling in some steps and went down the chain in others."""
    counts, st = sampled_with_trees(target, trees)
    assert 0 < st.tree_taken < st.tree_steps and st.n_accepted > st.tree_taken, st.to_json()
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, target.tokenize(LOOP), SAMPLING), N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"


def test_a_wrong_tree_rule_in_the_loop_is_caught(target, trees, monkeypatch):
    """The check above can fail: the loop drawing every node's token from the root's row rejects."""
    import spectool.generate.loop as loop

    monkeypatch.setattr(loop, "accept_tree", lambda token_at, tokens, parents, *rest:
                        accept_tree(lambda i: token_at(0), tokens, parents))
    counts, _ = sampled_with_trees(target, trees)
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, target.tokenize(LOOP), SAMPLING), N_RUNS)
    assert rejects, f"chi2 {stat:.1f} <= {crit:.1f}"


# -- draft trees in the parallel batch (generate/batch.py): each sequence's tree in the one decode -------------
def batch_run(batch, jobs):
    """Each job (step it joins at, GenerationConfig, prompt) through `batch` as a server's slots take them: its
    tokens and Stats."""
    out, stats, seq_of, pending, step = {}, {}, {}, list(range(len(jobs))), 0
    while pending or batch.active:
        for j in [j for j in pending if jobs[j][0] <= step and batch.free]:
            stats[j], out[j] = Stats(), []
            seq_of[batch.join(jobs[j][1], jobs[j][2], stats[j])] = j
            pending.remove(j)
        for seq, st in batch.step().items():
            out[seq_of[seq]] += st.tokens
        step += 1
    return [out[j] for j in range(len(jobs))], [stats[j] for j in range(len(jobs))]


@pytest.fixture(scope="module")
def slots(tiny):
    """Two generating sequences, each with 5 spare ones for its trees' leaves, in one KV buffer."""
    with ParallelModel(tiny["target"], n_ctx=8 * 256, n_threads=2, n_seq_max=12, kv_unified=True) as m:
        yield m


def test_a_batch_of_trees_is_plain_decoding(target, slots):
    """Two slots: two sequences whose every chain drafts the target's second choices with its first beside (each
    step's decode holds both trees, each path takes a sibling), then lookup's trees on the forking prompt in the
    slot one left. Each output is plain greedy decoding's alone."""
    prompts = [target.tokenize(t) for t in (LOOP, PROMPT, FORKS)]
    plain = [tokens_of(GenerationConfig(target, None, max_tokens=n), p) for p, n in zip(prompts, (24, 16, 40))]
    swap = [GenerationConfig(slots, Runners(target, swap=True), Sampling(), free_rows(k_max=2, adaptive=False),
                             max_tokens=n, draft_tree=4) for n in (24, 16)]
    look = GenerationConfig(slots, for_generation(PromptLookup(), False), Sampling(), free_rows(), max_tokens=40,
                            draft_tree=4)
    got, stats = batch_run(Batch(slots, slots=2), [(0, swap[0], prompts[0]), (0, swap[1], prompts[1]),
                                                    (1, look, prompts[2])])
    assert got == plain
    assert all(st.tree_taken == st.tree_steps == st.n_steps for st in stats[:2]), [st.to_json() for st in stats]
    assert stats[2].tree_steps and stats[2].tree_branches >= stats[2].tree_steps, stats[2].to_json()


def test_a_seeded_sample_with_trees_is_the_same_in_a_batch(target, trees, slots):
    """At temperature 1 with a seed, trees on: each token is one draw from its row whatever the step's shape (a tree,
    a chain, how long), so the tokens drawn are plain sampling's with that seed, alone with every step a tree (rows
    free) and in a batch beside another sampled sequence with the controller's priors (chains and trees as they
    price); another seed differs."""
    prompt = target.tokenize(FORKS)

    def config(model, seed, ctl):
        return GenerationConfig(model, Runners(target), SAMPLING, ctl, max_tokens=24, seed=seed, draft_tree=4)

    plain = tokens_of(GenerationConfig(target, None, SAMPLING, max_tokens=24, seed=7), prompt)
    st = Stats()
    assert tokens_of(config(trees, 7, free_rows(k_max=2, adaptive=False)), prompt, st) == plain and st.tree_steps
    got, stats = batch_run(Batch(slots, slots=2), [(0, config(slots, 8, Controller(timed=False)), prompt[:-3]),
                                                    (0, config(slots, 7, Controller(timed=False)), prompt)])
    assert got[1] == plain != got[0] and stats[1].n_accepted > 0, stats[1].to_json()
    assert stats[1].tree_steps < stats[1].n_steps  # (chains too)
    assert batch_run(Batch(slots, slots=2), [(0, config(slots, 70, Controller(timed=False)), prompt)])[0][0] != plain


# -- a draft model's runner-ups beside its sampled draft: multi-draft rejection sampling ------------------------
@pytest.fixture(scope="module")
def draft(tiny):
    from spectool.llama.engine import Model

    with Model(tiny["draft"], n_ctx=1024, n_threads=2) as m:
        yield m


def sampled_draft_trees(target, trees, draft, make=None):
    """Counts of the first N_JOINT tokens over N_RUNS seeded generations at temperature 1, the first step a tree:
    the draft model's sampled chain of K_DRAFT tokens and, at each depth, its likeliest other tokens (up to 3), or
    `make(draft_model)`'s tree; and the runs' summed stats."""
    from exactness import K_DRAFT

    from spectool.drafters.draft_model import DraftModel

    counts, runs, prompt = {}, [], target.tokenize(LOOP)
    for seed in range(N_RUNS):
        st = Stats()
        dm = DraftModel(draft)
        g = GenerationConfig(trees, for_generation(make(dm) if make else dm, False), SAMPLING,
                             free_rows(k_max=K_DRAFT, adaptive=False), max_tokens=K_DRAFT + 1, seed=seed, draft_tree=4)
        out = tuple(tokens_of(g, prompt, st)[:N_JOINT])
        counts[out] = counts.get(out, 0) + 1
        runs.append(st)
    return counts, Stats.summed(runs)


class MixedSiblings(SplitHybrid):
    """SplitHybrid (lookup's first token of each stretch, then the draft model's sampled tokens) that counts the
    steps where both offered siblings at once: lookup's (deterministic) and the draft model's (runner-ups of a sampled
    chain); with free_rows' prices the controller verifies every sibling offered."""

    mixed = 0

    def branches(self, history, chain, width):
        theirs = self.lookup.branches(history, chain, width), self.draft.branches(history, chain, width)
        MixedSiblings.mixed += all(theirs)
        return super().branches(history, chain, width)


# the first step's tree: the draft model's sampled chain and runner-ups; or lookup's token, its other followers beside
# it, then the draft model's (a hybrid's: deterministic and sampled nodes in one tree)
MAKERS = {"draft model": None, "hybrid": lambda dm: MixedSiblings(PromptLookup(), dm)}


@pytest.mark.parametrize("siblings", MAKERS)
def test_a_draft_model_s_runner_ups_keep_the_target_distribution(target, trees, draft, siblings):
    """Chi-square over 3,000 seeded runs of the joint distribution of the first three tokens, each first step a tree
    of the draft model's sampled chain with its runner-ups beside (the chain's token kept with probability
    min(1, p/q), else the target's drawn from the residual and the runner-up that holds it followed), against the
    target alone; steps kept the chain in some runs and took a runner-up in others. In a hybrid's tree, lookup's
    siblings stand beside the same chain, at once with the runner-ups in some steps."""
    MixedSiblings.mixed = 0
    counts, st = sampled_draft_trees(target, trees, draft, MAKERS[siblings])
    assert st.tree_steps and 0 < st.tree_taken < st.tree_steps and st.n_accepted > st.tree_taken, st.to_json()
    assert (MixedSiblings.mixed > 0) == (siblings == "hybrid")
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, target.tokenize(LOOP), SAMPLING), N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"


@pytest.mark.parametrize("siblings", MAKERS)
def test_a_wrong_multi_draft_rule_is_caught(target, trees, draft, monkeypatch, siblings):
    """The check above can fail: the sampled chain's tokens judged against p as if it were q (every one kept) rejects."""
    import spectool.generate.loop as loop

    def as_if_q_were_p(token_at, tokens, parents, drawn, rng):
        return accept_tree(token_at, tokens, parents, lambda i: (d := drawn(i)) and (d[0], d[1], d[1]), rng)

    monkeypatch.setattr(loop, "accept_tree", as_if_q_were_p)
    counts, _ = sampled_draft_trees(target, trees, draft, MAKERS[siblings])
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, target.tokenize(LOOP), SAMPLING), N_RUNS)
    assert rejects, f"chi2 {stat:.1f} <= {crit:.1f}"


# -- draft trees under a grammar: each node's row masked by the grammar after its path ---------------------------
def grammar_run(model, drafter, prompt, gbnf, s=Sampling(), n=40, draft_tree=4, seed=0, ctl=None):
    from spectool.core.grammar import Grammar

    st = Stats()
    g = GenerationConfig(model, for_generation(drafter, grammar=True), s, ctl or free_rows(), max_tokens=n,
                         seed=seed, grammar=Grammar.gbnf(gbnf), draft_tree=draft_tree)
    return tokens_of(g, prompt, st), st


def test_greedy_trees_under_a_grammar_are_llama_cpps_constrained_decoding(target, trees):
    """llama.cpp's constrained greedy decoding (its grammar sampler, the oracle) with trees: Runners' (second choices
    drafted, first beside, the siblings the grammar rejects left out) under lowercase words, each path through a
    sibling; lookup's on repeated records, with the forced keys a trunk under siblings in some steps."""
    from test_grammar import RECORD, WORDS, llama_cpp_greedy

    from spectool.core.grammar import Grammar

    prompt = target.tokenize(FORKS)
    got, st = grammar_run(trees, Runners(target, swap=True), prompt, WORDS, ctl=free_rows(k_max=2, adaptive=False))
    assert got == llama_cpp_greedy(target, prompt, WORDS, 40) and st.tree_taken > 1, st.to_json()
    prompt = target.tokenize('{"name": "ann lee", "n": 42} {"name": "bob lee", "n": 42} {"name": "ann lee", "n": 7} ')
    g = GenerationConfig(trees, for_generation(PromptLookup(), grammar=True), Sampling(), free_rows(), max_tokens=40,
                         grammar=Grammar.gbnf(RECORD), draft_tree=4)
    steps = list(speculative_generate(g, prompt))
    assert [t for s in steps for t in s.tokens] == llama_cpp_greedy(target, prompt, RECORD, 40)
    assert any(s.forced and s.branches for s in steps) and steps[-1].finish_reason == "stop"


def test_a_tree_s_siblings_are_those_the_grammar_takes_after_the_chain_so_far(target):
    """GrammarDrafter.branches, after each of the first 12 tokens of the constrained output: Runners' siblings (the
    target's first choices beside its second) at each depth of its chain cut where the grammar rejects it, less those
    the grammar in that state (after the chain's tokens before it) rejects; the grammar back where it was."""
    from test_grammar import WORDS, llama_cpp_greedy

    from spectool.core.grammar import Grammar
    from spectool.drafters.grammar import GrammarDrafter

    prompt = target.tokenize(FORKS)
    output, kept, dropped = llama_cpp_greedy(target, prompt, WORDS, 12), 0, 0
    for n in range(1, len(output)):
        history, c = prompt + output[:n], Grammar.gbnf(WORDS).matcher(target)
        assert c.push(output[:n])
        drafter = GrammarDrafter(Runners(target, swap=True), c)
        keys = list(drafter.peek(history, 4))
        chain = drafter.propose(history, len(keys), Sampling(), np.random.default_rng(0)).tokens
        got, allowed = drafter.branches(history, chain, 4), []
        offered = Runners(target, swap=True).branches(history, chain, 4)
        for b in offered:
            assert c.push(chain[: b.depth])
            allowed += [b] if c.allows(b.token) else []
            c.pop(b.depth)
        assert got == allowed and c.valid(chain) == len(chain)
        kept, dropped = kept + len(got), dropped + len(offered) - len(got)
    assert kept and dropped, (kept, dropped)


class UnderWords(Runners):
    """Runners of the target's likeliest tokens among those lowercase words allow after the prompt's `n` tokens (its
    chain, then its second choices beside): trees whose every node the grammar takes."""

    def __init__(self, target, n):
        super().__init__(target)
        self.n = n

    def top(self, history):
        from test_grammar import WORDS

        from spectool.core.grammar import Grammar, mask_for

        c = Grammar.gbnf(WORDS).matcher(self.target)
        assert c.push(history[self.n :])
        self.target.sync(history)
        return [int(t) for t in np.argsort(-np.where(mask_for(c), -np.inf, self.target.logits()))[:2]]


def sampled_under_grammar(target, trees):
    """Counts of the first N_JOINT tokens over N_RUNS seeded runs at temperature 1 under lowercase words, each step a
    tree of UnderWords' chain of 2 and its 2 siblings, and the runs' summed stats."""
    from test_grammar import WORDS

    counts, runs, prompt = {}, [], target.tokenize(LOOP)
    drafter = UnderWords(target, len(prompt))
    for seed in range(N_RUNS):
        out, st = grammar_run(trees, drafter, prompt, WORDS, SAMPLING, N_JOINT, seed=seed,
                              ctl=free_rows(k_max=2, adaptive=False))
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
        runs.append(st)
    return counts, Stats.summed(runs)


def test_sampled_trees_under_a_grammar_follow_the_constrained_target(target, trees):
    """Chi-square over 3,000 seeded runs of the first three tokens' joint distribution, against the target's
    under llama.cpp's grammar sampler."""
    from test_grammar import WORDS, llama_cpp_banned

    prompt = target.tokenize(LOOP)
    joint = exact_joint(target, prompt, SAMPLING, banned=llama_cpp_banned(target, WORDS))
    counts, st = sampled_under_grammar(target, trees)
    assert 0 < st.tree_taken < st.tree_steps and st.n_accepted > st.tree_taken, st.to_json()
    rejects, stat, crit = chi2_rejects(counts, joint, N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"


def test_a_tree_masked_at_its_root_s_state_is_caught(target, trees, monkeypatch):
    """The check above can fail: every node's row masked by the grammar's state at the root (its path not followed)
    rejects."""
    import spectool.generate.loop as loop
    from test_grammar import WORDS, llama_cpp_banned

    monkeypatch.setattr(loop, "follow", lambda c, tree, held, i: list(held))
    prompt = target.tokenize(LOOP)
    joint = exact_joint(target, prompt, SAMPLING, banned=llama_cpp_banned(target, WORDS))
    rejects, stat, crit = chi2_rejects(sampled_under_grammar(target, trees)[0], joint, N_RUNS)
    assert rejects, f"chi2 {stat:.1f} <= {crit:.1f}"


def test_a_seeded_sample_with_trees_under_a_grammar_is_plain_constrained_sampling(target, trees, slots):
    """At temperature 1 with a seed, under lowercase words: each token is one draw from its masked row, so the
    tokens are plain constrained sampling's with that seed, alone and in a batch beside a sequence under no grammar;
    another seed differs."""
    from test_grammar import WORDS

    from spectool.core.grammar import Grammar

    prompt = target.tokenize(FORKS)
    plain = tokens_of(GenerationConfig(target, None, SAMPLING, max_tokens=24, seed=7, grammar=Grammar.gbnf(WORDS)),
                      prompt)
    got, st = grammar_run(trees, UnderWords(target, len(prompt)), prompt, WORDS, SAMPLING, 24, seed=7,
                          ctl=free_rows(k_max=2, adaptive=False))
    assert got == plain and st.tree_steps, st.to_json()
    free = GenerationConfig(slots, Runners(target), SAMPLING, Controller(timed=False), max_tokens=24, seed=7,
                            draft_tree=4)
    under = GenerationConfig(slots, for_generation(UnderWords(target, len(prompt)), grammar=True), SAMPLING,
                             free_rows(k_max=2, adaptive=False),
                             max_tokens=24, seed=7, grammar=Grammar.gbnf(WORDS), draft_tree=4)
    got, stats = batch_run(Batch(slots, slots=2), [(0, free, prompt), (0, under, prompt)])
    assert got[1] == plain != got[0] and stats[1].tree_steps and stats[1].n_accepted > 0, stats[1].to_json()
    assert grammar_run(trees, UnderWords(target, len(prompt)), prompt, WORDS, SAMPLING, 24, seed=70)[0] != plain


# -- a greedy draft model's runner-ups, and a hybrid's siblings -------------------------------------------------
def test_a_greedy_draft_model_s_runner_ups_are_its_top_tokens_after_each_depth(target, trees, draft):
    """With trees on, a greedy draft keeps each depth's top 4 from llama.cpp's graph: its siblings are the draft
    model's next three likeliest after the history and the chain before them (the draft model's whole rows, decoded
    alone, the oracle), each at its softmax share beyond the drafted token; the chain is its argmax's. The
    generation is plain greedy decoding, with trees from the runner-ups."""
    from spectool.drafters.draft_model import DraftModel

    prompt = target.tokenize(FORKS)
    dm = DraftModel(draft, runner_ups=True)
    dm.start(prompt)
    chain = dm.propose(prompt, 3, Sampling(), np.random.default_rng(0)).tokens
    got = dm.branches(prompt, chain, 4)
    for d in range(len(chain)):
        row = alone(draft, [*prompt, *chain[:d]])
        best = [int(t) for t in np.argsort(-row, kind="stable")[:4]]
        assert chain[d] == best[0] and [b.token for b in got if b.depth == d] == best[1:]
        p = np.exp(row.astype(np.float64) - row.max())
        share = p[best[1]] / (p[best].sum() - p[best[0]])
        assert abs(next(b.share for b in got if b.depth == d) - share) < 1e-3
    assert DraftModel(draft).branches(prompt, chain, 4) == []  # (trees off: argmax alone, no runner-ups)
    plain = tokens_of(GenerationConfig(target, None, max_tokens=40), prompt)
    for drafter in (DraftModel(draft, runner_ups=True), Hybrid(PromptLookup(), DraftModel(draft, runner_ups=True))):
        st = Stats()
        g = GenerationConfig(trees, for_generation(drafter, False), Sampling(), free_rows(k_max=3, adaptive=False),
                             max_tokens=40, draft_tree=4)
        assert tokens_of(g, prompt, st) == plain and st.tree_steps and st.tree_branches, st.to_json()


def test_a_hybrid_s_siblings_are_lookup_s_and_its_draft_model_s(target, draft):
    """Hybrid.branches: lookup's other followers along the whole chain, then the draft model's runner-ups beside its
    part of the chain (after lookup's): at each of its depths, the draft model's next likeliest after the history and
    the chain before them."""
    from spectool.drafters.draft_model import DraftModel

    prompt = target.tokenize(FORKS)
    lookup, dm = PromptLookup(), DraftModel(draft, runner_ups=True)
    h = Hybrid(lookup, dm)
    h.start(prompt)
    # lookup's first two tokens (their key worth more than the draft model's), then the draft model's
    keys = h.peek(prompt, 5, lambda key: 1.0 if str(key).startswith("lookup:1?") else
                  0.5 if key.source is Source.draft else 0.0)
    chain = h.propose(prompt, len(keys), Sampling(), np.random.default_rng(0)).tokens
    theirs = dm.branches(prompt, chain, 4)
    assert len(chain) == 5 and {b.depth for b in theirs} == {2, 3, 4}, (chain, theirs)
    for d in (2, 3, 4):
        assert [b.token for b in theirs if b.depth == d] == top(draft, [*prompt, *chain[:d]], 4)[1:]
    assert h.branches(prompt, chain, 4) == [*lookup.branches(prompt, chain, 4), *theirs]
    # after another history, or in the next generation, the last draft's runner-ups are not offered
    assert dm.branches([*prompt[:-1], prompt[-1] + 1], chain, 4) == []
    h.start(prompt)
    assert dm.branches(prompt, chain, 4) == []


def test_the_session_s_draft_model_keeps_runner_ups_where_trees_are_on(target, draft):
    """--draft-tree above 0 (Wish.tree) builds a draft model that keeps its runner-ups, alone and in a hybrid;
    without trees, the argmax alone."""
    from spectool.drafters.builder import Wish, choose
    from spectool.options import Mode

    for tree in (True, False):
        assert choose(Wish(Mode.draft, tree=tree), target, draft).drafter.runner_ups is tree
        assert choose(Wish(Mode.hybrid, tree=tree), target, draft).drafter.draft.runner_ups is tree


def test_a_draft_model_after_forced_tokens_offers_siblings_beside_its_own(target, draft):
    """Under a record's grammar a greedy draft model drafts after the tokens the grammar forces (a trunk): its
    siblings sit beside its own tokens alone, at each depth the draft model's likeliest others among those the
    grammar takes after the chain before them (its masked row, read alone, the oracle)."""
    from test_grammar import RECORD

    from spectool.core.grammar import Grammar, mask_for
    from spectool.drafters.draft_model import DraftModel
    from spectool.drafters.grammar import GrammarDrafter

    prompt = target.tokenize('{"name": "ann lee", "n": 42} {"name": "bob lee", "n": 7} ')
    dm = DraftModel(draft, runner_ups=True)
    dm.start(prompt)
    g = GrammarDrafter(dm, Grammar.gbnf(RECORD).matcher(target))
    d = g.propose(prompt, len(list(g.peek(prompt, 10))), Sampling(), np.random.default_rng(0))
    got = g.branches(prompt, d.tokens, 4)
    assert 0 < d.forced < len(d.tokens) and got and min(b.depth for b in got) == d.forced, (d, got)
    for depth in range(d.forced, len(d.tokens)):
        c = Grammar.gbnf(RECORD).matcher(target)
        assert c.push(d.tokens[:depth])
        row = np.where(mask_for(c), -np.inf, alone(draft, [*prompt, *d.tokens[:depth]]))
        best = [int(t) for t in np.argsort(-row, kind="stable")[:4] if np.isfinite(row[t])]
        assert best[0] == d.tokens[depth] and [b.token for b in got if b.depth == depth] == best[1:]


def test_the_sibling_a_path_took_is_known_with_its_source():
    """Plan.taken: the sibling the accepted path went through (node len(chain) + 1 + its index among the branches), so
    the controller hears which source's sibling was right; none where the path stayed on the chain."""
    from spectool.generate.plan import Plan

    branches = [Branch(0, 5, 0.5, Source.lookup), Branch(1, 6, 0.5, Source.draft)]
    p = Plan([Evidence.lookup(2)] * 2, Draft([1, 2], None, Source.hybrid), 0.0, branches=branches)
    p.path, p.n_acc = [0, 1, 4], 2  # the chain's first token, then the draft model's sibling beside its second
    assert p.chain_acc == 1 and p.taken == branches[1]
    p.path, p.n_acc = [0, 1], 1
    assert p.taken is None
