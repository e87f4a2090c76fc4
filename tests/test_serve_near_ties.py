"""`--parallel`'s greedy text against the one-sequence server's on the real Gemma 3 270M (issue 58 item 10): a
batch's rows round differently from one sequence's, so a greedy token may differ where the two most likely tokens
are nearly tied, and the text after it. A probe under 12 clients on --parallel 8 saw 4 of 55 greedy requests
differ, all at log-probability margins of 0.11-0.13. On F16 each divergence must be a near-tie within the bound
docs/serve.md states (docs/exactness.md's for F16: a Q4_K_M model's batch rows stray by up to 1.0)."""

import threading
from pathlib import Path

import pytest
from spectool_lab.helpers import Server

# the widest log-probability margin at which --parallel's greedy token may differ, by the model's weights
NEAR_TIE = {"gemma_f16": 0.05, "gemma_q4": 1.0}
PROMPTS = ["The Eiffel Tower was completed in", "def binary_search(items, target):\n",
           "Photosynthesis is the process by which", "Once upon a time, in a small village,",
           "import numpy as np\n\ndef normalize(x):\n", "SELECT name, price FROM products WHERE"]


def test_the_docs_state_the_near_tie_bound_for_parallel():
    """docs/serve.md's parallel section claimed equal outputs without the README's near-tie caveat."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "serve.md").read_text()
    section = text[text.index("## Parallel requests"):text.index("## Clients")]
    assert "near-tie" in section and "0.11-0.13" in section
    assert f"F16 within {NEAR_TIE['gemma_f16']}" in section and f"Q4_K_M up to {NEAR_TIE['gemma_q4']}" in section


def margin(entry: dict, a: str, b: str) -> float:
    """How far token `a` leads token `b` in one position's top log-probabilities (inf: `b` is not among them)."""
    return entry[a] - entry[b] if a in entry and b in entry else float("inf")


@pytest.mark.realmodel
@pytest.mark.parametrize("weights", sorted(NEAR_TIE))
def test_greedy_under_parallel_differs_only_at_near_ties(request, weights):
    """In three runs on this project's 2-core AMD EPYC (2026-12-03, the machine busy), Q4_K_M's greedy texts
    differed on 6 of 8, 7 of 8 and 4 of 6 prompts, at margins up to 0.229; F16's on 0 of 8 and 1 of 6 (0.002).
    A clean-clone CI on 2026-12-05 saw --parallel's Q4_K_M token outside the one-sequence server's top 2 (" things"
    for " toys"), a margin the top 2 could not measure: the top 5 are read."""
    model = request.getfixturevalue(weights)
    one, four = Server(model, "-c", "4096"), Server(model, "-c", "16384", "--parallel", "4")
    try:
        # (the top 5: a quantized target's batch rows may lift the third or fourth token to the top)
        body = {"max_tokens": 32, "temperature": 0, "logprobs": 5}
        alone = [one.client().completions.create(model="m", prompt=p, **body).choices[0] for p in PROMPTS]
        together: list = [None] * len(PROMPTS)

        def complete(i):
            together[i] = four.client().completions.create(model="m", prompt=PROMPTS[i], **body).choices[0]

        threads = [threading.Thread(target=complete, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
    finally:
        one.stop()
        four.stop()
    differed = []
    for a, b in zip(alone, together):
        ta, tb = a.logprobs.tokens, b.logprobs.tokens
        j = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
        if j is None:
            assert a.text == b.text
            continue
        gap = margin(a.logprobs.top_logprobs[j], ta[j], tb[j])
        differed.append(round(gap, 3))
        assert gap < NEAR_TIE[weights], f"not a near-tie: {ta[j]!r} leads {tb[j]!r} by {gap:.3f} at token {j}"
    print(f"{len(differed)} of {len(PROMPTS)} differed, at margins {differed}")
