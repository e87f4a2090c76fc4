"""text_draft_bound.py's arithmetic on hand-made cases (no model): the paid shortest path, the fixed-length replay
and the hybrid's choice."""

from __future__ import annotations

import pytest
from text_draft_bound import cheapest_paid, fixed_draft

from spectool_lab.replay import cheapest

COST = [0.0, 1.0, 1.2, 1.4, 1.6, 1.8]  # a batch of b tokens: 0.8 + 0.2 b


def test_free_drafts_are_replay_s_cheapest():
    for reach in ([0, 0, 0, 0], [3, 2, 1, 0], [4, 0, 0, 0, 1, 0], [1, 1, 1, 1, 1, 0]):
        seconds, _ = cheapest_paid([[(r, 0.0)] for r in reach], COST)
        assert seconds == pytest.approx(cheapest(reach, COST))


def test_nothing_accepted_is_plain():
    assert cheapest_paid([[(0, 0.5)]] * 5, COST) == (5.0, 5)


def test_a_paid_draft_is_taken_only_where_it_pays():
    # at 0: 3 tokens accepted, so one step of 4 rows (1.6) + 3 drafted tokens makes 4 tokens; plain is 4.0
    assert cheapest_paid([[(3, 0.1)], [(0, 0.1)], [(0, 0.1)], [(0, 0.1)]], COST) == (pytest.approx(1.9), 1)
    # at 0.9 s a drafted token, 1.6 + 2.7 = 4.3 > 4.0: plain
    assert cheapest_paid([[(3, 0.9)], [(0, 0.9)], [(0, 0.9)], [(0, 0.9)]], COST) == (pytest.approx(4.0), 4)
    # at 0.7 s all three still pay (1.6 + 2.1 = 3.7), two do not (1.4 + 1.4 + 1.0 = 3.8), nor one (3.9)
    assert cheapest_paid([[(3, 0.7)], [(0, 0.7)], [(0, 0.7)], [(0, 0.7)]], COST) == (pytest.approx(3.7), 1)
    # where the batch of 3 costs more than 4 (llama.cpp's kernels do that), the shorter draft is the oracle's
    bumpy = [0.0, 1.0, 1.2, 2.5, 1.6]
    assert cheapest_paid([[(2, 0.1)], [(0, 0.1)], [(0, 0.1)]], bumpy) == (pytest.approx(1.3 + 1.0), 2)


def test_the_hybrid_takes_the_free_drafts_where_both_reach():
    # lookup (free) reaches 2 at 0, the draft (0.3 a token) 3: 1.4 for 3 tokens then plain, or 1.6 + 0.9 for 4
    options = [[(2, 0.0), (3, 0.3)], [(0, 0.0), (0, 0.3)], [(0, 0.0), (0, 0.3)], [(0, 0.0), (0, 0.3)]]
    assert cheapest_paid(options, COST) == (pytest.approx(2.4), 2)
    # no better than either alone, never worse
    alone = [cheapest_paid([[o[i]] for o in options], COST)[0] for i in (0, 1)]
    assert cheapest_paid(options, COST)[0] <= min(alone)


def test_the_last_token_needs_no_draft():
    # a draft past the output's end is cut: a 1-token output is one plain step whatever the reach
    assert cheapest_paid([[(4, 0.0)]], COST) == (1.0, 1)


def test_fixed_length_drafts():
    y = [1, 2, 3, 4, 5, 6]
    props = [[1, 2, 9], [2, 3, 4], [9], [4, 5], [5], [6]]  # at j, the draft of y[j:]
    # k=2: at 0 [1, 2] both accepted -> 3 (1.4 + 0.2); at 3 [4, 5] (2 left after the target's own) -> 6 (1.6)
    assert fixed_draft(props, y, COST, 2, 0.1) == (pytest.approx(3.2), 2)
    # k=1: 0 -> 2 (1.3), 2 rejected -> 3 (1.3), 3 -> 5 (1.3), 5: nothing left to draft -> 6 (1.0)
    assert fixed_draft(props, y, COST, 1, 0.1) == (pytest.approx(4.9), 4)
