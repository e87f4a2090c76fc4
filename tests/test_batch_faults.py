"""`serve --parallel N`'s batch thread (server/batching.py over generate/batch.py) on the generated tiny model,
with a fault injected at each stage of a generation's life: joining (its grammar, its drafter's start), the
prefill (a prompt too long, a client that leaves half way), the first step and mid-stream (the drafter fails, the
client leaves). Each fault ends its own generation (an error, or a last step), and after it N generations in a row,
all at once on every sequence, still answer with plain decoding's greedy text: nothing a fault took (a sequence, a
slot) stays taken."""

import queue
import threading

import pytest
from spectool_lab.helpers import AlwaysWrong

from spectool.core.controller import Controller
from spectool.core.grammar import GrammarError
from spectool.core.stats import Stats
from spectool.generate.loop import GenerationConfig
from spectool.llama.parallel import ParallelModel
from spectool.server.batching import Batcher

N = 3
PROMPT = "The quick brown fox"
WAIT = 120  # seconds a generation may take here at most; a sequence never freed makes the next wait forever


class Faulty(AlwaysWrong):
    """An always-wrong drafter that raises at its start, or at its `after`-th draft."""

    def __init__(self, token: int, at: str, after: int = 0):
        super().__init__(token)
        self.at, self.after, self.drafts = at, after, 0

    def start(self, history, constraint=None):
        if self.at == "start":
            raise RuntimeError("injected at the drafter's start")

    def propose(self, history, k, sampling, rng):
        self.drafts += 1
        if self.at == "propose" and self.drafts > self.after:
            raise RuntimeError(f"injected at draft {self.drafts}")
        return super().propose(history, k, sampling, rng)


class NoMatcher:
    """A grammar whose matcher cannot be made for the model (as a token id past its vocabulary)."""

    def matcher(self, model):
        raise GrammarError("injected: the grammar names a token the model lacks")


@pytest.fixture(scope="module")
def batcher(tiny):
    with ParallelModel(tiny["target"], n_ctx=N * 256, n_threads=2, n_seq_max=N, n_batch=64) as m:
        b = Batcher(m)
        yield b
        b.close()  # its OpenMP threads with its thread: they would slow every later test's decodes (Batcher.close)
        assert not b.thread.is_alive()


def gen(model, drafter=None, grammar=None, n=24) -> GenerationConfig:
    return GenerationConfig(model, drafter, controller=Controller(k_max=4, k_min=1, timed=False), max_tokens=n,
                            grammar=grammar)


def generate(b: Batcher, g: GenerationConfig, tokens: list[int], seq: int, interrupted=lambda: False):
    """A worker's generation through the batch thread: (its tokens, its Stats), or the exception it ended with."""
    out: queue.SimpleQueue = queue.SimpleQueue()

    def work():
        st = Stats()
        try:
            out.put(([t for _, step in b.generate(g, tokens, [], st, interrupted, seq) for t in step.tokens], st))
        except BaseException as e:  # noqa: BLE001 - what the worker would answer
            out.put(e)

    threading.Thread(target=work, daemon=True).start()
    return out


def all_answer(b: Batcher, plain: list[int], tokens: list[int]) -> None:
    """N generations at once, one on each sequence, each with plain decoding's greedy text."""
    model = b.batch.target
    outs = [generate(b, gen(model, AlwaysWrong(wrong_token(model, plain))), tokens, seq) for seq in range(N)]
    for out in outs:
        got = out.get(timeout=WAIT)
        assert not isinstance(got, BaseException), got
        assert got[0] == plain and got[1].finish_reason == "length"
    assert sorted(b.batch.free) == list(range(N)) and not b.batch.active


def wrong_token(model, plain: list[int]) -> int:
    return min(set(range(model.n_vocab)) - set(plain))


def leaves_after(n_calls: int):
    """A client that leaves the n-th time it is asked whether it has."""
    calls = []
    return lambda: calls.append(1) or len(calls) >= n_calls


@pytest.mark.parametrize("stage", ["grammar", "drafter start", "prompt too long", "client leaves in the prefill",
                                   "first step", "mid-stream", "client leaves mid-stream"])
def test_a_fault_at_any_stage_frees_what_it_took(batcher, stage):
    model = batcher.batch.target
    tokens = model.tokenize(PROMPT)
    plain = generate(batcher, gen(model), tokens, 0).get(timeout=WAIT)[0]
    wrong = wrong_token(model, plain)
    long = model.tokenize(" ".join(["fox"] * (model.n_ctx_seq + 10)))[: model.n_ctx_seq + 5]
    faults = {
        "grammar": (gen(model, grammar=NoMatcher()), tokens, lambda: False),
        "drafter start": (gen(model, Faulty(wrong, "start")), tokens, lambda: False),
        "prompt too long": (gen(model), long, lambda: False),
        # a prompt of several batches (n_batch 64), whose client leaves after the first
        "client leaves in the prefill": (gen(model), long[: model.n_ctx_seq - 30], leaves_after(2)),
        "first step": (gen(model, Faulty(wrong, "propose")), tokens, lambda: False),
        "mid-stream": (gen(model, Faulty(wrong, "propose", after=3)), tokens, lambda: False),
        "client leaves mid-stream": (gen(model, AlwaysWrong(wrong)), tokens, leaves_after(4)),
    }
    g, prompt, interrupted = faults[stage]
    got = generate(batcher, g, prompt, 1, interrupted).get(timeout=WAIT)
    if stage == "client leaves mid-stream":
        assert got[1].finish_reason == "interrupted" and len(got[0]) < len(plain)
    else:  # the generation's own end: its error, or KeyboardInterrupt where its client left in the prefill
        assert isinstance(got, KeyboardInterrupt if "prefill" in stage else Exception), got
    for _ in range(2):  # N in a row, twice: every sequence, the faulty one's too, serves again
        all_answer(batcher, plain, tokens)
