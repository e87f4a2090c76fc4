"""`spectool bench`: its ratio arithmetic, table rendering and a smoke run on the tiny models; and the report
parsing of llama.cpp's own tools, the tests' oracle (llamacpp.py). (Speed itself is measured by benchmarks/, not
here.)"""

import json

from typer.testing import CliRunner

from spectool import bench
from spectool.bench import Contender, Result
from spectool.cli import app


def test_speedup_and_identical_arithmetic():
    plain = Result("plain", prompts=2, tokens=200, seconds=4.0, outputs=[[1, 2], [3, 4]])
    fast = Result("lookup", prompts=2, generated=200, tokens=200, seconds=2.0, drafted=100, accepted=75, steps=50,
                  outputs=[[1, 2], [3, 5]])
    bench.speedups([plain, fast])
    assert plain.speedup == 1.0 and fast.speedup == 2.0
    assert fast.identical == 1 and plain.identical == 2
    assert fast.acceptance_rate == 0.75 and fast.mean_accepted_length == 4.0 and fast.tokens_per_second == 100.0


def test_markdown_table_and_recommendation():
    rs = [Result("plain", prompts=2, generated=100, tokens=100, seconds=2.0, steps=100, speedup=1.0, identical=2),
          Result("lookup k=8", prompts=2, generated=100, tokens=100, seconds=1.0, drafted=80, accepted=60, steps=20,
                 identical=2, speedup=2.0)]
    table = bench.markdown_table(rs, "set")
    assert table.splitlines()[0] == "**set**"
    assert "| lookup k=8 | 100.0 | 2.00x | 75% | 5.00 | 2/2 |" in table
    assert "| plain | 50.0 | 1.00x | - | 1.00 | 2/2 |" in table
    rs[1].failed = 1
    assert "| 2/3 (1 crashed) |" in bench.markdown_table(rs)
    rs[1].failed = 0
    cs = [Contender("plain", "none"), Contender("lookup k=8", "lookup", 8, True)]
    assert bench.recommend(rs, cs).endswith("spectool run --spec lookup --draft-min 8 --draft-max 8")
    rs[1].speedup, rs[1].seconds = 0.5, 4.0
    assert "plain decoding won" in bench.recommend(rs, cs)


def test_read_prompts(tmp_path):
    t = tmp_path / "p.txt"
    t.write_text("first prompt\nline two\n---\nsecond\n")
    assert bench.read_prompts(str(t)) == ["first prompt\nline two", "second"]
    j = tmp_path / "p.jsonl"
    j.write_text('"a"\n{"prompt": "b"}\n\n')
    assert bench.read_prompts(str(j)) == ["a", "b"]


def test_plot_writes_a_png(tmp_path):
    rs = [Result("plain", prompts=1, tokens=10, seconds=1.0, speedup=1.0),
          Result("lookup", prompts=1, tokens=10, seconds=0.5, speedup=2.0)]
    bench.plot({"a": rs, "b": rs}, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_spectool_bench_smoke(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    prompts = tmp_path / "p.txt"
    prompts.write_text("The quick brown fox\n---\ndef add(a, b):\n    return a + b\n")
    r = CliRunner().invoke(app, ["bench", "-m", str(tiny["target"]), "-md", str(tiny["draft"]), "--prompts",
                                 str(prompts), "-n", "24", "--draft-vocab", "400", "--json",
                                 "--plot", str(tmp_path / "b.png")])
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    names = [x["contender"] for x in j["results"]]
    assert names[0] == "plain" and "hybrid" in names and "draft k=2" in names and "draft, 400 tokens" in names
    assert "lookup, trees" in names  # lookup with draft trees (--draft-tree 8), greedy as plain too
    assert all(x["identical"] == 2 and x["prompts"] == 2 and x["generated"] == 48 for x in j["results"])
    assert all(0 < x["tokens"] < 48 for x in j["results"])  # timed from each prompt's first token out
    assert j["recommendation"] and (tmp_path / "b.png").exists()
    sampled = {x["contender"]: x for x in j["sampled"]}
    assert list(sampled)[0] == "llama-cpp-python plain" and sampled["llama-cpp-python plain"]["speedup"] == 1.0
    assert {"plain", "lookup", "lookup, trees", "draft", "hybrid", "draft, 400 tokens"} <= set(sampled)
    assert all(x["identical"] == -1 and x["prompts"] == 2 and x["speedup"] > 0 for x in sampled.values())
    assert sampled["draft"]["accepted"] > 0
    r = CliRunner().invoke(app, ["bench", "-m", str(tiny["target"]), "-n", "8"])
    assert r.exit_code == 0 and "| plain |" in r.stdout and "lookup k=4" in r.stdout
    assert "| llama-cpp-python plain |" in r.stdout and "temperature 0.8" in r.stdout


def test_spectool_bench_drafts_through_text_with_a_foreign_draft(tiny, tmp_path):
    """bench with a draft of another vocabulary: it says so, and its draft and hybrid contenders draft through
    text (drafters/text.py) with greedy outputs equal to plain decoding's; --draft-vocab has nothing to prune."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("The quick brown fox\n---\ndef add(a, b):\n    return a + b\n")
    r = CliRunner().invoke(app, ["bench", "-m", str(tiny["target"]), "-md", str(tiny["foreign"]), "--prompts",
                                 str(prompts), "-n", "16", "--draft-vocab", "400", "--json", "--greedy-only"])
    assert r.exit_code == 0, r.output
    assert "drafts through text" in r.stderr
    results = {x["contender"]: x for x in json.loads(r.stdout)["results"]}
    assert {"draft", "hybrid", "draft k=2"} <= set(results) and not any("tokens" in n for n in results)
    assert all(x["identical"] == 2 for x in results.values())
    assert results["draft k=2"]["drafted"] > 0


def test_llama_cpp_tools_reports_and_prompt_files(tmp_path):
    """llamacpp.py reads llama.cpp's own reports, in the printf formats of the vendored sources
    (examples/lookup/lookup.cpp, src/llama-context.cpp), and writes prompt files that `-f` reads back as is
    (common/arg.cpp drops one trailing newline)."""
    from spectool_lab import llamacpp as LC

    log = ("encoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n" % (157, 0.4, 392.5)
           + "decoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n" % (97, 1.812, 53.5)
           + "n_draft      = %d\nn_predict    = %d\nn_drafted    = %d\n" % (8, 97, 93)
           + "t_draft      = %.2f ms, %.2f us per token, %.2f tokens per second\nn_accept     = %d\n" % (3.1, 33.3, 30000, 79))
    r = LC.parse_lookup("text", log)
    assert (r.tokens, r.seconds, r.drafted, r.accepted) == (97, 1.812, 93, 79) and r.text == "text"
    # timed as spectool is: the 96 asked for (its last step went 6 past), with the decode of the last prompt
    # token that its clock leaves out
    r = LC.parse_lookup("", log.replace("decoded   97", "decoded  102"), 96, first_decode=0.04)
    assert r.tokens == 96 and abs(r.seconds - 1.852) < 1e-9
    assert LC.parse_lookup("", log.replace("decoded   97", "decoded   60"), 96).tokens == 60  # the text ended
    # llama-speculative-simple's report (examples/speculative-simple/speculative-simple.cpp), -n 95: 96 made
    spec = ("decoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n" % (96, 1.5, 64.0)
            + "\nn_draft   = %d\nn_predict = %d\nn_drafted = %d\nn_accept  = %d\naccept    = %.3f%%\n" % (16, 96, 70, 55, 78.571))
    r = LC.parse_lookup("", spec, 96)
    assert (r.tokens, r.seconds, r.drafted, r.accepted) == (96, 1.5, 70, 55)
    perf = ("llama_perf_context_print: prompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\n"
            % (401.0, 157, 2.55, 391.5)
            + "llama_perf_context_print:        eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)\n"
            % (3712.5, 95, 39.08, 25.59))
    r = LC.parse_completion("", perf)
    assert (r.tokens, r.seconds) == (95, 3.7125) and abs(r.tokens_per_second - 25.59) < 0.01
    # choosing the tokens counts too, as it does on every other clock: 96 sampled (common_perf_print's line, as
    # llama-completion 0.3.36 writes it), 95 of them after a decode
    sampling = "0.00.816.810 I common_perf_print:    sampling time =      96.00 ms\n"
    r = LC.parse_completion("", sampling + perf)
    assert r.tokens == 95 and abs(r.seconds - (3.7125 + 0.095)) < 1e-9
    # and so does the rest of its loop (each token's text made and written out): the perf report's unaccounted time
    unaccounted = ("0.00.816.812 I common_perf_print: unaccounted time =      48.00 ms /   1.1 %      "
                   "(total - sampling - prompt eval - eval) / (total)\n")
    r = LC.parse_completion("", sampling + perf + unaccounted)
    assert r.tokens == 95 and abs(r.seconds - (3.7125 + 0.095 + 0.0475)) < 1e-9
    for prompt in ("Question: why?\nAnswer:", "Text\n\nAnswer:\n"):
        path = LC._prompt_file(str(tmp_path), prompt)
        text = path.read_text()
        assert (text[:-1] if text.endswith("\n") else text) == prompt  # what llama.cpp's -f makes of it


def test_a_tools_text_cut_inside_a_character_reads_as_text():
    """llama.cpp's tools write each token's bytes as it comes, so a text cut at the token budget can end inside a
    character (a sampled SmolLM2 chat stopped a benchmark so, 2026-12-07): the run reads it, and the generated text
    leaves the cut character out, so that it compares with spectool's up to where both go. A tool that fails
    raises, naming itself."""
    import sys

    import pytest
    from spectool_lab import llamacpp as LC

    write = "import sys; sys.stdout.buffer.write({!r}); sys.exit({})"
    p = LC._run("a tool", [sys.executable, "-c", write.format("PROMPT caf\u00e9 \u2192".encode()[:-1], 0)])
    assert LC._generated(p.stdout, "PROMPT") == " caf\u00e9 "
    with pytest.raises(RuntimeError, match="a tool failed"):
        LC._run("a tool", [sys.executable, "-c", write.format(b"", 3)])


def test_spectool_counts_an_ending_token_as_llama_cpps_drafters_do(smollm2):
    """The oracle for the benchmarks' counting (llamacpp.counted): on a question SmolLM2 answers in a few tokens,
    llama-speculative-simple's `decoded N tokens` holds the end-of-generation token its last decode made; spectool's
    plain generation of the same text, counted with its ending token, is as many, and without it one fewer."""
    from spectool_lab import llamacpp as LC

    from spectool.core.costs import Costs
    from spectool.core.stats import Stats
    from spectool.core.verify import Sampling
    from spectool.generate.loop import speculative_generate
    from spectool.llama.engine import Model
    from spectool.options import Mode

    binary = LC.build(quiet=True, targets=("llama-speculative-simple",))["llama-speculative-simple"]
    text = "<|im_start|>user\nIs the sky blue? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n"
    theirs = LC.speculative_ngram(binary, smollm2, text, 96, "ngram-simple")
    with Model(smollm2, n_ctx=512, n_threads=2) as m:
        st = Stats(mode=Mode.none)
        g = Contender("plain", Mode.none).generation(m, {}, 96, Costs(), Sampling())
        tokens = [t for step in speculative_generate(g, m.tokenize(text, parse_special=True), st)
                  for t in step.tokens]
    assert st.finish_reason == "stop" and 0 < len(tokens) < 20, (st.finish_reason, tokens)
    assert LC.counted(len(tokens), True) == theirs.tokens, (tokens, theirs)
    assert LC.counted(len(tokens), False) == theirs.tokens - 1
