"""Bad input, interrupts, faults mid-run, long runs, untrusted files: each case answered by one line on stderr,
a non-zero exit and no traceback, and nothing half-written."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spectool_lab.helpers import default_signals, spectool
from typer.testing import CliRunner

from spectool.models.store import write_json_atomic
from spectool.cli import app
from spectool.cli.commands import read_prompt
from spectool.options import UserError

runner = CliRunner()


def one_line_error(r, code=1):
    assert r.exit_code == code, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.stderr
    return lines[0]


# -- the error catalogue -----------------------------------------------------------------------------------------
def test_bad_model_files(tmp_path, tiny):
    import gguf

    (tmp_path / "notgguf.gguf").write_text("hello")
    data = tiny["target"].read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    w = gguf.GGUFWriter(str(tmp_path / "alien.gguf"), "alien-arch-9000")
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    cases = {
        tmp_path / "missing.gguf": "model file not found",
        tmp_path: "is a directory",
        tmp_path / "notgguf.gguf": "not a GGUF file",
        tmp_path / "cut.gguf": "not within the file bounds",
        tmp_path / "alien.gguf": "unknown model architecture: 'alien-arch-9000'",
    }
    for path, message in cases.items():
        assert message in one_line_error(runner.invoke(app, ["run", "-m", str(path), "hi"]))


def test_prompt_longer_than_the_context(tiny):
    long = " ".join(["the fox runs into the woods"] * 40)
    line = one_line_error(runner.invoke(app, ["run", "-m", str(tiny["target"]), "-c", "64", long]))
    assert "tokens but the context holds 256" in line and "--truncate" in line  # llama.cpp rounds n_ctx to 256
    r = runner.invoke(app, ["run", "-m", str(tiny["target"]), "-c", "64", "-n", "8", "--truncate", long])
    assert r.exit_code == 0 and "prompt truncated to its last" in r.stderr


def test_context_filling_up_keeps_the_text(tiny, tmp_path):
    stats = tmp_path / "s.json"
    r = runner.invoke(app, ["run", "-m", str(tiny["target"]), "-c", "64", "-n", "1000", "--stats-json", str(stats),
                            "The quick brown fox"])
    assert r.exit_code == 0
    j = json.loads(stats.read_text())
    assert j["finish_reason"] == "context" and j["n_generated"] == 256 - 5 + 1 and len(r.stdout) > 100


def test_invalid_utf8_stdin(tiny):
    line = one_line_error(runner.invoke(app, ["run", "-m", str(tiny["target"])], input=b"caf\xe9 au lait"))
    assert "not valid UTF-8" in line


@pytest.mark.parametrize("args", [["--draft-max", "-1"], ["--temp", "-0.5"], ["--top-p", "1.5"], ["--top-p", "0"],
                                  ["-n", "0"], ["--ctx-size", "-5"]])
def test_invalid_option_values(tiny, args):
    r = runner.invoke(app, ["run", "-m", str(tiny["target"]), *args, "hi"])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_unknown_pair_suggests(tiny):
    assert "did you mean qwen3-8b" in one_line_error(runner.invoke(app, ["run", "--pair", "qwen3-8", "hi"]))


# -- interrupts --------------------------------------------------------------------------------------------------
@pytest.mark.realmodel
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_generation(gemma_q4, tmp_path, sig, code):
    stats = tmp_path / "s.json"
    p = subprocess.Popen([sys.executable, "-m", "spectool", "run", "-m", str(gemma_q4), "-n", "3000", "-t", "2",
                          "--stats-json", str(stats), "Write a long story about a dragon."],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.read(1)
    time.sleep(0.5)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert (first + out).endswith(b"\n") and b"Traceback" not in err
    assert json.loads(stats.read_text())["finish_reason"] == "interrupted"


@pytest.mark.realmodel
def test_sigint_during_prefill_then_the_next_run_works(gemma_q4, tmp_path):
    # about 13,000 prompt tokens on the CPU (-ngl 0, on a GPU host too): seconds of prefill even on 16 cores
    long = "The history of the printing press begins in the fifteenth century. " * 1000
    p = subprocess.Popen([sys.executable, "-m", "spectool", "run", "-m", str(gemma_q4), "-n", "50", "-t", "2",
                          "-ngl", "0", "-c", "16384", "--debug", long], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = b""
    while b"reserve took" not in err:  # --debug: llama.cpp's log; its graph reservations end the context's
        line = p.stderr.readline()  # creation, right before the prefill
        assert line, "spectool ended before it made a context"
        err += line
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, rest = p.communicate(timeout=120)
    err += rest
    assert p.returncode == 130, err[-2000:]
    assert b"Traceback" not in err
    r = spectool("run", "-m", gemma_q4, "-n", "5", "-q", "Hello", timeout=120)
    assert r.returncode == 0 and r.stdout.strip()


def test_sigterm_during_download_leaves_no_file_at_the_final_path(tiny, tmp_path):
    from fakehub import FakeHub

    with FakeHub() as hub:
        hub.add("test/tiny", {"target.gguf": tiny["target"]})
        hub.slow.add("target.gguf")
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"))
        env.pop("HF_HUB_OFFLINE", None)
        p = subprocess.Popen([sys.executable, "-m", "spectool", "pull", "hf:test/tiny/target.gguf"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        end = time.time() + 30
        while time.time() < end and not hub.gets("target.gguf"):
            time.sleep(0.05)
        time.sleep(0.3)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 143, err
        assert b"Traceback" not in err
        repo = tmp_path / "hf" / "hub" / "models--test--tiny"
        assert not list(repo.glob("snapshots/*/target.gguf"))
        assert not list(repo.glob("blobs/*.incomplete"))
        hub.slow.clear()
        r = spectool("pull", "hf:test/tiny/target.gguf", env=env)
        assert r.returncode == 0 and Path(r.stdout.split(" -> ")[1].strip()).read_bytes() == \
            tiny["target"].read_bytes()


def saved_cost_tables(cache: Path) -> list:
    """The cost tables under SPECTOOL_CACHE `cache`, each read as `run` reads it: none may be damaged."""
    from spectool.core.costs import Costs

    tables = [Costs.from_json(json.loads(p.read_text())) for p in sorted((cache / "costs").glob("*.json"))]
    assert all(t.rejected == 0 and t.verify for t in tables), tables
    return tables


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_stream_ends_the_answers_and_the_server_exits_its_code(tiny, tmp_path, sig, code):
    """Issue 47 item 3: SIGTERM or Ctrl-C while a stream runs (4000 tokens asked: about 25 s here) and another
    request waits its turn: the stream gets its last chunk (finish_reason "length", usage) and [DONE] at the next
    step, the waiting request an answer, the process exits 143 / 130 within seconds, its cost table whole."""
    from spectool_lab.helpers import Server

    s = Server(tiny["target"], "-c", "4096", env={"SPECTOOL_CACHE": str(tmp_path)})
    c, waited = s.client(), []
    loop = dict(model="m", prompt="the dog the fox the dog the fox the dog the", max_tokens=4000)
    waiting = threading.Thread(target=lambda: waited.append(c.completions.create(**loop)))
    chunks = []
    try:
        for chunk in c.completions.create(**loop, stream=True, stream_options={"include_usage": True}):
            chunks.append(chunk)
            if len(chunks) == 20:
                waiting.start()
                time.sleep(0.3)  # its turn taken, behind the stream
                t0 = time.monotonic()
                s.proc.send_signal(sig)
        exit_code, err = s.proc.wait(timeout=30), s.proc.stderr.read()
    finally:
        s.proc.kill()
    assert exit_code == code and "Traceback" not in err and "error" not in err, err
    assert time.monotonic() - t0 < 10  # the next step, not the 4000 tokens (about 25 s)
    ends = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert ends == ["length"] and 0 < chunks[-1].usage.completion_tokens < 4000, chunks[-3:]
    waiting.join(timeout=30)
    assert waited and waited[0].choices[0].finish_reason == "length"
    assert len(saved_cost_tables(tmp_path)) == 1


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_run_keeps_the_lookup_cache_and_the_cost_table(tiny, tmp_path, sig, code):
    """`run --lookup-cache FILE` stopped mid-generation: 143 / 130, the text so far, the cache written whole with
    the interrupted generation in it, the cost table whole."""
    cache = tmp_path / "lookup.json"
    p = subprocess.Popen([sys.executable, "-m", "spectool", "run", "-m", str(tiny["target"]), "-c", "4096", "-t",
                          "2", "-n", "4000", "--lookup-cache", str(cache), "the dog the fox the dog the fox"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         env={**os.environ, "SPECTOOL_CACHE": str(tmp_path)}, preexec_fn=default_signals)
    first = p.stdout.read(1)
    time.sleep(0.5)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code and b"Traceback" not in err, err
    assert first and (first + out).strip()
    saved = json.loads(cache.read_text())
    (doc,) = saved["documents"]
    assert saved["format"] == "spectool-lookup-cache" and 20 < len(doc) < 4000
    assert len(saved_cost_tables(tmp_path)) == 1


# -- long runs ---------------------------------------------------------------------------------------------------
def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_4000_tokens_keep_memory_flat_and_the_cache_right(tiny):
    from spectool.drafters.draft_model import DraftModel
    from spectool.drafters.hybrid import Hybrid
    from spectool.drafters.lookup import PromptLookup
    from spectool.llama.engine import Model
    from spectool.generate.loop import GenerationConfig, speculative_generate
    from spectool.core.stats import Stats

    with Model(tiny["target"], n_ctx=4200, flash_attn=False) as t, Model(tiny["draft"], n_ctx=4200) as d:
        prompt = t.tokenize("The quick brown fox")
        g = GenerationConfig(t, Hybrid(PromptLookup(), DraftModel(d)), max_tokens=4000)
        rss, st = [], Stats()
        out = []
        for i, step in enumerate(speculative_generate(g, prompt, st)):
            out += step.tokens
            if i % 50 == 0:
                rss.append(rss_mb())
        assert len(out) == 4000 and st.n_accepted > 100
        # memory: flat after the first quarter (the KV cache is allocated up front), within 20 MB
        quarter = rss[len(rss) // 4:]
        assert max(quarter) - min(quarter) < 20, rss
        x = prompt + out
        t.eval([x[-1]])
        with Model(tiny["target"], n_ctx=4200, flash_attn=False) as fresh:
            fresh.eval(x)
            np.testing.assert_allclose(t.logits(-1), fresh.logits(-1), rtol=0, atol=1e-3)


def test_50_turn_chat_keeps_memory_flat_and_the_cache_right(tiny):
    from spectool.cli.chat import Chat
    from spectool.drafters.lookup import PromptLookup
    from spectool.llama.engine import Model
    from spectool.generate.loop import GenerationConfig

    with Model(tiny["target"], n_ctx=4096, flash_attn=False) as t:
        chat = Chat(GenerationConfig(t, PromptLookup(), max_tokens=20))
        rss = []
        for turn in range(50):
            "".join(text for text, _ in chat.send(f"turn {turn}: the quick brown fox"))
            rss.append(rss_mb())
            assert chat.turns[-1].n_prefilled < 40  # each turn prefills its own tokens only
        assert max(rss[10:]) - min(rss[10:]) < 20, rss
        assert len(chat.messages) == 100
        x = chat.tokens
        assert t.tokens == x[:-1]
        t.eval([x[-1]])
        with Model(tiny["target"], n_ctx=4096, flash_attn=False) as fresh:
            fresh.eval(x)
            np.testing.assert_allclose(t.logits(-1), fresh.logits(-1), rtol=0, atol=1e-3)


# -- untrusted inputs and secrets --------------------------------------------------------------------------------
def test_hub_token_never_appears(tiny, tmp_path):
    from fakehub import FakeHub

    secret = "hf_SECRETtokenVALUE0123456789"
    with FakeHub() as hub:
        hub.add("test/tiny", {"target.gguf": tiny["target"]})
        hub.unauthorized.add("test/private")
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), HF_TOKEN=secret)
        env.pop("HF_HUB_OFFLINE", None)
        stats = tmp_path / "s.json"
        runs = [
            ["pull", "hf:test/private/x.gguf"],
            ["pull", "hf:test/private/x.gguf", "--debug"],
            ["run", "-m", "hf:test/tiny/target.gguf", "-n", "5", "--debug", "--stats-json", str(stats), "hi"],
        ]
        for args in runs:
            r = spectool(*args, env=env)
            assert secret not in r.stdout and secret not in r.stderr, args
        assert secret not in stats.read_text() and json.loads(stats.read_text())["n_generated"] == 5


def test_stats_json_is_written_atomically(tmp_path):
    path = tmp_path / "s.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["s.json"]


# -- fuzzing (bounded) -------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.one_of(st.none(), st.text(max_size=20)))
def test_read_prompt_fuzz(data, prompt):
    import io

    class FakeStdin:
        buffer = io.BytesIO(data)

        def isatty(self):
            return False

    old = sys.stdin
    sys.stdin = FakeStdin()
    try:
        text = read_prompt(prompt)
    except UserError as e:
        assert e.code in (1, 2) and str(e)
        return
    finally:
        sys.stdin = old
    assert isinstance(text, str) and (text.strip() or prompt)
    if prompt:
        assert text.endswith(prompt)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(5, 634), max_size=40), st.lists(st.text("ab ch\nxé", min_size=1, max_size=4),
                                                               max_size=3), st.integers(1, 5))
def test_stop_strings_fuzz(target, tokens, stops, chunk):
    """Streaming with stop strings, fed in chunks, gives the full text cut at the first stop string."""
    from spectool.generate.stream import TextStream

    full = target.detokenize(tokens)
    expect = full
    for s in stops:
        i = expect.find(s)
        if i >= 0:
            expect = expect[:i]
    stream = TextStream(target, stops)
    got = ""
    for i in range(0, len(tokens), chunk):
        got += stream.feed(tokens[i : i + chunk])
        if stream.stopped:
            break
    got += stream.flush()
    assert got == expect


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(5, 634), max_size=40), st.lists(st.text("ab ch\nxé", min_size=1, max_size=4),
                                                               max_size=3), st.integers(0, 40))
def test_a_draft_ends_where_the_stream_would_stop(target, tokens, stops, cut):
    """TextStream.ending(rest), after a prefix fed: how many of rest's tokens, fed one at a time, it takes to stop
    the stream (all where none does), the text held back included; and the stream is left as it was (what it then
    makes of rest is what a twin that never looked ahead makes)."""
    from hypothesis import assume

    from spectool.generate.stream import TextStream

    head, rest = tokens[:cut], tokens[cut:]
    looked, fed, twin = (TextStream(target, stops) for _ in range(3))
    for stream in (looked, fed, twin):
        stream.feed(head)
    assume(not looked.stopped)
    n, expect = looked.ending(rest), len(rest)
    for i, token in enumerate(rest):
        fed.feed([token])
        if fed.stopped:
            expect = i + 1
            break
    assert n == expect
    assert looked.feed(rest) == twin.feed(rest) and looked.stopped == twin.stopped


# -- issue 31: bad values found by hand, each answered before anything loads where it can be -------------------
def test_serve_without_its_libraries_says_so_before_loading(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if not installed: importing it raises ImportError
    line = one_line_error(runner.invoke(app, ["serve", "-m", str(tmp_path / "missing.gguf")]))
    assert "needs uvicorn" in line and "pip install uvicorn" in line  # not "model file not found": nothing loaded


def test_a_context_too_large_for_memory_says_what_it_wanted(tiny):
    """-c 10,000,000 wants a KV cache of 3.6 GB for the tiny model; under a 2 GB address-space limit it cannot be
    allocated on any machine. The answer says so, and how much it wanted (the half-built Model closes cleanly)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    r = subprocess.run([sys.executable, "-m", "spectool", "run", "-m", str(tiny["target"]), "-ngl", "0", "-c",
                        "10000000", "-n", "5", "hi"], capture_output=True, text=True, timeout=120, preexec_fn=limit,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: a context of 10000000 tokens for target.gguf does not fit: its KV cache needs "
                           "3662 MiB") and "-c/--ctx-size" in line and "_chain" not in line, line


def test_stats_json_paths_are_checked_before_loading(tiny, tmp_path):
    """A path that cannot be written is refused before generation, naming the path as given; a read-only file is
    refused, not replaced."""
    ro = tmp_path / "ro.json"
    ro.write_text("{}\n")
    ro.chmod(0o444)
    cases = {tmp_path / "missing" / "s.json": "no such directory", tmp_path: "is a directory",
             ro: "the file is read-only", Path("/proc/spectool-s.json"): "cannot write in /proc"}
    if os.geteuid() != 0:  # root writes in any folder
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        cases[locked / "s.json"] = "cannot write in"
    for path, message in cases.items():
        r = runner.invoke(app, ["run", "-m", str(tiny["target"]), "-n", "5", "--stats-json", str(path), "hi"])
        line = one_line_error(r, code=2)
        assert line.startswith(f"error: --stats-json {path}: {message}") and ".tmp" not in line, line
        assert r.stdout == ""  # nothing generated
    assert ro.read_text() == "{}\n" and ro.stat().st_mode & 0o777 == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro.json"] + (["locked"] if os.geteuid() else [])


def test_stats_json_is_written_when_the_reader_closes_early(tiny, tmp_path):
    stats = tmp_path / "s.json"
    r = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m spectool run -m {tiny['target']} -n 1500 "
                        f"--stats-json {stats} 'The quick brown fox' | head -c 10 > /dev/null"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 141 and "Traceback" not in r.stderr, r.stderr
    j = json.loads(stats.read_text())
    assert j["finish_reason"] == "interrupted" and 0 < j["n_generated"] < 1500


def test_seed_threads_and_bytes_that_are_not_utf8(tiny):
    r = runner.invoke(app, ["run", "-m", str(tiny["target"]), "--seed", "-5", "hi"])
    assert r.exit_code == 2 and "--seed" in r.stderr and r.stdout == "" and "Traceback" not in r.output
    cores = os.cpu_count() or 1
    many = runner.invoke(app, ["run", "-m", str(tiny["target"]), "-t", str(cores + 1), "-n", "3", "-q", "hi"])
    assert many.exit_code == 0 and many.stderr.count("warning:") == 1
    assert f"-t {cores + 1} is more threads than this machine's {cores} CPU cores" in many.stderr
    enough = runner.invoke(app, ["run", "-m", str(tiny["target"]), "-t", str(cores), "-n", "3", "-q", "hi"])
    assert enough.exit_code == 0 and "warning" not in enough.stderr
    for args in ([b"\xffhi"], [b"-p", b"caf\xe9"], [b"--stop", b"\xff", b"hi"]):
        p = subprocess.run([sys.executable.encode(), b"-m", b"spectool", b"run", b"-m", str(tiny["target"]).encode(),
                            b"-n", b"3", *args], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        (line,) = p.stderr.decode().strip().splitlines()
        assert p.returncode == 2 and line.startswith("error: an argument is not valid UTF-8") and p.stdout == b"", \
            p.stderr
