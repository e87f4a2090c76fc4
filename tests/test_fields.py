"""The field policy (spectool/server/fields.py) as the functions it is: docs/serve.md's tables are the declaration's
own, each API's refused fields are a 400 naming them unless their value asks nothing, the ignored ones (and on chat
the undeclared ones) come back to be counted, and the Responses and Messages APIs refuse a field they do not know.
What a server counts in /metrics is tested through a real server (test_serve_apis.py)."""

from pathlib import Path

import pytest

from spectool.server import fields
from spectool.server.errors import ApiError
from spectool.server.metrics import Ignored

DOCS = Path(__file__).resolve().parent.parent / "docs" / "serve.md"


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_the_docs_tables_are_the_declaration(api):
    table = fields.table(api)
    assert table in DOCS.read_text(), f"docs/serve.md's table of {api} fields is not the declaration's:\n{table}"


def test_every_declared_field_has_one_policy_per_api():
    for api in fields.APIS:
        names = [n for f in fields.rows(api) for n in f.names]
        assert len(names) == len(set(names)), (api, sorted(n for n in names if names.count(n) > 1))


def refused(api, body) -> str:
    with pytest.raises(ApiError) as e:
        fields.check(api, body)
    assert e.value.status == 400 and f"'{e.value.param}'" in e.value.message
    return e.value.param


@pytest.mark.parametrize("api, body", [
    ("chat", {"best_of": 2}), ("chat", {"logit_bias": {"42": 5}}), ("chat", {"suffix": "x"}),
    ("completions", {"tools": [{"type": "function"}]}), ("completions", {"echo": True}),
    ("chat", {"mirostat": 2}), ("chat", {"typical_p": 0.5}), ("chat", {"n_probs": 3}), ("chat", {"ignore_eos": True}),
    ("chat", {"samplers": ["temperature", "top_k"]}), ("chat", {"samplers": ["mirostat"]}),
    ("responses", {"previous_response_id": "resp_1"}), ("responses", {"background": True}),
    ("responses", {"truncation": "auto"}), ("responses", {"made_up": 1}),
    ("messages", {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}),
    ("messages", {"mcp_servers": [{"url": "https://x"}]}), ("messages", {"made_up": 1}),
])
def test_a_field_that_would_change_the_answer_is_a_400_naming_it(api, body):
    assert refused(api, body) == next(iter(body))


def test_what_asks_nothing_passes_and_comes_back_to_be_counted():
    assert fields.check("chat", {"messages": [], "max_tokens": 4, "temperature": 0.5}) == []
    assert fields.check("chat", {"model": "m", "metadata": {"a": 1}, "best_of": 1, "mirostat": 0, "typical_p": 1.0,
                                 "samplers": ["penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temp"],
                                 "a_field_of_its_own": 1}) == [
        "model", "metadata", "best_of", "mirostat", "typical_p", "samplers", "a_field_of_its_own"]
    codex = {"model": "m", "input": "hi", "client_metadata": {"x": "y"}, "reasoning": {"effort": "low"},
             "store": False, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
             "parallel_tool_calls": False, "text": {"verbosity": "low"},
             "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}, {"type": "web_search_2025_08_26"}]}
    assert fields.check("responses", codex) == [
        "model", "client_metadata", "reasoning", "store", "prompt_cache_key", "text.verbosity", "tools.web_search",
        "tools.web_search_2025_08_26"]
    claude = {"model": "m", "max_tokens": 9, "metadata": {"user_id": "u"}, "thinking": {"type": "adaptive"},
              "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
              "output_config": {"effort": "high"},
              "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
              "messages": [{"role": "user", "content": "hi"}]}
    assert fields.check("messages", claude) == [
        "model", "metadata", "thinking", "context_management", "output_config.effort", "cache_control"]
    # a null value is as if the field were absent
    assert fields.check("messages", {"messages": [], "metadata": None}) == []


def test_the_counts_name_only_declared_fields():
    """A name a client chose (which may hold a user's data: issue 58 item 11) is counted as `other`."""
    ignored = Ignored()
    ignored.add("chat", ["metadata", "metadata", 'bad"name', "user_ssn_123-45-6789", "speculative.n_min"])
    ignored.add("chat", [f"f{i}" for i in range(400)])
    ignored.add("responses", ["tools.web_search_2025_08_26", "tools.web_search_20evil"])
    text = ignored.prometheus()
    assert 'spectool_ignored_fields_total{api="chat",field="metadata"} 2\n' in text
    assert 'field="speculative.n_min"} 1\n' in text and 'field="tools.web_search"} 1\n' in text
    assert 'field="bad' not in text and "ssn" not in text and 'api="chat",field="other"} 402' in text
    assert 'api="responses",field="other"} 1' in text and len(ignored.counts) == 5
