"""--grammar, --grammar-file, -j/--json-schema and -jf/--json-schema-file on run, chat and serve: bad input is one
line and exit 2 before any model loads; a good one constrains what the model writes (the tiny model, and the real
Gemma for a JSON schema)."""

import json

import pytest
from spectool_lab.helpers import spectool
from typer.testing import CliRunner

from spectool.cli import app

runner = CliRunner()
YES_NO = 'root ::= "yes" | "no"'
SENTENCE = "the quick brown fox jumps over the lazy dog"


def one_line_error(r, flag: str) -> str:
    """The single error line of a command that failed with exit 2 and named `flag`."""
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.stderr
    assert flag in lines[0], lines[0]
    return lines[0]


def bad_inputs(tmp_path) -> list[tuple[list[str], str, str]]:
    """(arguments, the flag the error names, a word of its reason) for each way a grammar option can be bad."""
    (tmp_path / "latin1.json").write_bytes(b'{"enum": ["caf\xe9"]}')
    (tmp_path / "bad.gbnf").write_text("root ::= (")
    (tmp_path / "bad.json").write_text('{"type": "object", "properties": {"a": {"type": "strin"}}}')
    return [
        (["--grammar", "root ::= ("], "--grammar", ""),
        (["--grammar", "this is not gbnf"], "--grammar", ""),
        (["--grammar-file", str(tmp_path / "bad.gbnf")], "--grammar-file", ""),
        (["--grammar-file", str(tmp_path / "missing.gbnf")], "--grammar-file", "no such file"),
        (["--grammar-file", str(tmp_path)], "--grammar-file", "is a directory"),
        (["-j", "{not json"], "--json-schema", ""),
        (["-j", '{"type": "strin"}'], "--json-schema", "strin"),  # a schema the library refuses: its reason
        (["-j", '{"type": "string", "pattern": "(?<=a)b"}'], "--json-schema", "look"),  # look-around: unsupported
        (["-jf", str(tmp_path / "bad.json")], "--json-schema-file", "strin"),
        (["-jf", str(tmp_path / "latin1.json")], "--json-schema-file", "UTF-8"),
        (["-jf", str(tmp_path / "missing.json")], "--json-schema-file", "no such file"),
        (["--grammar", YES_NO, "-j", "{}"], "--json-schema", "at most one"),
        (["-jf", str(tmp_path / "bad.json"), "--grammar-file", str(tmp_path / "bad.gbnf")], "--json-schema-file",
         "at most one"),
    ]


def nested(n: int) -> dict:
    """A schema nested n levels deep (grammar.deeper counts each object): arrays of arrays ... of strings."""
    schema: dict = {"type": "string"}
    for _ in range(n - 1):
        schema = {"type": "array", "items": schema}
    return schema


def ref_chain(n: int) -> dict:
    """A schema whose $refs run n deep (1,100 of them overflowed llguidance's stack: the process died)."""
    defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(n)}
    return {"$defs": {**defs, f"d{n}": {"type": "string"}}, "$ref": "#/$defs/d0"}


def rule_chain(n: int) -> str:
    """A GBNF grammar of n rules, each calling the next (2,500 overflowed llguidance's stack as Lark)."""
    return "root ::= r0\n" + "".join(f'r{i} ::= "x" r{i + 1}\n' for i in range(n)) + f'r{n} ::= "y"\n'


def groups(n: int) -> str:
    return "root ::= " + "(" * n + '"a" [()] "(" # )\n' + ")" * n  # (brackets in strings, classes, comments)


def deep_inputs(tmp_path) -> list[tuple[list[str], str, str]]:
    """Issue 47: each way of nesting too deep or of the wrong JSON type, on every source; before, the same
    cause said "maximum recursion depth exceeded ..." or "'str' object is not a mapping" (exit 1), or killed the
    process."""
    files = {"deep.json": "[" * 1000 + "]" * 1000, "deep_schema.json": '{"type": "array", "items": ' * 1000 + "{}" + "}" * 1000, "refs.json": json.dumps(ref_chain(3000)),
             "string.json": json.dumps('{"type": "object"}'), "guidance.json": json.dumps({"x-guidance": "s"}),
             "groups.gbnf": groups(1000), "rules.gbnf": rule_chain(5000),
             "lark.gbnf": "start: %json " + json.dumps(ref_chain(3000))}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    deep, file = "nested deeper than 100 levels", "--json-schema-file"
    return [
        (["-jf", str(tmp_path / "deep.json")], f"{file} {tmp_path / 'deep.json'}", deep),
        (["-jf", str(tmp_path / "deep_schema.json")], f"{file} {tmp_path / 'deep_schema.json'}", deep),
        (["-jf", str(tmp_path / "refs.json")], f"{file} {tmp_path / 'refs.json'}", deep),
        (["-j", "[" * 5000 + "]" * 5000], "--json-schema", deep),
        (["-jf", str(tmp_path / "string.json")], file, "must be a JSON object (it is a string)"),
        (["-j", "[]"], "--json-schema", "must be a JSON object (it is a list)"),
        (["-j", "true"], "--json-schema", "must be a JSON object (it is a boolean)"),
        (["-jf", str(tmp_path / "guidance.json")], file, "'x-guidance' must be a JSON object (it is a string)"),
        (["-j", '{"x-guidance": [1]}'], "--json-schema", "'x-guidance' must be a JSON object (it is a list)"),
        (["--grammar-file", str(tmp_path / "groups.gbnf")], f"--grammar-file {tmp_path / 'groups.gbnf'}",
         "groups nest deeper than 100 levels"),
        (["--grammar", groups(150)], "--grammar", "groups nest deeper than 100 levels"),
        (["--grammar-file", str(tmp_path / "rules.gbnf")], "--grammar-file", "more than 1000 rules"),
        (["--grammar-file", str(tmp_path / "lark.gbnf")], "--grammar-file", "a %json schema is " + deep),
    ]


def test_a_bad_grammar_is_one_line_and_exit_2_before_any_model_loads(tmp_path):
    """The model path does not exist: had it been looked at first, the error would be about the model."""
    for args, flag, reason in bad_inputs(tmp_path) + deep_inputs(tmp_path):
        line = one_line_error(runner.invoke(app, ["run", "-m", str(tmp_path / "none.gguf"), *args, "hi"]), flag)
        assert reason in line and "none.gguf" not in line, (args, line)


def test_the_bounds_on_schemas_and_grammars_are_where_they_are_stated(tiny, tmp_path):
    """grammar.DEPTH_MAX (100 levels: a schema's, $refs followed; a GBNF grammar's groups) and RULES_MAX (1,000
    rules): at the bound, run takes it and writes; one past it, exit 2 naming the bound."""
    base = ["run", "-m", str(tiny["target"]), "-n", "2", "-q"]
    for ok, over, bound in (
            (["-j", json.dumps(nested(100))], ["-j", json.dumps(nested(101))], "nested deeper than 100 levels"),
            (["-j", json.dumps(ref_chain(48))], ["-j", json.dumps(ref_chain(49))], "nested deeper than 100 levels"),
            (["--grammar", groups(100)], ["--grammar", groups(101)], "groups nest deeper than 100 levels"),
            (["--grammar", rule_chain(998)], ["--grammar", rule_chain(999)], "more than 1000 rules")):
        r = runner.invoke(app, [*base, *ok, "The quick brown fox"])
        assert r.exit_code == 0 and r.stdout.strip(), (ok[0], r.output[-300:])
        assert bound in one_line_error(runner.invoke(app, [*base, *over, "The quick brown fox"]), over[0])


def test_chat_and_serve_refuse_a_bad_grammar_the_same_way(tmp_path):
    for command in ("chat", "serve"):
        for args, flag, reason in bad_inputs(tmp_path)[:7:3]:
            line = one_line_error(runner.invoke(app, [command, "-m", str(tmp_path / "none.gguf"), *args]), flag)
            assert reason in line, (command, args, line)


def test_the_four_flags_constrain_what_run_writes(tiny, tmp_path):
    (tmp_path / "yes_no.gbnf").write_text(YES_NO + "\n")
    schema = {"enum": ["red", "green", "blue"]}
    (tmp_path / "colour.json").write_text(json.dumps(schema))
    base = ["run", "-m", str(tiny["target"]), "-n", "40", "-q"]
    plain = runner.invoke(app, [*base, "The quick brown fox"])
    assert plain.exit_code == 0 and plain.stdout.strip() not in ("yes", "no")  # the test can fail
    for args, allowed in ((["--grammar", YES_NO], {"yes", "no"}),
                          (["--grammar-file", str(tmp_path / "yes_no.gbnf")], {"yes", "no"}),
                          (["-j", json.dumps(schema)], {'"red"', '"green"', '"blue"'}),
                          (["--json-schema-file", str(tmp_path / "colour.json")], {'"red"', '"green"', '"blue"'})):
        stats = tmp_path / "s.json"
        r = runner.invoke(app, [*base, *args, "--stats-json", str(stats), "The quick brown fox"])
        assert r.exit_code == 0 and r.stdout.rstrip("\n") in allowed, (args, r.output)
        assert json.loads(stats.read_text())["finish_reason"] == "stop"  # the grammar is complete: it stops


def test_forced_tokens_are_drafted_and_n_before_the_grammar_completes_is_length(tiny, tmp_path):
    """A grammar of one sentence forces every token after the first: they are drafted by the grammar (the summary
    line counts them; a fixed draft length drafts whatever is offered), and the text is the sentence. Cut by -n,
    the text is a part of it, finish "length"."""
    grammar = f'root ::= "{SENTENCE}"'
    stats = tmp_path / "s.json"
    out = spectool("run", "-m", tiny["target"], "-n", "64", "--draft-min", "8", "--draft-max", "8", "--grammar",
                   grammar, "--stats-json", stats, "The dog", timeout=300)
    assert out.returncode == 0 and out.stdout.rstrip("\n") == SENTENCE, out.stderr
    summary = out.stderr.strip().splitlines()[-1]
    assert "grammar" in summary and "finish: stop" in summary, summary
    j = json.loads(stats.read_text())
    assert j["drafted_by_source"]["grammar"] > 0 and sum(j["drafted_by_source"].values()) == j["n_drafted"]
    r = runner.invoke(app, ["run", "-m", str(tiny["target"]), "-n", "2", "-q", "--grammar", grammar,
                            "--stats-json", str(stats), "The dog"])
    text = r.stdout.rstrip("\n")
    assert r.exit_code == 0 and text and SENTENCE.startswith(text) and text != SENTENCE, r.output
    assert json.loads(stats.read_text())["finish_reason"] == "length"


def test_a_grammar_keeps_the_cost_table_its_forced_drafts_learn(tiny, tmp_path, monkeypatch):
    """With --spec none a grammar's forced tokens are still drafted, so what their batches cost is measured: kept
    for the next run (as any drafting run keeps it), not measured afresh every time. Plain decoding keeps none."""
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path / "cache"))
    base = ["run", "-m", str(tiny["target"]), "--spec", "none", "-n", "16", "-q", "The dog"]

    def tables():
        r = runner.invoke(app, ["info", "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["cost_tables"]

    assert runner.invoke(app, base).exit_code == 0 and tables() == []
    assert runner.invoke(app, [*base, "--grammar", f'root ::= "{SENTENCE}"']).exit_code == 0
    assert len(tables()) == 1


def test_chat_constrains_every_assistant_turn(tiny):
    r = runner.invoke(app, ["chat", "-m", str(tiny["target"]), "-n", "16", "-q", "--temp", "0", "--grammar", YES_NO],
                      input="The quick brown fox\nAnd the dog?\nOnce more\n/exit\n")
    assert r.exit_code == 0, r.output
    replies = [line.removeprefix("> ").strip() for line in r.stdout.splitlines()]
    replies = [line for line in replies if line]
    assert len(replies) == 3 and set(replies) <= {"yes", "no"}, r.stdout


@pytest.mark.realmodel
def test_run_j_on_gemma_prints_json_valid_against_its_schema(gemma_q4):
    import jsonschema

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "year": {"type": "integer"},
                                               "city": {"type": "string"}},
              "required": ["name", "year", "city"], "additionalProperties": False}
    prompt = ("Text: The Eiffel Tower was completed in 1889 for the World's Fair in Paris.\n"
              "The facts of the text as JSON (name, year, city):")
    out = spectool("run", "-m", gemma_q4, "-c", "1024", "-t", "2", "-n", "200", "-j", json.dumps(schema), prompt,
                   timeout=600)
    assert out.returncode == 0, out.stderr
    value = json.loads(out.stdout)
    jsonschema.validate(value, schema)
    assert "finish: stop" in out.stderr.strip().splitlines()[-1]
