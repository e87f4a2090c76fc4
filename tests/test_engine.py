"""The engine on the generated tiny models and the real llama.cpp."""

import shutil

import numpy as np
import pytest

from spectool.llama.engine import Model, ModelLoadError, backend_info, check_gguf_file

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def greet(name):\n    print(\"Hello, \" + name + \"!\")\n",
    "héllo wörld, 日本語 and an emoji 🙂 mixed with ascii",
    "  leading spaces and\ttabs\n\nand blank lines  ",
]


@pytest.mark.parametrize("text", TEXTS)
def test_text_round_trips(target, text):
    tokens = target.tokenize(text, add_special=False)
    assert target.detokenize(tokens) == text
    # the vocabulary has real multi-character tokens, not only bytes
    assert len(tokens) < len(text.encode()) or not text.isascii()


def test_tokenize_uses_multichar_tokens(target):
    tokens = target.tokenize("The quick brown fox", add_special=False)
    assert len(tokens) <= 5
    assert any(len(target.piece(t)) > 2 for t in tokens)


def test_tokenize_adds_bos(target):
    info = target.vocab_info()
    assert target.tokenize("fox")[0] == info.bos
    assert target.tokenize("fox", add_special=False)[0] != info.bos


def test_incremental_detokenize_never_splits_a_character(target):
    text = "日本語 🙂 é"
    tokens = target.tokenize(text, add_special=False)
    pieces = [target.piece(t) for t in tokens]
    assert any(len(p) == 1 and p[0] >= 0x80 for p in pieces), "expected byte-fallback tokens"
    d = target.detokenizer()
    outs = [d.feed([t]) for t in tokens]
    assert "".join(outs) + d.flush() == text
    assert all("\ufffd" not in o for o in outs)
    # while the bytes of one character arrive, nothing is emitted
    assert outs[0] == "" and outs[2] == "日"


def test_batch_logits_equal_sequential(tiny):
    with Model(tiny["target"], n_ctx=256) as a, Model(tiny["target"], n_ctx=256) as b:
        tokens = a.tokenize("Speculative decoding lets a small draft model propose tokens")
        a.eval(tokens, logits="all")
        batch = np.stack([a.logits(i).copy() for i in range(len(tokens))])
        seq = []
        for t in tokens:
            b.eval([t])
            seq.append(b.logits(-1).copy())
        # llama.cpp promises no batch invariance; measured on this F32 model, max difference over the rows: 5e-5
        # (AVX-512, Intel Sapphire Rapids) and 8e-4 (AVX2 only, reported in issue 13). A tolerance of 5e-3 sits
        # above both and far below what a wrong batch index (a neighbouring row: 18) or a stale cache entry after
        # a wrong rollback (2.0) makes
        np.testing.assert_allclose(batch, np.stack(seq), rtol=0, atol=5e-3)
        assert np.abs(batch[1:] - np.stack(seq)[:-1]).max() > 1.0  # the rows themselves are far apart


def test_rollback_then_decode_equals_fresh(tiny):
    with Model(tiny["target"], n_ctx=256) as m, Model(tiny["target"], n_ctx=256) as fresh:
        a = m.tokenize("The dog sleeps in the sun")
        b = m.tokenize(" and the fox runs into the woods", add_special=False)
        c = m.tokenize(" while the draft proposes", add_special=False)
        m.eval(a + b)
        assert m.rollback(len(a))
        assert m.tokens == a
        m.eval(c)
        fresh.eval(a + c)
        np.testing.assert_allclose(m.logits(-1), fresh.logits(-1), rtol=1e-4, atol=1e-4)


def test_sync_reuses_the_common_prefix(target):
    target.reset()
    a = target.tokenize("The quick brown fox jumps over the lazy dog.")
    assert target.sync(a) == len(a)
    b = a + target.tokenize(" The dog sleeps", add_special=False)
    assert target.sync(b) == len(b) - len(a) + 0  # only the new tokens are decoded
    c = a[:3] + target.tokenize(" woods", add_special=False)
    assert target.sync(c) == len(c) - 3
    assert target.tokens == c


def test_prefill_longer_than_n_batch(tiny):
    with Model(tiny["target"], n_ctx=1024, n_batch=32) as m, Model(tiny["target"], n_ctx=1024) as ref:
        tokens = m.tokenize(" ".join(["the fox runs into the woods"] * 30))
        assert len(tokens) > 100
        m.eval(tokens)
        ref.eval(tokens)
        assert len(m.tokens) == len(tokens)
        # llama.cpp's CPU flash attention sums in another order for other chunk sizes: F16-level differences
        np.testing.assert_allclose(m.logits(-1), ref.logits(-1), rtol=0, atol=0.05)
        assert np.argmax(m.logits(-1)) == np.argmax(ref.logits(-1))


def test_logits_only_where_requested(target):
    target.reset()
    target.eval(target.tokenize("The fox"), logits="last")
    target.logits(-1)
    with pytest.raises(IndexError):
        target.logits(-2)


def test_vocab_facts_and_template(target, tiny):
    info = target.vocab_info()
    assert (info.bos, info.eos, info.add_bos, info.add_eos) == (1, 2, True, False)
    assert info.n_tokens == target.n_vocab and info.texts[5] == b"<0x00>"
    assert "<|assistant|>" in target.chat_template()
    assert target.architecture == "llama"
    assert target.is_eog(2) and not target.is_eog(100)
    assert isinstance(backend_info()["gpu_offload"], bool)


def test_c_0_is_the_trained_context_where_memory_holds_its_kv_cache(tiny, monkeypatch):
    """-c 0 (serve's default): the trained context, whose KV cache spectool sizes as llama.cpp allocates it (its log
    says so); where half the free memory would not hold it, the most that does, in multiples of 256."""
    import collections
    import re

    from spectool.llama import memory, native

    monkeypatch.setattr(native, "_RECENT_LOG", collections.deque(maxlen=100_000))  # (the whole log, kept)
    m = Model(tiny["target"], n_ctx=0)
    try:
        per = memory.kv_bytes_per_token(m.lib, m._model)
        mib, cells = re.search(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells", native.recent_log()).groups()
        assert m.n_ctx == int(cells) == m.lib.llama_model_n_ctx_train(m._model) == 2048
        assert per * m.n_ctx == float(mib) * 2 ** 20
        monkeypatch.setattr(memory, "FLOOR", 256)
        monkeypatch.setattr(memory, "free_bytes", lambda usable: 2 * 1000 * per)  # half of it holds 1,000 tokens
        assert memory.context_that_fits(m.lib, m._model, []) == 768
        monkeypatch.setattr(memory, "free_bytes", lambda usable: 2 * 10**9)
        assert memory.context_that_fits(m.lib, m._model, []) == 2048
    finally:
        m.close()


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        Model(tmp_path / "nope.gguf")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ModelLoadError, match="directory"):
        Model(tmp_path)


def test_non_gguf_file(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_text("this is not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        Model(p)


def test_truncated_gguf(tmp_path, tiny):
    data = tiny["target"].read_bytes()
    p = tmp_path / "truncated.gguf"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="could not load truncated.gguf"):
        Model(p)


def test_unsupported_architecture(tmp_path, tiny):
    import gguf

    p = tmp_path / "alien.gguf"
    w = gguf.GGUFWriter(str(p), "alien-arch-9000")
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert check_gguf_file(p) == p
    with pytest.raises(ModelLoadError, match="alien-arch-9000"):
        Model(p)


def test_close_is_idempotent(tiny):
    """Closing twice frees nothing twice: a double free aborts the process, so it runs apart and fails the test
    instead of ending the test run."""
    import subprocess
    import sys

    code = (f"from spectool.llama.engine import Model\nm = Model({str(tiny['draft'])!r}, n_ctx=64)\nm.close()\nm.close()\n"
            "assert m.closed\nprint('closed twice')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "closed twice", r.stderr[-2000:]


def test_quantize_writes_atomically(tmp_path, tiny):
    from spectool.llama.quantize import quantize

    from spectool.llama.engine import EngineError

    out = quantize(tiny["target"], tmp_path / "t16.gguf", "F16")
    with Model(out, n_ctx=64) as m:
        assert m.n_vocab > 500
    with pytest.raises(EngineError):
        quantize(tiny["target"], tmp_path / "bad.gguf", "NOT_A_TYPE")
    assert not (tmp_path / "bad.gguf").exists()
    shutil.rmtree(tmp_path)


def test_progress_of_loading_and_of_a_long_prompt(tiny):
    fractions, chunks = [], []
    with Model(tiny["target"], n_ctx=1024, n_batch=32, progress=fractions.append) as m:
        assert fractions and fractions == sorted(fractions) and fractions[-1] == 1.0  # llama.cpp's own callback
        tokens = m.tokenize(" ".join(["the fox runs into the woods"] * 30))[:100]
        m.eval(tokens, progress=lambda done, total: chunks.append((done, total)))
        assert chunks == [(32, 100), (64, 100), (96, 100), (100, 100)]


def test_ctrl_c_while_loading_stops_the_load_cleanly(tiny):
    def interrupt(fraction):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Model(tiny["target"], n_ctx=256, progress=interrupt)
    with Model(tiny["target"], n_ctx=256) as m:  # and the next load works
        assert m.n_vocab > 0


BESIDE = """
import sys
import numpy as np
from spectool.llama.engine import Model
with Model(sys.argv[1], n_ctx=128, flash_attn=True) as m:
    other = m.beside(flash_attn=False)
    assert other.llama_model == m.llama_model and other.llama_context != m.llama_context
    assert (m.flash_attn, other.flash_attn, other.n_ctx) == (True, False, m.n_ctx)
    tokens = m.tokenize("The dog sleeps in the sun and the fox runs into the woods")
    m.eval(tokens[:4])
    other.eval(tokens)  # its own cache: m's holds 4 tokens still
    assert len(m.tokens) == 4 and other.tokens == tokens
    m.eval(tokens[4:], logits="all")
    print(np.abs(m.logits(-1) - other.logits(-1)).max(), np.abs(m.logits(-1) - m.logits(-2)).max())
    other.close()
    assert other.closed and not m.closed
    m.rollback(4)
    m.eval(tokens[4:])  # the weights are still there
    print('still decodes')
"""


def test_a_model_beside_another_shares_its_weights_with_its_own_context_and_kernel(tiny):
    """Model.beside (attention.py times both kernels on one load): the same weights, a cache and a kernel of its
    own, and closing it leaves the weights to the first (freed, the first's next decode would crash: so it runs
    apart and fails the test instead of ending the run)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", BESIDE, str(tiny["target"])], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    gap, rows_apart, done = r.stdout.split()[:2] + [r.stdout.split("\n")[1]]
    # the same logits by the other kernel: llama.cpp's CPU flash attention rounds the query to F16 (4e-3 measured
    # on this F32 model, AVX-512); 0.05 sits far above that and far below what a stale cache entry after a wrong
    # rollback makes (2.0, test_batch_logits_equal_sequential) or two different rows differ by
    assert float(gap) < 0.05 and float(rows_apart) > 1.0 and done == "still decodes"
