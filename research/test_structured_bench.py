"""The structured-output benchmark's pieces (spectool_lab.extraction, which benchmarks/structured.py
and research/structured_bound.py run): the extraction prompts built from the real data sets, their
schemas, the check that counts an output valid and the table. (Its speed is measured by the
benchmark itself, not here.)"""

import json

import jsonschema
import pytest

from spectool_lab import common as P
from spectool_lab import extraction as S


@pytest.fixture(scope="module")
def extractions():
    return S.extraction_prompts(8)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """The tiny generated target model (spectool_lab.tinymodels), as the suite's fixture."""
    from spectool.llama.engine import Model
    from spectool_lab.tinymodels import write_models

    path = write_models(tmp_path_factory.mktemp("tiny"))["target"]
    with Model(path, n_ctx=1024, n_threads=2) as m:
        yield m


def test_eight_extraction_prompts_from_both_data_sets_with_a_schema_each(extractions):
    assert len(extractions) == 8 and len({e.message for e in extractions}) == 8
    functions, texts = P.humaneval_functions(4), P.grounded_texts(4)
    # each message holds its text from the data set, whole: the values a schema asks for are there to copy
    assert all(code in e.message and e.source == f"HumanEval {name}"
               for e, (name, code) in zip(extractions[0::2], functions))
    assert all(text in e.message for e, text in zip(extractions[1::2], texts))
    for e in extractions:
        jsonschema.Draft202012Validator.check_schema(e.schema)
        assert 3 <= len(e.schema["properties"]) <= 6 and e.schema["required"] == list(e.schema["properties"])


def test_spectool_compiles_every_schema(extractions):
    from spectool.core.grammar import Grammar

    for e in extractions:
        assert Grammar.json_schema(e.schema).kind == "json_schema"  # llguidance accepts it, maxLength and enum too


def test_the_worked_example_is_valid_and_is_not_the_answer(extractions):
    demo_text, demo = S.FUNCTION_DEMO
    assert S.check(json.dumps(demo), S.FUNCTION) is None
    assert all(demo_text not in code for _, code in P.humaneval_functions(4))  # the example is none of the prompts


def test_the_check_rejects_what_is_not_valid_json_for_the_schema():
    good = {"kind": "fix", "instruction": "Fix this:", "topic": "grammar", "first_sentence": "It are.", "names": []}
    assert S.check(json.dumps(good), S.REQUEST) is None
    text = json.dumps(good)
    assert S.check(text[:-5], S.REQUEST).startswith("not JSON")  # cut at -n before the grammar completed
    assert "kind" in S.check(json.dumps(good | {"kind": "translate"}), S.REQUEST)  # outside the enum
    assert "names" in S.check(json.dumps({k: v for k, v in good.items() if k != "names"}), S.REQUEST)
    assert S.check(json.dumps(good | {"extra": 1}), S.REQUEST).startswith("against the schema")
    assert S.check(json.dumps(good | {"topic": "x" * 200}), S.REQUEST) is not None  # past maxLength


def test_a_table_counts_the_valid_outputs_and_says_why_the_others_are_not():
    good = json.dumps(S.FUNCTION_DEMO[1])
    plain, server = S.Row("spectool constrained plain", prompts=2, tokens=100, seconds=2.0), \
        S.Row("llama-server", prompts=2, tokens=100, seconds=4.0)
    for r, texts in ((plain, [good, good]), (server, [good, good[:-1]])):
        for t in texts:
            r.output(t, S.FUNCTION, "HumanEval f")
    table = S.table([plain, server])
    assert "| spectool constrained plain | 50.0 |" in table and "| 2.00x | " in table
    assert "| 2/2 |" in table and "| 1/2 |" in table
    assert "- llama-server on HumanEval f: not JSON" in table


def test_structured_bound_oracles_bound_the_controller(target):
    """research/structured_bound.py on replayed costs (the tiny model's vocabulary and the grammar, no decoding):
    a record copied from the prompt under a grammar whose keys are forced. Each oracle is never dearer than the
    controller over the same drafts, lookup with the forced tokens never dearer than lookup alone, and the forced
    tokens alone already save steps."""
    import structured_bound as B
    from spectool.core.controller import Controller
    from spectool.core.costs import Costs
    from spectool.core.grammar import Grammar

    grammar = Grammar.gbnf('root ::= "{\\"name\\": \\"" [a-z ]{1,10} "\\", \\"n\\": " [0-9]{1,3} "}"')
    record = '{"name": "ab cd", "n": 42}'
    p = target.tokenize(f"a record: {record}\nthe same record: ", add_special=True)
    y = target.tokenize(record, add_special=False)
    cost = [0.0, 1.0] + [1.6 + 0.15 * (b - 2) for b in range(2, 40)]
    best = {}
    for name, (lookup, forced) in B.DRAFTS.items():
        ctl = Controller(k_max=16, costs=Costs(), timed=False)
        mine = B.controlled(B.drafter(target, grammar, lookup, forced), p, y, cost, ctl)
        best[name] = B.oracle(B.drafter(target, grammar, lookup, forced), p, y, cost, 16)
        assert best[name] <= mine <= len(y) * cost[1], name
    assert best["lookup + forced tokens"] <= best["lookup only"] < len(y) * cost[1]
    assert best["forced tokens only"] < len(y) * cost[1]
