"""The measuring tools' own pieces, run by the suite (pyproject.toml's testpaths): spectool_lab's
prompts from the real data sets, and the replays' bounds (research/lookup_bound.py,
research/corpus_replay.py) on replayed costs, no model; lookup_bound.py's port of llama-lookup
against the tool itself, on the demo model."""

import io
import json

import pytest

from spectool_lab import common as P


@pytest.fixture(scope="module")
def gemma_f16():
    """F16 Gemma 3 270M, as the research scripts load it (spectool_lab.common.models, cached)."""
    return P.models(("F16",))["F16"]


def test_iter_json_array_stops_quietly_at_a_truncated_item():
    items = [{"id": i, "text": "x" * i} for i in range(50)]
    full = json.dumps(items)
    cut = full[: full.index('"id": 40') + 5]  # the 41st object is cut in the middle
    got = list(P.iter_json_array(io.StringIO(cut), chunk=64))
    assert got == items[:40]
    assert list(P.iter_json_array(io.StringIO(full), chunk=7)) == items


def test_sharegpt_prompts_are_real_and_shaped():
    g, f = P.grounded_prompts(4), P.freeform_prompts(4)
    assert len(g) == 4 and len(f) == 4
    assert all(600 <= len(p) - len("\n\nAnswer:\n") <= 2500 and p.endswith("Answer:\n") for p in g)
    assert all(p.startswith("Question: ") and p.endswith("?\nAnswer:") for p in f)
    assert len(set(f)) == 4


def test_humaneval_prompts_contain_the_function_and_a_request():
    ps = P.humaneval_prompts(3)
    assert len(ps) == 3 and all("def " in p and "return" in p for p in ps)
    assert ps[0].endswith("# The same function again, unchanged:\n\n")
    assert "_v2:" in ps[2]


def test_unseen_samples_leave_out_the_tuning_list_and_follow_their_seed():
    """spectool_lab.common: what a benchmark reports on is drawn from each set less its tuning list, by a seed
    that repeats it; the tuning list is what the fixed selections always gave."""
    assert P.tuning("code editing (HumanEval)") == P.humaneval_prompts(P.TUNING)
    assert P.tuning("free-form (ShareGPT)") == P.freeform_prompts(P.TUNING)
    for name in P.SETS:
        pool, tuned = P.pool(name), set(P.tuning(name))
        assert len(pool) == len(set(pool)) > 3 * P.TUNING
        a, b, c = P.unseen(name, 8, 1), P.unseen(name, 8, 1), P.unseen(name, 8, 2)
        assert a == b and a != c and len(set(a)) == 8
        assert not (set(a) | set(c)) & tuned
    s = P.samples("code editing (HumanEval)", 8, 7, 3)
    assert list(s) == ["tuning", "unseen 1", "unseen 2", "unseen 3"]
    assert s["unseen 2"] == P.unseen("code editing (HumanEval)", 8, 8)


def test_lookup_bound_replays_policies_and_the_oracle_bounds_them():
    """research/lookup_bound.py: replayed step costs, no model. The oracle drafts from the same lookup knowing
    what will be accepted, so nothing that drafts from it can be cheaper."""
    import random

    import lookup_bound as L
    from spectool.core.costs import Costs

    cost = [0.0, 1.0] + [1.6 + 0.15 * (b - 2) for b in range(2, 40)]
    rng = random.Random(3)
    src = [rng.randrange(50) for _ in range(120)]
    y = src[:40] + [rng.randrange(50, 60) for _ in range(5)] + src[45:90]  # a copy with one edit
    p = src + [99]
    assert L.accepted([1, 2, 3], [0, 1, 2, 4], 1) == 2 and L.accepted([], [1], 0) == 0
    theirs, ours, best = L.theirs(p, y, cost), L.ours(p, y, cost, 32, Costs()), L.oracle(p, y, cost, 32)
    assert best <= ours and best <= theirs < len(y) * cost[1]
    assert ours < 0.5 * len(y) * cost[1]  # a copy: far fewer steps than tokens
    novel = [100 + i for i in range(30)]  # nothing to look up: every policy pays one step a token
    assert L.oracle(p, novel, cost, 32) == len(novel) * cost[1] == L.ours(p, novel, cost, 32, Costs())


def test_corpus_replay_bounds_hold_its_rules():
    """research/corpus_replay.py on replayed costs, no model: an oracle over a rule's drafts is never dearer than
    the rule, the better source at every token never dearer than the default merge, and SuffixDecoding's lengths
    draft from the same merged predictions. The requests repeat earlier outputs that their prompts do not hold."""
    import random

    import corpus_replay as R
    from spectool.drafters.lookup import latest

    cost = [0.0, 1.0] + [1.6 + 0.15 * (b - 2) for b in range(2, 40)]
    rng = random.Random(5)
    answers = [[rng.randrange(40) for _ in range(60)] for _ in range(3)]
    data = [([200 + i, 300 + i % 3], answers[i % 3] + [rng.randrange(40) for _ in range(8)]) for i in range(6)]
    alone, merged, best = R.bounds(data, cost, 32)
    today, default = R.replay(data, None, cost, 32), R.replay(data, R.Rule(), cost, 32)
    assert alone <= today and merged <= default and best <= merged
    assert R.replay(data, R.Rule(corpus=R.Unruled), cost, 32) < today  # the corpus without its disputes' tally
    assert R.replay(data, R.Rule(latest), cost, 32) < today
    assert merged < alone  # the later requests repeat the earlier ones: the corpus's drafts are worth something
    assert default < today and merged <= R.suffix_rule(data, 2, cost, 32) < today
    assert R.match_length([1, 2, 3], [[0, 2, 3, 9], [3, 4]]) == 2 and R.match_length([5], [[1, 2]]) == 0
    # the looser bounds: every token a lookup drafts follows the one before it in the text it looked up
    own, with_earlier = R.chain_bounds(data, cost, 32)
    foresight = sum(R.foresight(y, cost, 32) for _, y in data)
    assert own <= alone and with_earlier <= best and foresight <= with_earlier < own
    # a pair seen nowhere before breaks every draft: one step a token, whatever the text
    assert R.chain_bounds([([1, 2], [3, 4, 5])], cost, 32) == [3 * cost[1]] * 2
    assert R.chain_bounds([([1, 2, 1, 2], [1, 2, 1])], cost, 32)[0] == cost[3]  # 2 drafted after the first
    assert R.foresight([3, 4, 5], cost, 32) == cost[3]  # foreseen: 3 tokens, one step
    # an output written whole before is charged foresight, the others replayed as they were
    again = R.replay([*data, data[0]], R.Rule(), cost, 32, foresee_repeats=True)
    assert again == default + R.foresight(data[0][1], cost, 32) < R.replay([*data, data[0]], R.Rule(), cost, 32)


def test_no_controller_variant_or_hindsight_beats_the_oracle_over_the_same_drafts():
    """research/controller_replay.py: every policy it replays drafts lookup's drafts, so none may be cheaper than the
    oracle over them (a shortest path), on a text that copies and strays; and best_k is the argmax it says."""
    import itertools
    import random

    import controller_replay as C
    from spectool_lab.replay import oracle

    rng = random.Random(7)
    cost = [0.0] + [0.016 + 0.004 * b + (0.003 if b % 3 else 0.0) for b in range(1, C.K_MAX + 3)]
    words = [rng.randrange(50) for _ in range(40)]
    p = words * 2  # the prompt repeats itself: long matches
    y = words[:15] + [rng.randrange(50) for _ in range(10)] + words[20:40]  # copies, strays, copies again
    bound = oracle(p, y, cost, C.K_MAX)
    pos = C.features(p, y)
    seconds = [C.hindsight_seconds(pos, cost, fn) for fn in C.FEATURES.values()]
    seconds += [C.online_seconds(pos, cost, fn) for fn in (None, C.FEATURES["key (today's)"])]
    seconds += [C.replay(v, [(p, y)], cost) for v in C.variants().values()]
    assert min(seconds) >= bound - 1e-12 and max(seconds) > bound * 1.01
    for a in ([0.9, 0.8, 0.1], [0.2, 0.99, 0.99, 0.99], [0.5] * 6, []):
        ratio = {k: (1 + sum(itertools.accumulate(a[:k], lambda x, y: x * y))) / cost[k + 1]
                 for k in range(len(a) + 1)}
        assert C.best_k(a, cost) == max(ratio, key=ratio.__getitem__)


def test_evidence_harness_scales_the_controllers_estimate_and_reads_text_endings():
    """research/copy_source.py's harness: scaled by a ratio of 1 the controller's estimate is online_seconds' own, by
    0 it drafts nothing (plain's seconds), and by the candidate's ratio it stays above the oracle; text_boundary.py's
    classes of a token's text."""
    import random

    import controller_replay as C
    import copy_source as S
    from spectool_lab.replay import oracle
    from text_boundary import ending

    rng = random.Random(11)
    cost = [0.0] + [0.016 + 0.004 * b for b in range(1, C.K_MAX + 3)]
    words = [rng.randrange(50) for _ in range(40)]
    p, y = words * 2, words[:15] + [rng.randrange(50) for _ in range(10)] + words[20:40]
    pos = S.positions(p, y)
    assert S.scaled_seconds(pos, cost, lambda f: 1.0) == C.online_seconds(pos, cost, None)
    assert S.scaled_seconds(pos, cost, lambda f: 0.0) == pytest.approx(len(y) * cost[1])
    assert S.scaled_seconds(pos, cost, S.ratios([pos], S.FNS["key, both"])) >= oracle(p, y, cost, C.K_MAX) - 1e-12
    assert ([ending(b) for b in (b"end.\n", b" it.", b", ", b" word", b"  ", b")")]
            == ["line", "sentence", "punct", "word", "punct", "punct"])


def test_source_runs_count_how_far_the_source_agreed_after_and_matched_before():
    """research/source_run.py: after an n-gram's latest earlier occurrence (the source) and the one before it, how far
    the texts after them agreed, and how far the text so far matches the text before the source; each drafted token
    is "within" that agreement up to its length and "beyond" after it."""
    import random

    import source_run as R
    from copy_source import source

    h = [1, 2, 3, 7, 8, 9, 5, 1, 2, 3, 7, 8, 4, 6, 1, 2, 3]
    at = source(h, 3, 7)
    assert at == 10 and R.earlier(h, 3, at) == 3
    assert R.agreed(h, 3, at) == 2  # 7 8, then 9 against 4
    assert R.matched_before(h, at) == 3  # 1 2 3, then 5 against 6
    assert R.earlier(h, 3, 3) is None
    h = [1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 3]  # the texts after the two earlier places part at once
    assert source(h, 3, 6) == 7 and R.agreed(h, R.earlier(h, 3, 7), 7) == 0
    rng = random.Random(13)
    words = [rng.randrange(50) for _ in range(40)]
    p, y = words * 3, words[:15] + [rng.randrange(50) for _ in range(10)] + words[20:40]
    pos = R.positions(p, y)
    marks = [[f["after"] for f in feats] for _, feats in pos]
    assert {"within", "beyond"} <= {m for ms in marks for m in ms}
    for j, (_, feats) in enumerate(pos):  # within the agreement up to its length, then beyond it
        if feats and feats[0]["after"] != "alone":
            h = p + y[:j]
            at = source(h, feats[0]["n"], feats[0]["token"])
            went = R.agreed(h, R.earlier(h, feats[0]["n"], at), at)
            assert [f["after"] for f in feats] == [("within" if i < went else "beyond") for i in range(len(feats))]


def test_offer_learner_tells_only_what_the_text_has_judged():
    """research/offer_learning.py: each offered token beyond the drafted ones is told to the controller only once the
    text has passed it, with whether the text held it, and nothing of an offer after the first token refused; the
    replay with it never beats the oracle."""
    import random

    from offer_learning import OfferLearner

    from controller_replay import K_MAX, known
    from spectool.core.controller import Controller
    from spectool_lab.replay import oracle, ours

    rng = random.Random(12)
    cost = [0.0] + [0.016 + 0.004 * b for b in range(1, K_MAX + 3)]
    words = [rng.randrange(50) for _ in range(40)]
    p, y = words * 2, words[:15] + [rng.randrange(50) for _ in range(10)] + words[20:40]
    learner = OfferLearner(y, 1.0)
    seconds = ours(p, y, cost, K_MAX, known(cost), ctl=Controller(k_max=K_MAX, costs=known(cost)), step=learner)
    told = learner.told
    assert any(hit for *_, hit, _ in told) and not all(hit for *_, hit, _ in told)
    assert all(at < n for _, at, _, n in told)  # the text had passed it
    for j in {j for j, *_ in told}:  # each offer: consecutive tokens, none told after one refused
        mine = [(at, hit) for j0, at, hit, _ in told if j0 == j]
        assert [at for at, _ in mine] == list(range(mine[0][0], mine[0][0] + len(mine)))
        assert all(hit for _, hit in mine[:-1])
    assert seconds >= oracle(p, y, cost, K_MAX) - 1e-12


def test_the_busy_run_s_table_drafts_short_on_the_least_squares_line_and_not_as_shipped():
    """research/extrapolation.py's case without a model: a copy replayed at Gemma Q4_K_M's batch costs (a kernel
    switch at 5, 2-core EPYC; in units of one token) from the busy run's table (BUSY). On the least-squares line the
    controller drafts short for most of the copy, as shipped it reaches long drafts: fewer seconds (at least 10%;
    measured 2026-12-07 on the real copy, 1.83x plain decoding against 1.63x), and neither beats the oracle."""
    import random

    from extrapolation import RULES, busy_table, seconds

    from controller_replay import K_MAX
    from spectool_lab.replay import oracle

    shape = [1.0, 1.57, 1.68, 1.92, 2.97, 3.25, 3.55, 2.94, 4.08, 4.25, 4.41, 3.41, 4.83, 5.07, 5.21, 4.60, 5.56]
    cost = [0.0] + [0.0153 * c for c in shape] + [0.0153 * (4.6 + 0.22 * (b - 16)) for b in range(17, K_MAX + 3)]
    rng = random.Random(3)
    words = [rng.randrange(500) for _ in range(120)]
    # the prompt ends in an n-gram it holds (a first draft refused), then the text copies the prompt
    p, y = words + words[10:12], [900, 901] + words[:100]
    line, shipped = (seconds([(p, y)], cost, reach, False, busy_table()) for reach in RULES.values())
    assert shipped < 0.9 * line and min(line, shipped) >= oracle(p, y, cost, K_MAX) - 1e-12


@pytest.mark.realmodel
def test_llama_lookup_port_drafts_what_llama_lookup_drafts(gemma_f16):
    """research/lookup_bound.py's port of llama-lookup's drafting (common/ngram-cache.cpp) against
    llama-lookup itself, built from the vendored llama.cpp (spectool_lab.llamacpp, cached): over
    the same greedy output of F16 Gemma 3 270M on a HumanEval edit, the port drafts as many tokens
    as the real tool reports (n_drafted), step for step up to where the tool stops (after the step
    that takes its count past -n)."""
    import lookup_bound as L
    from spectool.llama import engine
    from spectool_lab import llamacpp
    from spectool_lab.replay import plain_output

    binary = llamacpp.build(quiet=True, targets=("llama-lookup",))["llama-lookup"]
    tokens = 96
    # prompts where llama-lookup's tie between followers seen as often decides drafts (its newest wins)
    for name in ("code editing (HumanEval)", "grounded chat (ShareGPT)"):
        text = P.unseen(name, 8, 4401)[0]
        with engine.Model(gemma_f16, n_ctx=llamacpp.CTX_SIZE, n_threads=2) as target:
            p = target.tokenize(text)
            y = plain_output(target, p, tokens + 16)
        run = llamacpp.lookup(binary, gemma_f16, text, tokens)
        drafted, made = 0, 0
        for d, m in L.llama_lookup_steps(p, y):
            if made > tokens - 1:  # the tool stops before drafting again
                break
            drafted, made = drafted + d, made + m + 1
        assert run.drafted > 10 and run.accepted > 5  # both copy from their prompt: drafted
        assert drafted == run.drafted, name


def test_a_prompt_whose_sampled_lookup_runs_all_ended_at_once_has_no_per_prompt_figure():
    """benchmarks/vs_llamacpp.py's report, sampled: where every spectool lookup run of a prompt ended at its first
    token (left out, nothing timed), the prompt has no figure against the fastest drafter, rather than 0.00x; the other
    prompts keep theirs (a run of 2026-12-07 reported 0.00x for such a prompt)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "vs_llamacpp.py"
    spec = importlib.util.spec_from_file_location("vs_llamacpp_report", path)
    V = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (its dataclasses look it up there)
    spec.loader.exec_module(V)
    R = V.Record
    records = [R("m", "qa", 0, p, c, 96, s) for p in (0, 1)
               for c, s in ((V.PLAIN, 1.0), (V.COMPLETION, 1.0), (V.LOOKUP_CPP, 0.9), ("ngram-mod", 0.8))]
    records += [R("m", "qa", 0, 0, V.LOOKUP, 96, 0.64), R("m", "qa", 0, 1, V.LOOKUP, 1, 0.01, at_once=True)]
    assert V.fastest_on([r for r in records if r.prompt == 1 and not r.at_once]) is None
    row = V.row("m", "qa", [r for r in records if not r.at_once], ["", ""])
    assert row.worst == pytest.approx(0.8 / 0.64) and row.worst_at.startswith("prompt 1,")


def test_mean_bound_reads_the_live_fastest_drafter_as_the_report_would(tmp_path):
    """research/mean_bound.py's --live: each family's fastest of llama.cpp's n-gram drafters in a stored run, the
    mean over repeats of its pooled tok/s, over llama-completion's; a run that ended at its first token left out (it
    would make llama-lookup the fastest here), a failed one too; another seed's run refused."""
    import mean_bound

    def rec(contender, repeat, prompt, tokens, seconds, **kw):
        return {"model": "m", "family": "qa", "repeat": repeat, "prompt": prompt, "contender": contender,
                "tokens": tokens, "seconds": seconds, "failed": kw.get("failed", ""), "at_once": kw.get("at_once")}

    records = []
    for k in range(2):
        records += [rec("llama-completion", k, 0, 100, 1.0), rec("llama-completion", k, 1, 100, 1.0),
                    rec("ngram-mod", k, 0, 100, 0.8), rec("ngram-mod", k, 1, 100, 0.8 + 0.4 * k),
                    rec("llama-lookup", k, 0, 100, 1.1), rec("llama-lookup", k, 1, 100, 1.1),
                    rec("spectool lookup", k, 0, 100, 0.5), rec("spectool lookup", k, 1, 100, 0.5)]
    records += [rec("ngram-mod", 0, 2, 1, 5.0, at_once=True), rec("ngram-mod", 1, 2, 100, 0.01, failed="x")]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"seed": 7, "records": records}))
    drafter, over = mean_bound.live_fastest(run, 7)[("m", "qa")]
    # ngram-mod: 200 tokens in 1.6 s, then in 2.0 s: 125 and 100 tok/s; llama-completion 100 both times
    assert drafter == "ngram-mod" and over == pytest.approx(1.125)
    with pytest.raises(SystemExit):
        mean_bound.live_fastest(run, 8)
