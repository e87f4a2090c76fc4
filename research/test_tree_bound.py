"""research/tree_bound.py's arithmetic on hand-made outputs and costs, no model: the tree bound is the chain oracle
at width 1, never above it in seconds, and gains where a second candidate was right."""

import random

import tree_bound as B
from spectool_lab.replay import cheapest, oracle

from spectool.drafters.lookup import PromptLookup

COST = [0.0] + [0.010 + 0.002 * r for r in range(1, 40)]  # a decode of r rows: a step and a fifth a row
# "1 2" was followed by 20 twice, by 10 once: lookup drafts 20, its alternative is 10, and 10 is right
PROMPT = [1, 2, 10, 11, 12, 13, 5, 1, 2, 20, 21, 6, 1, 2, 20, 22, 7, 1, 2]
OUTPUT = [10, 11, 12, 13, 5, 99, 98]


def test_the_shortest_path_by_rows_is_cheapest_where_rows_are_a_chain():
    rng = random.Random(59)
    for _ in range(200):
        reach = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        cost = [0.0] + sorted(rng.uniform(0.01, 0.05) for _ in range(8))
        by_rows = [B.with_chain([0], r, 0) for r in reach]  # a tree of no nodes: the chain alone
        assert abs(B.cheapest_rows(by_rows, cost) - cheapest(reach, cost)) < 1e-12


def test_candidates_rank_followers_by_count_and_the_top_one_is_lookups_draft():
    lookup = PromptLookup()
    assert lookup.lookup(PROMPT, 4)[0][0] == 20
    assert [t for t, _ in B.candidates(lookup.index, PROMPT, 4)] == [20, 10]
    assert B.candidates(lookup.index, PROMPT, 1) == [(20, 2 / 4)]  # shares: count / (total + 1)
    # after "1 2 20": 22 and 21 once each, the last seen first
    assert [t for t, _ in B.candidates(lookup.index, PROMPT + [20], 4)] == [22, 21]
    # the next-shorter n-gram: after "3 4" only 5 followed, after "4" also 6
    other = lookup_after([3, 4, 5, 8, 4, 6, 3, 4])
    assert [t for t, _ in B.candidates(other, [3, 4], 4)] == [5]
    assert [t for t, _ in B.candidates(other, [3, 4], 4, shorter=True)] == [5, 6]
    assert [t for t, _ in B.candidates(other, [3, 4], 1, shorter=True)] == [5]


def test_width_one_is_the_chain_oracle_and_a_second_candidate_shows_the_gain():
    got = B.bounds(PROMPT, OUTPUT, COST, k_max=32)
    assert abs(got["chain"] - oracle(PROMPT, OUTPUT, COST, 32)) < 1e-12
    for n in B.BUDGETS:
        assert abs(got[("bound", 1, n)] - got["chain"]) < 1e-12
        assert abs(got[("shaped", 1, n)] - got["chain"]) < 1e-12
    # the chain drafts 20 and breaks at once (10 is the target's token), then copies 11 12 13 5 and the target
    # adds 99; 98 is a plain step. A tree with 10 beside 20 takes 10 11 12 13 5 (and 99) in one step of 5 nodes
    # (the oracle drafts the path alone), then the plain step
    assert abs(got["chain"] - (COST[1] + COST[5] + COST[1])) < 1e-12
    assert abs(got[("bound", 2, 8)] - (COST[6] + COST[1])) < 1e-12
    assert B.path_reach(lookup_after(PROMPT), PROMPT, OUTPUT, 0, 2, 32) == 5
    assert B.path_reach(lookup_after(PROMPT), PROMPT, OUTPUT, 0, 1, 32) == 0
    assert B.path_reach(lookup_after(PROMPT), PROMPT, OUTPUT, 0, 2, 3) == 3  # a budget cuts the path
    # shaped without knowing the output, best first by share, the tree spends its nodes on 20's branch too: 20
    # (1/2), 10 (1/4), 22 and 21 (1/2 x 1/3), 11 (1/4 x 1/2), 7 and 6, 12; 8 nodes reach 10 11 12
    assert B.shaped_reach(lookup_after(PROMPT), PROMPT, OUTPUT, 0, 2, 8) == [0, 0, 1, 1, 1, 2, 2, 2, 3]
    # and at these prices (a row a fifth of a step) that loses the gain: the chain oracle is as fast
    assert abs(got[("shaped", 2, 8)] - got["chain"]) < 1e-12


def lookup_after(history):
    lookup = PromptLookup()
    lookup.lookup(history, 1)
    return lookup.index


def test_trees_are_never_slower_than_chains_and_wider_or_larger_never_slower():
    rng = random.Random(6)
    for _ in range(30):
        vocab = rng.randrange(3, 7)
        p = [rng.randrange(vocab) for _ in range(rng.randrange(5, 40))]
        y = [rng.randrange(vocab) for _ in range(rng.randrange(1, 25))]
        cost = [0.0] + sorted(rng.uniform(0.01, 0.05) for _ in range(34))
        got = B.bounds(p, y, cost, k_max=32, shorter=rng.random() < 0.5)
        for w in B.WIDTHS:
            for i, n in enumerate(B.BUDGETS):
                assert got[("bound", w, n)] <= got[("shaped", w, n)] + 1e-12
                assert got[("shaped", w, n)] <= got["chain"] + 1e-12
                if w > 1:
                    assert got[("bound", w, n)] <= got[("bound", w - 1, n)] + 1e-12
                if i:
                    assert got[("bound", w, n)] <= got[("bound", w, B.BUDGETS[i - 1])] + 1e-12
