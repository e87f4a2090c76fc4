"""The command line, driven in-process with Typer's CliRunner and as a real subprocess for pipes."""

import json
import os
import time
from pathlib import Path
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from spectool.cli import app

runner = CliRunner()


def run(args, input=None):
    return runner.invoke(app, args, input=input)


def test_help_is_instant_and_lists_commands():
    r = run(["--help"])
    assert r.exit_code == 0 and "run" in r.output
    r = run(["run", "--help"])
    assert r.exit_code == 0 and "--model-draft" in r.output and "Examples" in r.output
    # importing the CLI does not import llama_cpp or numpy
    code = "import sys, spectool.cli.commands; print('llama_cpp' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.split() == ["False", "False"]


def test_version():
    r = run(["--version"])
    assert r.exit_code == 0 and r.output.startswith("spectool ")


def test_run_with_an_argument(tiny, tmp_path):
    stats = tmp_path / "s.json"
    r = run(["run", "-m", str(tiny["target"]), "-n", "20", "--stats-json", str(stats), "The quick brown fox"])
    assert r.exit_code == 0, r.output
    j = json.loads(stats.read_text())
    assert j["mode"] == "lookup" and j["n_generated"] == 20 and j["finish_reason"] == "length"
    assert j["n_prompt_tokens"] == 5


def test_draft_trees_give_the_same_greedy_text(tiny, tmp_path, monkeypatch):
    """`--draft-tree N` loads the target with a sequence for each leaf in one KV buffer and drafts trees where they
    pay: the text is plain decoding's (with a draft model's runner-ups too), the stats count its trees; more sequences
    than llama.cpp holds is a one-line usage error."""
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path / "cache"))
    args = ["-m", str(tiny["target"]), "-n", "40", "-q", "-ngl", "0"]
    prompt = "the dog the fox the dog the fox the dog the fox the dog the"
    plain = run(["run", *args, "--spec", "none", prompt])
    r = run(["run", *args, "--draft-tree", "4", "--stats-json", str(tmp_path / "s.json"), prompt])
    assert r.exit_code == 0 and r.stdout == plain.stdout
    j = json.loads((tmp_path / "s.json").read_text())
    assert j["n_accepted"] > 0 and set(j["tree"]) == {"steps", "branches", "taken"}
    # a greedy draft model's runner-ups beside its draft, and lookup's, in a hybrid
    for spec in ("draft", "hybrid"):
        r = run(["run", *args, "-md", str(tiny["draft"]), "-ngld", "0", "--spec", spec, "--draft-tree", "4", prompt])
        assert r.exit_code == 0 and r.stdout == plain.stdout, (spec, r.output)
    # --parallel 4 with trees of 64 siblings: 4 x 66 sequences, more than llama.cpp's 256
    r = run(["serve", "-m", str(tiny["target"]), "--draft-tree", "64", "--parallel", "4"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "264 sequences" in r.output


@pytest.mark.parametrize("spec", ["none", "lookup", "draft", "hybrid", "auto"])
def test_modes_give_the_same_greedy_text(tiny, spec, tmp_path, monkeypatch):
    # -ngl 0 on a GPU host too: there batched and single-token kernels may flip near-ties (docs/exactness.md)
    # a cost table of its own, as a first run has: on the tiny model a batch of 2 costs 2-12x one token, and a table
    # that other tests left (test_bench before it, alone) may rightly say that drafting does not pay
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path / "cache"))
    args = ["-m", str(tiny["target"]), "-md", str(tiny["draft"]), "-n", "40", "-q", "-ngl", "0", "-ngld", "0"]
    plain = run(["run", *args, "--spec", "none", "def greet(name):"])
    r = run(["run", *args, "--spec", spec, "--stats-json", str(tmp_path / "s.json"), "def greet(name):"])
    assert r.exit_code == 0 and r.stdout == plain.stdout
    expected_mode = {"auto": "hybrid"}.get(spec, spec)
    j = json.loads((tmp_path / "s.json").read_text())
    assert j["mode"] == expected_mode
    assert (j["n_accepted"] > 0) == (spec != "none")  # the adaptive default drafts: this is no plain vs plain


def test_stdin_and_argument_are_joined(tiny, tmp_path):
    s1, s2 = tmp_path / "a.json", tmp_path / "b.json"
    a = run(["run", "-m", str(tiny["target"]), "-n", "10", "-q", "--stats-json", str(s1), "Summarize:"],
            input="The dog sleeps.\n")
    b = run(["run", "-m", str(tiny["target"]), "-n", "10", "-q", "--stats-json", str(s2),
             "The dog sleeps.\nSummarize:"])
    assert a.exit_code == 0 and a.stdout == b.stdout
    assert json.loads(s1.read_text())["n_prompt_tokens"] == json.loads(s2.read_text())["n_prompt_tokens"]
    only_stdin = run(["run", "-m", str(tiny["target"]), "-n", "5", "-q"], input="The dog sleeps.")
    assert only_stdin.exit_code == 0


def test_no_prompt_is_a_usage_error(tiny):
    r = run(["run", "-m", str(tiny["target"])], input="")
    assert r.exit_code == 2 and "no prompt" in r.stderr and "Traceback" not in r.output


def test_binary_stdin_is_refused(tiny):
    r = run(["run", "-m", str(tiny["target"])], input=b"\x00\x01\x02binary")
    assert r.exit_code == 1 and "binary" in r.stderr


def test_missing_model_is_one_line(tmp_path):
    r = run(["run", "-m", str(tmp_path / "nope.gguf"), "hi"])
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not found" in lines[0] and "Traceback" not in r.output


def test_spec_draft_without_a_draft_model(tiny):
    r = run(["run", "-m", str(tiny["target"]), "--spec", "draft", "hi"])
    assert r.exit_code == 2 and "draft model" in r.stderr


def test_bad_option_values(tiny):
    for args in (["--temp", "-1"], ["--top-p", "0"], ["--draft-max", "-2"], ["--draft-min", "5", "--draft-max", "2"]):
        r = run(["run", "-m", str(tiny["target"]), *args, "hi"])
        assert r.exit_code == 2, args


def test_pipe_purity(tiny, tmp_path):
    """stdout through a real pipe carries exactly the generated text, newline-terminated, nothing else."""
    stats = tmp_path / "s.json"
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    p = subprocess.run(
        [sys.executable, "-m", "spectool", "run", "-m", str(tiny["target"]), "-n", "30",
         "--stats-json", str(stats), "Summarize:"],
        input=b"The quick brown fox jumps over the lazy dog.", capture_output=True, env=env, timeout=60,
    )
    assert p.returncode == 0, p.stderr
    from spectool.llama.engine import Model
    from spectool.generate.loop import GenerationConfig, generate_text

    with Model(tiny["target"], n_ctx=4096) as m:
        prompt = m.tokenize("The quick brown fox jumps over the lazy dog.\nSummarize:", parse_special=True)
        text = "".join(t for t, _ in generate_text(GenerationConfig(m, None, max_tokens=30), prompt))
    expected = text if text.endswith("\n") else text + "\n"
    assert p.stdout == expected.encode("utf-8", errors="replace")
    assert b"[lookup]" in p.stderr and b"tok/s" in p.stderr


def test_unloadable_draft_falls_back_to_lookup(tiny, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    stats = tmp_path / "s.json"
    r = run(["run", "-m", str(tiny["target"]), "-md", str(bad), "-n", "10", "--stats-json", str(stats), "hi"])
    assert r.exit_code == 0 and "using prompt lookup" in r.stderr
    assert json.loads(stats.read_text())["mode"] == "lookup"
    r = run(["run", "-m", str(tiny["target"]), "-md", str(bad), "--spec", "draft", "hi"])
    assert r.exit_code == 1 and "could not load bad.gguf" in r.stderr


def test_check_compatible_and_not(tiny):
    ok = run(["check", str(tiny["target"]), str(tiny["draft"])])
    assert ok.exit_code == 0 and "compatible" in ok.stdout
    other = run(["check", str(tiny["target"]), str(tiny["foreign"])])
    assert other.exit_code == 0 and "another vocabulary: the draft drafts through text" in other.stdout
    assert "token 261 differs" in other.stdout  # the first difference, readable


def test_a_draft_with_another_vocabulary_drafts_through_text(tiny, tmp_path):
    """-md with another vocabulary: the run says it drafts through text, auto pairs it with lookup (hybrid),
    --spec draft drafts with it alone, and the greedy text is plain decoding's."""
    stats = tmp_path / "s.json"
    args = ["run", "-m", str(tiny["target"]), "-n", "24", "--temp", "0", "def add(a, b):"]
    plain = run([*args, "--spec", "none"])
    r = run([*args, "-md", str(tiny["foreign"]), "--stats-json", str(stats)])
    assert r.exit_code == 0 and "drafts through text" in r.stderr and r.stdout == plain.stdout
    assert json.loads(stats.read_text())["mode"] == "hybrid"
    r = run([*args, "-md", str(tiny["foreign"]), "--spec", "draft", "--stats-json", str(stats)])
    assert r.exit_code == 0 and r.stdout == plain.stdout
    st = json.loads(stats.read_text())
    assert st["mode"] == "draft" and st["n_drafted"] > 0


def test_vocab_differences_unit(target):
    from dataclasses import replace

    from spectool.models.compat import vocab_differences

    a = target.vocab_info()
    assert vocab_differences(a, a) == []
    assert "BOS" in vocab_differences(a, replace(a, bos=7))[0]
    assert "add_eos" in vocab_differences(a, replace(a, add_eos=True))[0]
    assert "sizes differ" in vocab_differences(a, replace(a, n_tokens=a.n_tokens + 129))[0]
    texts = list(a.texts)
    texts[4] = b"other"  # ids below 5 are not compared
    assert vocab_differences(a, replace(a, texts=tuple(texts))) == []


def test_shell_completion_completes_commands_and_options():
    exe = str(Path(sys.executable).parent / "spectool")  # the installed console script
    env = dict(os.environ, _SPECTOOL_COMPLETE="complete_bash", COMP_WORDS="spectool ch", COMP_CWORD="1")
    out = subprocess.run([exe], env=env, capture_output=True, text=True).stdout
    assert "chat" in out.split() and "check" in out.split() and "run" not in out.split()
    env |= {"COMP_WORDS": "spectool run --draft-m", "COMP_CWORD": "2"}
    out = subprocess.run([exe], env=env, capture_output=True, text=True).stdout
    assert set(out.split()) == {"--draft-max", "--draft-min"}
    # Typer finds the shell among the process's ancestors: give it a bash one, also when pytest was orphaned
    script = subprocess.run(["bash", "-c", f"'{exe}' --show-completion bash; true"], capture_output=True, text=True)
    assert script.returncode == 0 and "complete" in script.stdout


def test_measured_costs_carry_over_to_the_next_run(tiny, tmp_path, monkeypatch):
    """The batch costs a run measured are kept per target, draft and settings, and the next run starts from them;
    a damaged file only means measuring afresh."""
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    stats = tmp_path / "s.json"
    args = ["run", "-m", str(tiny["target"]), "-n", "24", "-q", "--stats-json", str(stats),
            "one two three four five six one two three four five six one two three"]
    first = run(args)
    assert first.exit_code == 0, first.output
    assert json.loads(stats.read_text())["n_drafted"] > 0
    (path,) = (tmp_path / "costs").glob("*.json")
    assert json.loads(path.read_text())["verify"]["1"]["seconds"][0] > 0
    # a table on which every batch costs a thousand single steps (left by a run on a machine that stalled): its
    # prices are far above what one token's predicts, so the next run doubts them and drafts (tests/test_costs.py:
    # and measures them again)
    entry = {"seconds": [1.0], "run": 1, "time": time.time()}
    path.write_text(json.dumps({"runs": 1, "verify": {"1": {**entry, "seconds": [0.001]},
                                                      **{str(b): entry for b in range(2, 40)}}, "draft": []}))
    dear = run(args)
    assert dear.exit_code == 0 and dear.stdout == first.stdout
    assert json.loads(stats.read_text())["n_drafted"] > 0
    path.write_text("{not json")
    again = run(args)
    assert again.exit_code == 0 and again.stdout == first.stdout
    assert json.loads(stats.read_text())["n_drafted"] > 0
    assert json.loads(path.read_text())["verify"]  # rewritten whole
    other = run(["run", "-m", str(tiny["target"]), "-t", "1", "-n", "8", "-q", "Hello"])  # other settings: own file
    assert other.exit_code == 0 and len(list((tmp_path / "costs").glob("*.json"))) == 2
    plain = run(["run", "-m", str(tiny["target"]), "--spec", "none", "-n", "8", "-q", "Hello"])  # nothing to learn
    assert plain.exit_code == 0 and len(list((tmp_path / "costs").glob("*.json"))) == 2


def test_an_empty_cache_variable_means_the_default(monkeypatch):
    from spectool.models.store import cache_dir

    monkeypatch.setenv("SPECTOOL_CACHE", "")
    assert cache_dir("costs") == Path.home() / ".cache" / "spectool" / "costs"  # not ./costs


@pytest.mark.parametrize("variant", ["draft_fewer", "draft_more"])
def test_a_draft_with_another_vocabulary_size_through_run_and_chat(tiny, tmp_path, variant):
    """llama.cpp accepts a draft whose vocabulary is within 128 tokens of the target's (Qwen2.5 7B and 0.5B:
    152064 and 151936); sampling with one used to crash at the first rejection."""
    stats = tmp_path / "s.json"
    args = ["-m", str(tiny["target"]), "-md", str(tiny[variant]), "-n", "40", "-q"]
    plain = run(["run", *args, "--spec", "none", "def greet(name):"])
    greedy = run(["run", *args, "--spec", "draft", "--stats-json", str(stats), "def greet(name):"])
    assert greedy.exit_code == 0 and greedy.stdout == plain.stdout
    assert json.loads(stats.read_text())["n_accepted"] > 0
    for seed in range(3):
        sampled = run(["run", *args, "--spec", "draft", "--temp", "0.8", "--seed", str(seed), "--stats-json",
                       str(stats), "def greet(name):"])
        assert sampled.exit_code == 0, sampled.output
        j = json.loads(stats.read_text())
        assert j["n_drafted"] > j["n_accepted"] > 0 and j["n_generated"] == 40  # rejections happened
    chat = run(["chat", *args, "--spec", "draft"], input="The quick brown fox\nand the lazy dog\n/exit\n")
    assert chat.exit_code == 0 and "Traceback" not in chat.output and "error" not in chat.stderr
    assert "spectool:" not in chat.stderr.split("/exit to leave.")[-1]  # no turn ended with an error


def test_chat_samples_by_default_and_run_does_not(tiny):
    def chat_reply(*extra):
        r = run(["chat", "-m", str(tiny["target"]), "-n", "30", "-q", *extra], input="The quick brown fox\n/exit\n")
        assert r.exit_code == 0, r.output
        return r.stdout

    assert chat_reply("--seed", "1") != chat_reply("--seed", "2")
    assert chat_reply("--seed", "1", "--temp", "0") == chat_reply("--seed", "2", "--temp", "0")
    a, b = (run(["run", "-m", str(tiny["target"]), "-n", "30", "-q", "--seed", s, "The quick brown fox"]) for s in "12")
    assert a.exit_code == 0 and a.stdout == b.stdout


def test_penalty_flags_change_the_greedy_text(tiny):
    """--repeat-penalty and its kin reach the chain (the chain itself is checked against llama.cpp's in
    test_verify.py); their defaults are llama.cpp's: off."""
    base = ["run", "-m", str(tiny["target"]), "-n", "60", "-q", "--spec", "lookup", "The quick brown fox"]
    plain = run(base)
    assert plain.exit_code == 0 and plain.stdout
    assert plain.stdout == run([*base, "--repeat-last-n", "0", "--repeat-penalty", "1.5"]).stdout  # window 0: off
    penalised = run([*base, "--repeat-penalty", "1.5"])
    assert penalised.exit_code == 0 and penalised.stdout != plain.stdout
    assert run([*base, "--presence-penalty", "1.0"]).stdout != plain.stdout
    assert run([*base, "--frequency-penalty", "1.0"]).stdout != plain.stdout
    none = run([*base[:-1], "--spec", "none", "--repeat-penalty", "1.5", "The quick brown fox"])
    assert none.exit_code == 0 and none.stdout == penalised.stdout  # speculation keeps the penalised greedy text


def test_a_reader_that_closes_early_ends_the_run_quietly(tiny):
    """`spectool run ... | head -c 20`: a real pipe whose reader goes away mid-generation."""
    p = subprocess.Popen([sys.executable, "-m", "spectool", "run", "-m", str(tiny["target"]), "-n", "1500", "-q",
                          "The quick brown fox"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(p.stdout.read(20)) == 20  # generation is under way
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 141, err  # as cat: 128 + SIGPIPE
    assert err == b""
    shell = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m spectool run -m {tiny['target']} "
                            "-n 1500 -q 'The quick brown fox' | head -c 5; echo \" $?\""],
                           capture_output=True, text=True, timeout=60)
    assert shell.stdout.endswith(" 141\n") and shell.stderr == ""


def test_llama_cpp_2026_flag_names_are_aliases(tiny, tmp_path):
    """llama.cpp renamed its speculative flags (PRs #22397, #22964); a user's command line carries over."""
    stats = tmp_path / "s.json"
    old = run(["run", "-m", str(tiny["target"]), "-md", str(tiny["draft"]), "--spec", "draft", "--draft-max", "3",
               "--draft-min", "3", "-n", "30", "-q", "--stats-json", str(stats), "def greet(name):"])
    j_old = json.loads(stats.read_text())
    new = run(["run", "-m", str(tiny["target"]), "--spec-draft-model", str(tiny["draft"]), "--spec", "draft",
               "--spec-draft-n-max", "3", "--spec-draft-n-min", "3", "--spec-draft-p-min", "0.0", "-n", "30", "-q",
               "--stats-json", str(stats), "def greet(name):"])
    assert new.exit_code == 0, new.output
    j_new = json.loads(stats.read_text())
    assert new.stdout == old.stdout and j_new["mode"] == "draft"
    assert j_new["n_drafted"] == j_old["n_drafted"] and 0 < len(j_new["accepted_per_position"]) <= 3
