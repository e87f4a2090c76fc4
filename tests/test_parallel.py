"""Parallel sequences in one context (generate/batch.py over llama/parallel.py), on the generated
tiny models: every sequence's output is its output generated alone, greedy and seeded, whatever
runs beside it and whenever it joins; rejected drafts leave their own sequence only."""

from dataclasses import replace

import numpy as np
import pytest
from spectool_lab.helpers import AlwaysWrong, tokens_of

from spectool.core.controller import Controller
from spectool.core.costs import Costs
from spectool.core.grammar import Grammar
from spectool.core.stats import Stats
from spectool.core.verify import Sampling
from spectool.drafters.builder import for_generation
from spectool.drafters.lookup import PromptLookup
from spectool.generate.batch import Batch
from spectool.generate.loop import GenerationConfig, speculative_generate
from spectool.llama.engine import EngineError
from spectool.llama.parallel import ParallelModel

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef greet(name):",
    "Speculative decoding lets a small draft model propose tokens that a large target",
    "for i in range(10):\n    total = add(total, i)\n",
    "Summaries, answers and code edits often repeat the text of the prompt",
]
SAMPLED = Sampling(0.8, 40, 0.95, 0.05)
# a JSON-like record: literal keys the grammar forces, free values (as test_grammar.py's)
RECORD = 'root ::= "{\\"name\\": \\"" [a-z ]{1,10} "\\", \\"n\\": " [0-9]{1,3} "}"'


@pytest.fixture(scope="module", params=[False, True], ids=["kv-per-seq", "kv-unified"])
def parallel(tiny, request):
    with ParallelModel(tiny["target"], n_ctx=4 * 512, n_threads=2, n_seq_max=4,
                       kv_unified=request.param) as m:
        yield m


def config(model, drafter=None, n=48, sampling=None, seed=None):
    # untimed: the controller's choices hang on the tokens alone, never on how busy the machine is
    return GenerationConfig(model, drafter() if drafter else None, sampling or Sampling(),
                            Controller(k_max=5, timed=False), max_tokens=n, seed=seed)


def run(batch, jobs, steps=None):
    """Each job (step it joins at, GenerationConfig, prompt) through `batch`, joining at the first
    step boundary at or after its own with a free sequence; every job's tokens and Stats (and its
    Steps into `steps`, a list per job)."""
    tokens, stats, seq_of, pending, step = {}, {}, {}, list(range(len(jobs))), 0
    steps = [[] for _ in jobs] if steps is None else steps
    while pending or batch.active:
        for j in [j for j in pending if jobs[j][0] <= step and batch.free]:
            stats[j] = Stats()
            seq_of[batch.join(jobs[j][1], jobs[j][2], stats[j])] = j
            tokens[j] = []
            pending.remove(j)
        for seq, s in batch.step().items():
            tokens[seq_of[seq]] += s.tokens
            steps[seq_of[seq]].append(s)
        step += 1
    return [tokens[j] for j in range(len(jobs))], [stats[j] for j in range(len(jobs))]


def test_greedy_outputs_equal_each_alone(target, parallel):
    """Five sequences over four seq ids, with lookup, plain decoding and an always-wrong drafter, of
    different lengths: they leave at different steps and the fifth joins the seq id one left. Each
    output is the single-sequence loop's plain greedy output, token for token."""
    ids = [target.tokenize(t) for t in PROMPTS]
    alone = [tokens_of(config(target, n=n), p) for p, n in zip(ids, (48, 20, 64, 9, 40))]
    wrong = min(set(range(target.n_vocab)) - {t for out in alone for t in out})
    makers = [PromptLookup, None, PromptLookup, lambda: AlwaysWrong(wrong), PromptLookup]
    jobs = [(0, config(parallel, make, n), p)
            for make, p, n in zip(makers, ids, (48, 20, 64, 9, 40))]
    jobs[2] = (3, *jobs[2][1:])  # joins once the others are under way
    got, stats = run(Batch(parallel), jobs)
    assert got == alone
    assert stats[2].n_accepted > 0 and stats[4].n_accepted > 0  # lookup's drafts accepted ...
    assert stats[3].n_drafted > 0 == stats[3].n_accepted  # ... and the wrong ones all rejected
    assert len({tuple(out[:8]) for out in got}) == len(got)  # five different outputs


def test_a_seeded_sample_is_the_same_whatever_runs_beside_it(target, parallel):
    """A sampled sequence with a seed draws the same tokens alone in the loop, alone in a batch, and
    beside three others (sampled with other seeds, greedy, with drafts rejected), joining late."""
    ids = [target.tokenize(t) for t in PROMPTS]
    alone = tokens_of(config(target, PromptLookup, 64, SAMPLED, seed=7), ids[1])
    by_itself, _ = run(Batch(parallel), [(0, config(parallel, PromptLookup, 64, SAMPLED, 7),
                                          ids[1])])
    beside = [(0, config(parallel, PromptLookup, 64, SAMPLED, seed=8), ids[0]),
              (0, config(parallel, PromptLookup, 30), ids[2]),
              (0, config(parallel, lambda: AlwaysWrong(3), 50, SAMPLED, seed=9), ids[3]),
              (2, config(parallel, PromptLookup, 64, SAMPLED, seed=7), ids[1])]
    crowded, _ = run(Batch(parallel), beside)
    assert by_itself[0] == alone == crowded[3]
    other, _ = run(Batch(parallel), [(0, config(parallel, PromptLookup, 64, SAMPLED, 70), ids[1])])
    assert other[0] != alone  # the seed matters: the sample is not the greedy text


def test_grammars_and_logprobs_are_served_in_a_batch_as_alone(target, parallel):
    """Beside a plain sequence: one under a grammar, its forced tokens drafted, whose output is the
    one-sequence loop's and stops where the grammar completes; one whose tokens' logprobs are the
    one-sequence loop's."""
    prompt = target.tokenize('{"name": "ann lee", "n": 42} {"name": "bob', add_special=True)

    def under(model):
        return replace(config(model, n=40), grammar=Grammar.gbnf(RECORD),
                       drafter=for_generation(PromptLookup(), grammar=True))

    def logged(model):
        return replace(config(model, PromptLookup, 30), logprobs=2)

    other = target.tokenize(PROMPTS[1])
    alone, alone_steps = tokens_of(under(target), prompt), list(speculative_generate(
        logged(target), other))
    steps: list = [[], [], []]
    got, stats = run(Batch(parallel), [(0, under(parallel), prompt), (0, logged(parallel), other),
                                       (0, config(parallel, PromptLookup), prompt)], steps)
    assert got[0] == alone and stats[0].finish_reason == "stop"
    assert stats[0].by_source.get("grammar", 0) > 0
    assert got[1] == [t for s in alone_steps for t in s.tokens]
    want = [lp for s in alone_steps for lp in s.logprobs]
    have = [lp for s in steps[1] for lp in s.logprobs]
    assert len(have) == len(want) == len(got[1])
    for a, b in zip(have, want):  # batches of other shapes round a little differently
        assert abs(a.logprob - b.logprob) < 1e-2 and [i for i, _ in a.top] == [i for i, _ in b.top]


def test_each_sequence_reads_its_own_rows_and_rolls_back_alone(target, parallel):
    """eval_seqs' rows of each sequence are the logits a one-sequence model gives at that position;
    rolling one sequence back leaves the others' caches as they were."""
    a, b = target.tokenize(PROMPTS[0]), target.tokenize(PROMPTS[2])
    parallel.reset()
    starts = parallel.eval_seqs([(0, a), (2, b)])
    assert starts == [0, len(a)] and parallel.seqs[0] == a and parallel.seqs[2] == b
    got = [parallel.logits(len(a) - 1).copy(), parallel.logits(len(a) + len(b) - 1).copy()]
    for row, prompt in zip(got, (a, b)):
        target.reset()
        target.eval(prompt)
        np.testing.assert_allclose(row, target.logits(), rtol=1e-4, atol=1e-4)
    assert parallel.rollback(2, seq=2) and parallel.seqs[2] == b[:2] and parallel.seqs[0] == a
    parallel.eval_seqs([(0, [5]), (2, b[2:4])])
    row = parallel.logits(0).copy()
    # a batch of 3 against one of 1: llama.cpp's kernels round a little differently (exactness.md)
    target.reset()
    target.eval(a)
    target.eval([5])
    assert np.abs(row - target.logits()).max() < 1e-2
    target.eval([5])  # a history one token off: far from it
    assert np.abs(row - target.logits()).max() > 0.1
    parallel.reset()


def test_joining_refuses_what_a_batch_cannot_serve(tiny, target, parallel):
    batch = Batch(parallel)
    prompt = target.tokenize(PROMPTS[0])
    for _ in range(parallel.n_seq_max):
        batch.join(config(parallel), prompt)
    with pytest.raises(EngineError, match="all 4 sequences are busy"):
        batch.join(config(parallel), prompt)
    batch.close()
    assert batch.free == list(range(4)) and not any(parallel.seqs)
    with pytest.raises(ValueError, match="not for this batch's model"):
        batch.join(config(target), prompt)
    n = parallel.n_ctx_seq  # 512 a sequence, or the whole 2048 of a unified cache
    with pytest.raises(EngineError, match=f"a sequence holds only {n}"):
        batch.join(config(parallel), [1] * (n + 1))



def test_a_batch_s_first_decodes_are_priced_from_the_controller_s_table(target, parallel):
    """A decode costs by its rows, not by the sequences that share them, so the batch's table for
    several sequences starts from the controller's (Costs.seed): where the controller has measured
    that every row costs as much as a one-token step, two sequences' first step drafts nothing,
    though lookup has drafts to offer; with the controller's table empty, the same step drafts
    (rows not yet measured are priced to be tried)."""
    prompt = target.tokenize(PROMPTS[1] * 3)  # echoes itself: lookup offers drafts at once

    def first_drafts(costs):
        ctl, batch = Controller(k_max=5, costs=costs), Batch(parallel)
        for _ in range(2):
            batch.join(replace(config(parallel, PromptLookup, 8), controller=ctl), prompt)
        plans = batch.plan({})
        batch.close()
        return [len(p.draft.tokens) for p in plans.values()]

    assert sum(first_drafts(Costs())) > 0
    assert first_drafts(Costs(verify={b: 0.01 * b for b in range(1, 33)})) == [0, 0]

def test_a_prompt_joins_the_sequence_that_holds_its_prefix(target, parallel):
    """A sequence keeps its cache when it leaves: a prompt that continues one of four (its prompt
    and output) joins that one's seq id, prefills only what follows them, and generates what the
    one-sequence loop does; a prompt that shares too little with every cache
    (SLOT_PROMPT_SIMILARITY) joins the one left longest ago."""
    parallel.reset()
    batch = Batch(parallel)
    ids = [target.tokenize(t) for t in PROMPTS[:4]]
    got, _ = run(batch, [(0, config(parallel, n=n), p) for p, n in zip(ids, (8, 4, 8, 6))])
    assert [parallel.seqs[s] for s in range(4)] == [(p + out)[:-1] for p, out in zip(ids, got)]
    longer = ids[2] + got[2] + target.tokenize(" and then", add_special=False)
    assert batch.pick(longer) == 2  # (the lowest id and the least recently left: 0 and 1)
    out, (stats,) = run(batch, [(0, config(parallel, n=8), longer)])
    assert stats.n_prefilled == len(longer) - len(ids[2]) - len(got[2])  # the cache held all but
    assert out[0] == tokens_of(config(target, n=8), longer)  # ... its last token
    assert batch.pick(target.tokenize(PROMPTS[4])) == 1  # left first: 1 (4 tokens), 3, 0, 2


def test_sequences_that_share_a_controller_draft_together_and_teach_it_the_batch_s_costs(target, parallel):
    """The server's shape: every sequence under one controller, which picks their drafts together. Each output
    is still its plain greedy output alone, lookup's drafts are accepted, and the decodes of several sequences
    price their row counts in the batch's table for that many sequences, not the one-sequence table (two
    sequences that draft nothing: 2 rows in the table of two)."""
    ids = [target.tokenize(t) for t in PROMPTS[:4]]
    alone = [tokens_of(config(target, n=40), p) for p in ids]
    shared = Controller(k_max=5, timed=False)
    jobs = [(0, replace(config(parallel, PromptLookup, 40), controller=shared), p) for p in ids]
    got, stats = run(Batch(parallel), jobs)
    assert got == alone
    assert sum(s.n_accepted for s in stats) > 0
    timed, batch = Controller(k_max=5), Batch(parallel)
    plain = [(0, replace(config(parallel, None, 24), controller=timed), p) for p in ids[:2]]
    assert run(batch, plain)[0] == [out[:24] for out in alone[:2]]
    assert set(timed.costs.shapes) == {2} and set(timed.costs.shapes[2].verify) == {2}
    assert not timed.costs.verify
