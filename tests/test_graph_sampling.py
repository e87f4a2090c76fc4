"""Sampling inside llama.cpp's graph (engine.Model.sample_on_backend, verify.backend_chain): the ids and candidates it
hands back are the host chain's, and generations through it equal generations over whole rows.

spectool samples in the graph by default only where the output layer runs on a GPU or a worker; these tests force it
on the CPU (graph_sampling=True) so that the same path is checked on every host. On a GPU host they check the same
models on the CPU: the oracle (rows read on the host) and the path under test then share one set of kernels, so
equality is exact there too.
"""

import numpy as np
import pytest

from spectool.core.controller import Controller
from spectool.llama.engine import DecodeError, Model
from spectool.llama.outputs import IDS, ROWS, Output
from spectool.generate.loop import GenerationConfig
from spectool.core.stats import Stats
from spectool.core.verify import Sampling, backend_chain, dist_at, distribution
from spectool_lab.helpers import drafters, tokens_of
from exactness import N_RUNS, chi2_rejects, exact_joint, sample_joint

CHAINS = [Sampling(temp=0.8, top_k=40, top_p=0.95, min_p=0.05), Sampling(temp=1.0, top_k=20),
          Sampling(temp=0.5, top_k=10, top_p=0.5), Sampling(temp=1.5, top_k=60, min_p=0.2)]


@pytest.fixture(scope="module")
def graph_target(tiny):
    with Model(tiny["target"], n_ctx=1024, n_threads=2, graph_sampling=True) as m:
        yield m


@pytest.fixture(scope="module")
def graph_draft(tiny):
    with Model(tiny["draft"], n_ctx=1024, n_threads=2, graph_sampling=True) as m:
        yield m


def test_the_cpu_reads_rows_unless_told(target):
    assert target.graph_sampling is False  # the measured default on the CPU backend (engine.Model)


def test_what_the_graph_may_sample():
    assert backend_chain(Sampling()) == IDS
    assert backend_chain(Sampling(temp=0.8, top_k=40)) == Output.top_k(40)
    assert backend_chain(Sampling(temp=0.8, top_k=0, top_p=0.9)) == ROWS  # top-p over the whole row
    assert backend_chain(Sampling(repeat_penalty=1.1)) == ROWS  # penalties see drafts the graph never saw
    assert backend_chain(Sampling(), banned=np.array([3])) == ROWS


def test_greedy_ids_are_the_argmax_of_the_rows(target, graph_target):
    tokens = target.tokenize("Speculative decoding lets a small draft model propose tokens")
    target.reset()
    graph_target.reset()
    target.eval(tokens, logits="all")
    graph_target.eval(tokens, logits="all", output=IDS)
    assert graph_target.output == IDS
    assert [graph_target.sampled_token(i) for i in range(len(tokens))] == \
        [int(np.argmax(target.logits(i))) for i in range(len(tokens))]
    with pytest.raises(DecodeError):
        graph_target.logits(0)  # no rows came out of this decode


@pytest.mark.parametrize("s", CHAINS, ids=str)
def test_top_k_candidates_give_the_host_chains_distribution(target, graph_target, s):
    tokens = target.tokenize("the dog the fox the dog and then")
    target.reset()
    graph_target.reset()
    target.eval(tokens, logits="all")
    graph_target.eval(tokens, logits="all", output=backend_chain(s))
    assert graph_target.output == Output.top_k(s.top_k)
    for i in range(len(tokens)):
        ids, z = graph_target.candidates(i)
        row = target.logits(i)
        assert len(ids) == s.top_k and np.array_equal(z, row[ids])  # the k best, with their exact logits
        assert np.sort(z)[0] >= np.sort(row)[-s.top_k]
        host, graph = distribution(row, s), dist_at(graph_target, i, s)
        assert np.array_equal(host.ids, graph.ids)
        np.testing.assert_array_equal(host.p, graph.p)  # the same arithmetic on the same numbers: exact


@pytest.mark.parametrize("text", ["The quick brown fox", "def add(a, b):\n    return a + b\n\ndef greet(name):"])
def test_greedy_output_in_the_graph_equals_plain_decoding_on_rows(target, graph_target, graph_draft, text):
    prompt = target.tokenize(text)
    plain = tokens_of(GenerationConfig(target, None, max_tokens=80), prompt)
    assert tokens_of(GenerationConfig(graph_target, None, max_tokens=80), prompt) == plain
    for name, make in drafters(graph_draft).items():
        st = Stats()
        g = GenerationConfig(graph_target, make(), max_tokens=80, controller=Controller(k_max=5, timed=False))
        assert tokens_of(g, prompt, st) == plain, name
        assert st.n_drafted > 0 and graph_target.output == IDS, name


@pytest.mark.parametrize("kind", ["draft", "lookup"])
def test_sampled_tokens_in_the_graph_follow_the_target_distribution(target, graph_target, graph_draft, kind):
    """The chi-square test of test_speculative.py, with the target and the draft sampled in the graph (top-k there,
    the rest of the chain on the host) and the exact joint computed over whole rows by the host chain."""
    s = Sampling(temp=1.0, top_k=20)
    prompt = target.tokenize("the dog the fox the dog the fox the dog the fox the dog the")
    prompt += tokens_of(GenerationConfig(target, None, max_tokens=20), prompt)
    st = Stats()
    counts = sample_joint(graph_target, drafters(graph_draft)[kind], prompt, s, stats=st)
    assert graph_target.output == Output.top_k(20) and min(st.accepted_per_position) > 0 and st.n_accepted < st.n_drafted
    rejects, stat, crit = chi2_rejects(counts, exact_joint(target, prompt, s), N_RUNS)
    assert not rejects, f"chi2 {stat:.1f} > {crit:.1f}"


def test_penalties_fall_back_to_rows_in_the_same_model(graph_target):
    prompt = graph_target.tokenize("The quick brown fox")
    tokens_of(GenerationConfig(graph_target, None, Sampling(temp=0.8, top_k=40, repeat_penalty=1.2), max_tokens=8,
                         seed=1), prompt)
    assert graph_target.output == ROWS  # whole rows, since the penalties' history holds drafts


@pytest.mark.realmodel
def test_real_gemma_rows_agree_between_the_graph_and_the_host(gemma_q4):
    """Gemma 3 270M's 262k-token rows: argmax ids and top-k chains from the graph equal the host's on the same rows
    (one decode each way of the same batch; rows come out of one model, so no batch-invariance question arises)."""
    with Model(gemma_q4, n_ctx=512, n_threads=2) as rows, Model(gemma_q4, n_ctx=512, n_threads=2,
                                                                  graph_sampling=True) as graph:
        tokens = rows.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(")
        rows.eval(tokens, logits="all")
        host = [np.array(rows.logits(i)) for i in range(len(tokens))]
        graph.eval(tokens, logits="all", output=IDS)
        assert [graph.sampled_token(i) for i in range(len(tokens))] == [int(np.argmax(r)) for r in host]
        for s in CHAINS:
            graph.reset()
            graph.eval(tokens, logits="all", output=Output.top_k(s.top_k))
            for i, row in enumerate(host):
                a, b = distribution(row, s), dist_at(graph, i, s)
                assert np.array_equal(a.ids, b.ids) and np.array_equal(a.p, b.p), (s, i)


def test_a_greedy_draft_s_runner_ups_from_the_graph_are_the_rows(target, draft, graph_draft):
    """With trees on, a greedy draft model on a graph-sampling model asks llama.cpp's graph for each row's top 4
    (not the argmax alone): the same chain and the same runner-ups, at the same shares, as drafting over whole rows."""
    from spectool.drafters.draft_model import DraftModel

    prompt = target.tokenize("the dog the fox the dog the fox the dog the cat the")
    made = []
    for model in (draft, graph_draft):
        dm = DraftModel(model, runner_ups=True)
        dm.start(prompt)
        chain = dm.propose(prompt, 4, Sampling(), np.random.default_rng(0)).tokens
        made.append((chain, dm.branches(prompt, chain, 4), model.output))
    (chain, rows, how), (graph_chain, graph, graph_how) = made
    assert how is ROWS and graph_how == Output.top_k(4)
    assert graph_chain == chain and [(b.depth, b.token) for b in graph] == [(b.depth, b.token) for b in rows]
    assert np.allclose([b.share for b in graph], [b.share for b in rows], atol=1e-4) and len(rows) == 3 * len(chain)
