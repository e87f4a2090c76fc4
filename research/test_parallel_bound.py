"""research/parallel_bound.py's arithmetic on replayed costs, no model: the rows spread, the line
below the costs, and the bound it makes of N sequences sharing a decode."""

import random

import parallel_bound as B


def test_rows_spread_evenly_and_shapes_reach_a_full_draft():
    assert B.spread(7, 3) == [3, 2, 2] and B.spread(4, 4) == [1] * 4 and sum(B.spread(37, 8)) == 37
    assert B.shapes(1, 8) == list(range(1, 10))
    got = B.shapes(2, 32)
    assert got[:17] == list(range(2, 19)) and got[-1] == 2 * 33 and 1 + 33 in got


def test_the_lowered_line_lies_under_every_cost_and_slow_outliers_do_not_tilt_it():
    line = {r: 0.02 + 0.004 * r for r in range(1, 20)}
    (a, b), (c, d) = B.lines(line)
    assert max(abs(a - 0.02), abs(b - 0.004), abs(c - 0.02), abs(d - 0.004)) < 1e-9
    busy = {**line, 3: 5.0, 17: 2.0, 18: 9.0}  # busy spells only slow a decode
    (a, b), (c, d) = B.lines(busy)
    assert abs(d - 0.004) < 5e-4 and abs(c - 0.02) < 5e-3 and a <= c
    assert all(busy[r] >= a + b * r - 1e-12 for r in busy)
    assert min(busy[r] - (a + b * r) for r in busy) < 1e-12  # it touches the lowest
    steep = {1: 0.001, 2: 0.05, 3: 0.1, 4: 0.15}  # lowered, it would start below zero
    (a, b), _ = B.lines(steep)
    assert a == 0 and all(steep[r] >= b * r for r in steep)


def test_the_bound_beats_batched_plain_and_prices_the_share():
    """A copied output drafts long; the bound at N is never below N plain rows a step, and with a
    decode's fixed cost shared by more sequences each draft pays less."""
    rng = random.Random(4)
    src = [rng.randrange(50) for _ in range(100)]
    data = [(src + [99], src[:40] + [77] + src[41:80]), (src + [98], [200 + i for i in range(30)])]
    line = {s: {r: 0.02 + 0.002 * r for r in B.shapes(s, 16)} for s in (1, 2, 4)}
    one = [0.0] + [0.02 + 0.002 * r for r in range(1, 18)]
    got = B.rates(data, one, line, 16)
    n = sum(len(y) for _, y in data)
    assert abs(got[1]["queued plain"] - 1 / 0.022) < 1e-9
    for s, r in got.items():
        assert abs(r["batched plain"] - s / (0.02 + 0.002 * s)) < 1e-9
        assert r["bound"] >= r["batched plain"] and r["bound"] >= r["controller (est.)"] * 0.999
    # one sequence: the bound is the oracle
    assert abs(got[1]["bound"] - got[1]["queued oracle"]) < 1e-6 * got[1]["bound"]
    assert got[4]["bound"] / got[4]["batched plain"] < got[1]["bound"] / got[1]["batched plain"]
    assert got[4]["bound"] > n / (n * 0.022)  # four sequences beat one queued


def test_prompt_processing_counted_on_both_sides_shrinks_the_ratio(capsys):
    """The prompts' processing is paid queued and batched alike: 2 s of it beside 4 s of queued decoding
    against 2 s batched makes 6 / 4 = 1.5x, not the decode's 2x."""
    data = [([1], [0] * 100), ([2], [0] * 100)]  # 200 tokens
    got = {1: {"queued lookup": 50.0, "bound": 50.0, "controller (est.)": 50.0},
           4: {"queued lookup": 50.0, "bound": 100.0, "controller (est.)": 80.0}}
    B.with_prompts(data, got, 2.0)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2] == "N=1 | 1.00x | 1.00x"
    assert lines[-1] == f"N=4 | 1.50x | {6 / (2 + 200 / 80):.2f}x"
