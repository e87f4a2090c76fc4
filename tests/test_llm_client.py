"""The `llm` command-line tool (pip's `llm`) against `spectool serve`, configured as its documentation says (and as
the README shows): an `extra-openai-models.yaml` in its user directory naming the server's base URL. A prompt, a
conversation continued with `-c` (llm resends the earlier turns) and an `llm chat` session, each answer the text
the official `openai` client gets for the same messages (greedy: the same text), read back from llm's own log.
On a GPU host the same: the server's tiny model runs on the CPU there too."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spectool_lab.helpers import Server

LLM = [sys.executable, "-m", "llm"]


@pytest.fixture(scope="module")
def server(tiny):
    s = Server(tiny["target"])
    yield s
    s.stop()


@pytest.fixture
def home(tmp_path, server):
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: spectool\n  model_name: spectool\n  api_base: {server.url}/v1\n")
    return tmp_path


def llm(home: Path, *args: str, stdin: str | None = None) -> str:
    r = subprocess.run([*LLM, *args], env={**os.environ, "LLM_USER_PATH": str(home)}, input=stdin,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def logged(home: Path) -> list[dict]:
    """llm's log of what it sent and got, oldest first: each response's prompt, text and conversation."""
    return sorted(json.loads(llm(home, "logs", "--json", "-n", "0")), key=lambda r: r["datetime_utc"])


def oracle(server, messages: list[dict]) -> str:
    r = server.client().chat.completions.create(model="spectool", messages=messages, max_tokens=12)
    return r.choices[0].message.content


def test_a_prompt_and_a_continued_conversation_through_llm(server, home):
    out = llm(home, "-m", "spectool", "-o", "max_tokens", "12", "Say something about foxes.")
    first = logged(home)
    assert len(first) == 1 and first[0]["model"] == "spectool"
    text = first[0]["response"]
    assert text and text == oracle(server, [{"role": "user", "content": "Say something about foxes."}])
    assert text in out
    llm(home, "-c", "-o", "max_tokens", "12", "And about owls?")
    both = logged(home)
    assert len(both) == 2 and both[1]["conversation_id"] == both[0]["conversation_id"]
    assert both[1]["response"] == oracle(server, [{"role": "user", "content": "Say something about foxes."},
                                                  {"role": "assistant", "content": text},
                                                  {"role": "user", "content": "And about owls?"}])


def test_an_llm_chat_session(server, home):
    llm(home, "chat", "-m", "spectool", "-o", "max_tokens", "12", stdin="Name a colour.\nAnd a fruit?\nexit\n")
    turns = logged(home)
    assert [t["prompt"] for t in turns] == ["Name a colour.", "And a fruit?"]
    assert turns[0]["conversation_id"] == turns[1]["conversation_id"]
    messages = [{"role": "user", "content": "Name a colour."}]
    assert turns[0]["response"] == oracle(server, messages)
    messages += [{"role": "assistant", "content": turns[0]["response"]}, {"role": "user", "content": "And a fruit?"}]
    assert turns[1]["response"] == oracle(server, messages)
