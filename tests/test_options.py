"""Options are declared once (options.py): what each command takes, its defaults, serve's per-request fields."""

import dataclasses

import pytest
import typer
from typer.testing import CliRunner

from spectool.cli import app
from spectool.options import SAMPLING, Options, UserError, in_request, llama_cpp_sampling, \
    request_options, takes


def test_every_flag_is_declared_once_and_each_option_has_a_group():
    flags = [f for decl, _, _ in Options.declared().values() for f in decl.flags]
    assert len(flags) == len(set(flags))
    assert all(decl.group and decl.help for decl, _, _ in Options.declared().values())


def test_a_command_gets_exactly_the_options_of_its_groups_with_its_own_defaults():
    seen = {}

    @takes(SAMPLING, "debug", temp=0.8)
    def cmd(o: Options, word: str = "x"):
        seen["o"], seen["word"] = o, word

    probe = typer.Typer()
    probe.command()(cmd)
    r = CliRunner().invoke(probe, ["--top-k", "7", "--word", "y"])
    assert r.exit_code == 0, r.output
    o = seen["o"]
    assert (o.top_k, o.temp, o.debug, seen["word"]) == (7, 0.8, False, "y")
    assert o.top_p == Options().top_p and o.max_tokens == Options().max_tokens  # not taken: the declared default
    r = CliRunner().invoke(probe, ["--max-tokens", "3"])
    assert r.exit_code == 2 and "No such option" in r.output  # a group it does not take
    with pytest.raises(TypeError, match="max_tokens"):
        takes(SAMPLING, max_tokens=3)(lambda o: None)


def test_help_shows_each_commands_default_from_the_declaration():
    runner = CliRunner()
    for command, temp in (("run", "0.0"), ("serve", "0.0"), ("chat", "0.8")):
        out = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        line = next(ln for ln in out.splitlines() if ln.startswith("│ --temp "))
        assert f"[default: {temp}]" in line
        line = next(ln for ln in out.splitlines() if ln.startswith("│ --top-k "))
        assert f"[default: {Options().top_k}]" in line


def test_llama_cpp_sampling_is_the_declared_chain_at_llama_cpps_temperature():
    """What chat and the benchmarks call llama.cpp's default sampling is what llama-cpp-python declares as its
    completion defaults (an oracle outside spectool), and it is the command line's declared chain with only the
    temperature changed."""
    import inspect

    from llama_cpp import Llama

    theirs = {k: p.default for k, p in inspect.signature(Llama.create_completion).parameters.items()}
    s = llama_cpp_sampling()
    assert (s.temp, s.top_k, s.top_p, s.min_p, s.repeat_penalty, s.presence_penalty, s.frequency_penalty) == \
        (theirs["temperature"], theirs["top_k"], theirs["top_p"], theirs["min_p"], theirs["repeat_penalty"],
         theirs["presence_penalty"], theirs["frequency_penalty"])
    assert dataclasses.replace(s, temp=Options().temp) == Options().sampling()


def test_a_request_sets_the_declared_fields_within_the_command_lines_bounds():
    base = Options(temp=0.0, max_tokens=100)
    o = request_options(base, {"temperature": 0.7, "top_k": 5, "seed": 3, "max_tokens": 9, "stream": True})
    assert (o.temp, o.top_k, o.seed, o.max_tokens) == (0.7, 5, 3, 9)
    assert dataclasses.replace(o, temp=0.0, top_k=40, seed=None, max_tokens=100) == base
    for body, field in (({"temperature": -1}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"seed": 1.5}, "seed"),
                        ({"max_tokens": 0}, "max_tokens"), ({"presence_penalty": 3}, "presence_penalty"),
                        ({"top_k": "many"}, "top_k"), ({"min_p": True}, "min_p")):
        with pytest.raises(UserError) as e:
            request_options(base, body)
        name, message = in_request(e.value)
        assert name == field and f"'{field}'" in message and "--" not in message
    with pytest.raises(UserError) as e:  # the one top-p check, in the request's terms too
        request_options(base, {"top_p": 0.0}).sampling()
    assert in_request(e.value) == ("top_p", "'top_p' must be in (0, 1]")


def test_commands_that_draft_take_the_drafting_flags_and_every_command_takes_debug():
    """What a user can type: the commands that generate (run, chat, serve) take --spec, --draft-max and --draft-min,
    bench (which measures every mode itself) takes none of them, and every command takes --debug; a drafting flag
    given to bench is a usage error (exit 2), not ignored."""
    cli = typer.main.get_command(app)
    flags = {name: {o for p in command.params for o in p.opts} for name, command in cli.commands.items()}
    for name in ("run", "chat", "serve"):
        assert {"--spec", "--draft-max", "--draft-min", "--debug"} <= flags[name], name
    assert not {"--spec", "--draft-max"} & flags["bench"]
    assert all("--debug" in f for f in flags.values()), flags
    result = CliRunner().invoke(app, ["bench", "--spec", "lookup"])
    assert result.exit_code == 2 and "--spec" in result.output


def test_every_source_has_a_colour_and_every_mode_past_auto_names_a_source():
    """Drafts come from lookup, lookup in the corpus of earlier requests, the draft model, the MTP head, two in one
    step (hybrid), a grammar's forced tokens, or a request's prediction: each has its colour under --color-drafts,
    and each reads as its plain name in panels and messages. A mode other than auto drafts by the source of its name
    (a grammar forces tokens under any mode, lookup drafts from the corpus where --lookup-corpus is on, and a
    prediction is drafted ahead of any mode's drafter)."""
    from spectool.core.evidence import Source
    from spectool.options import Mode
    from spectool.cli.display import SOURCE_STYLE

    assert set(SOURCE_STYLE) == set(Source) - {Source.none}
    assert len(set(SOURCE_STYLE.values())) == len(SOURCE_STYLE)
    assert {Source(m.value) for m in Mode if m is not Mode.auto} == set(Source) - {Source.grammar, Source.corpus,
                                                                                  Source.prediction}
    assert f"{Source.hybrid}" == str(Mode.hybrid) == "hybrid" and f"{Source.none:>5}" == " none"
