"""The agent programs and libraries people point at a local server, each run for real against `spectool serve`
(issue 46 item 1): a prompt, a tool call the client itself executes, its result sent back, a streamed answer.

The server runs the scripted tiny model (tinymodels.write_script_model): its greedy reply is the test's tool call
(written in the client's own tool's name and arguments) until a tool's result is in the prompt, then ANSWER. The
server requires a key, so each client's key setting is tested too. A Recorder proxy between client and server
keeps every request: each must get a 2xx, and a request after the call must carry the tool's output, which only
running the tool gives (a file's random content, or what the shell makes of `$((6*7))`). Each client runs with
its defaults but for base URL, key and model (no permission flags: each agent's file-reading tool, and Codex's
sandboxed shell, run unasked in a headless session), its home and config folders in tmp_path, telemetry and
update checks off by its own settings. docs/serve.md's client section is these configurations. The clients are
installed on first use into a cache (tests/agents.py); the libraries without conflicts are in the test extra."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel
from agents import Recorder, npm_client, pypi_venv
from spectool_lab.helpers import Server

KEY = "sk-spectool-test"
MODEL = "spectool"  # any name: the served model answers
ANSWER = "Done: the tool ran."
PROMPT = "Read notes.txt and tell me what it says."


@dataclass
class Session:
    recorder: Recorder
    work: Path  # the client's working directory
    home: Path  # its HOME (and XDG folders)
    secret: str  # what the tool's output holds and the call does not

    @property
    def url(self) -> str:
        return self.recorder.url

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment: nothing of the user's configuration (no API keys, no config folders)."""
        keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR")
        env = {k: v for k, v in os.environ.items() if k in keep}
        h = self.home
        return env | {"HOME": str(h), "XDG_CONFIG_HOME": str(h / ".config"), "XDG_DATA_HOME": str(h / ".local/share"),
                      "XDG_STATE_HOME": str(h / ".local/state"), "XDG_CACHE_HOME": str(h / ".cache"),
                      "NO_COLOR": "1"} | extra

    def run(self, cmd: list, env: dict[str, str], timeout: float = 300) -> str:
        """The client's run, which must end well: its stdout."""
        r = subprocess.run([str(c) for c in cmd], cwd=self.work, env=env, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n{self.summary()}"
        return r.stdout

    def summary(self) -> str:
        return "\n".join(f"{e.method} {e.path} {e.status}" for e in self.recorder.exchanges)

    def all_2xx(self) -> list:
        """The POSTs, there being some, every request having got a 2xx."""
        posts = self.recorder.posts()
        assert posts, "the client sent no request"
        bad = [f"{e.method} {e.path} {e.status}" for e in self.recorder.exchanges if not 200 <= e.status < 300]
        assert not bad, self.summary()
        return posts

    def check(self, out: str, tool_result: str | None = None, streamed: bool = True) -> list:
        """Every request a 2xx, the tool's output sent back in a later request (streamed where the client
        streams), and the answer in the client's output. The POSTs, for more checks."""
        posts = self.all_2xx()
        result = self.secret if tool_result is None else tool_result
        after = [e for e in posts if result in json.dumps(e.body)]
        assert after, f"no request carried the tool's output {result!r}:\n{self.summary()}"
        if streamed:
            assert any((e.body or {}).get("stream") for e in after), "the answer was not streamed"
        assert ANSWER in out, out[-3000:]
        return posts


@pytest.fixture
def serve(tmp_path):
    """serve(call) -> a Session: `spectool serve` (key KEY, the model's whole context) on a scripted model whose
    call is `call` ({"name": ..., "arguments": ...}, or the reply's text as it is), behind a Recorder; notes.txt
    in the work folder holds the secret."""
    from spectool_lab.tinymodels import write_script_model

    made = []

    def start(call: dict | str, answer: str = ANSWER) -> Session:
        work, home = tmp_path / "work", tmp_path / "home"
        work.mkdir(exist_ok=True)
        home.mkdir(exist_ok=True)
        secret = f"spectool-{uuid.uuid4().hex[:12]}"
        (work / "notes.txt").write_text(secret + "\n")
        model = write_script_model(tmp_path, call if isinstance(call, str) else json.dumps(call), answer,
                                   name=f"script{len(made)}")
        server = Server(model, "-c", "0", "--api-key", KEY)
        made.append(server)
        recorder = Recorder(server.url)
        made.append(recorder)
        return Session(recorder, work, home, secret)

    yield start
    for thing in reversed(made):
        if isinstance(thing, Recorder):
            thing.close()
        else:
            thing.stop()


def notes(tmp_path: Path) -> str:
    """The path of the file the client is to read (serve writes it)."""
    return str(tmp_path / "work" / "notes.txt")


# -- the agent programs ------------------------------------------------------------------------------------------
def test_claude_code(serve, tmp_path):
    """`claude -p` over /v1/messages: its Read tool (allowed by default) reads notes.txt."""
    s = serve({"name": "Read", "arguments": {"file_path": notes(tmp_path)}})
    env = s.env(ANTHROPIC_BASE_URL=s.url, ANTHROPIC_AUTH_TOKEN=KEY, ANTHROPIC_MODEL=MODEL,
                CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1")
    out = s.run([npm_client("claude"), "-p", PROMPT], env)
    posts = s.check(out)
    assert all(e.path.startswith("/v1/messages") for e in posts), s.summary()


CODEX_CONFIG = """\
model = "spectool"
model_provider = "spectool"
check_for_update_on_startup = false

[model_providers.spectool]
name = "spectool"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "SPECTOOL_API_KEY"

[analytics]
enabled = false
"""


def test_codex(serve, tmp_path):
    """`codex exec` over /v1/responses: its shell tool runs `echo spectool-$((6*7))` (in its sandbox)."""
    s = serve({"name": "exec_command", "arguments": {"cmd": "echo spectool-$((6*7))"}})
    codex_home = s.home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(url=s.url))
    subprocess.run(["git", "init", "-q", str(s.work)], check=True)  # codex exec works in a repository
    env = s.env(CODEX_HOME=str(codex_home), SPECTOOL_API_KEY=KEY)
    out = s.run([npm_client("codex"), "exec", "Run echo spectool-$((6*7)) and tell me what it printed."], env)
    posts = s.check(out, tool_result="spectool-42")
    assert all(e.path == "/v1/responses" for e in posts), s.summary()


def opencode_config(url: str) -> dict:
    return {"$schema": "https://opencode.ai/config.json", "model": "spectool/spectool",
            "provider": {"spectool": {"npm": "@ai-sdk/openai-compatible", "name": "spectool",
                                      "options": {"baseURL": f"{url}/v1", "apiKey": KEY},
                                      "models": {"spectool": {"name": "spectool"}}}}}


def test_opencode(serve, tmp_path):
    """`opencode run` over chat completions: its read tool reads notes.txt."""
    s = serve({"name": "read", "arguments": {"filePath": notes(tmp_path)}})
    (s.work / "opencode.json").write_text(json.dumps(opencode_config(s.url), indent=2))
    env = s.env(OPENCODE_DISABLE_AUTOUPDATE="true", OPENCODE_DISABLE_MODELS_FETCH="true",
                OPENCODE_DISABLE_LSP_DOWNLOAD="true")
    out = s.run([npm_client("opencode"), "run", PROMPT], env)
    posts = s.check(out)
    assert all(e.path == "/v1/chat/completions" for e in posts), s.summary()


CONTINUE_CONFIG = """\
name: spectool
version: 0.0.1
schema: v1
models:
  - name: spectool
    provider: openai
    model: spectool
    apiBase: {url}/v1
    apiKey: {key}
    capabilities: [tool_use]
"""


def test_continue_cli(serve, tmp_path):
    """`cn -p` over chat completions: its Read tool (allowed by default) reads notes.txt."""
    s = serve({"name": "Read", "arguments": {"filepath": notes(tmp_path)}})
    config = s.home / "config.yaml"
    config.write_text(CONTINUE_CONFIG.format(url=s.url, key=KEY))
    env = s.env(CONTINUE_GLOBAL_DIR=str(s.home / ".continue"), CONTINUE_CLI_ENABLE_TELEMETRY="0",
                CONTINUE_METRICS_ENABLED="0")
    out = s.run([npm_client("cn"), "-p", PROMPT, "--config", config], env)
    posts = s.check(out)
    assert all(e.path == "/v1/chat/completions" for e in posts), s.summary()


QWEN_SETTINGS = {"security": {"auth": {"selectedType": "openai"}}, "general": {"enableAutoUpdate": False},
                 "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}


def test_qwen_code(serve, tmp_path):
    """`qwen -p` over chat completions: its read_file tool reads notes.txt."""
    s = serve({"name": "read_file", "arguments": {"file_path": notes(tmp_path)}})
    (s.home / ".qwen").mkdir()
    (s.home / ".qwen" / "settings.json").write_text(json.dumps(QWEN_SETTINGS))
    env = s.env(OPENAI_BASE_URL=f"{s.url}/v1", OPENAI_API_KEY=KEY, OPENAI_MODEL=MODEL)
    out = s.run([npm_client("qwen"), "-p", PROMPT], env)
    posts = s.check(out)
    assert all(e.path == "/v1/chat/completions" for e in posts), s.summary()


def test_aider(serve):
    """`aider --message` over chat completions (aider edits by the reply's text, not by tool calls): the scripted
    reply, a whole-file edit in aider's default format for a model it does not know, applied to notes.txt and
    committed to the repository aider makes."""
    s = serve("notes.txt\n```\nspectool-42\n```")
    env = s.env(OPENAI_API_BASE=f"{s.url}/v1", OPENAI_API_KEY=KEY, AIDER_ANALYTICS="false",
                AIDER_CHECK_UPDATE="false")
    out = s.run([pypi_venv("aider") / "bin" / "aider", "--model", f"openai/{MODEL}",
                 "--message", "Replace the file's text with spectool-42.", "notes.txt"], env)
    assert (s.work / "notes.txt").read_text().strip() == "spectool-42", out[-3000:]
    assert s.all_2xx()[0].body.get("stream"), s.summary()  # the edit (then the commit's message, unstreamed)
    assert (s.work / ".git").is_dir()


# -- the libraries -------------------------------------------------------------------------------------------------
class Note(BaseModel):
    text: str


INSTRUCTOR = """\
import json, sys

import instructor
import openai
from pydantic import BaseModel


class Note(BaseModel):
    text: str


def client(url, mode=instructor.Mode.TOOLS):
    return instructor.from_openai(openai.OpenAI(base_url=url, api_key=sys.argv[3]), mode=mode)


messages = [{"role": "user", "content": "Write a note."}]
whole = client(sys.argv[1]).chat.completions.create(model="spectool", response_model=Note, messages=messages)
schema = client(sys.argv[1], instructor.Mode.JSON_SCHEMA).chat.completions.create(
    model="spectool", response_model=Note, messages=messages)
parts = list(client(sys.argv[2]).chat.completions.create_partial(model="spectool", response_model=Note,
                                                                 messages=messages))
print(json.dumps([whole.text, [p.text for p in parts], schema.text]))
"""


def test_instructor(serve):
    """instructor (in a venv of its own) in its default mode, a forced tool call, whole and as a stream of
    partial models (whose tool instructor names PartialNote: a second server's call), and in its JSON schema mode
    (response_format: the scripted model closes the JSON at once)."""
    s = serve({"name": "Note", "arguments": {"text": "spectool-42"}})
    partial = serve({"name": "PartialNote", "arguments": {"text": "spectool-42"}})
    out = s.run([pypi_venv("instructor") / "bin" / "python", "-c", INSTRUCTOR, f"{s.url}/v1", f"{partial.url}/v1",
                 KEY], s.env())
    whole, parts, schema = json.loads(out)
    assert (whole, parts[-1], schema) == ("spectool-42", "spectool-42", "")
    assert [bool(e.body.get("stream")) for e in s.all_2xx() + partial.all_2xx()] == [False, False, True]


def pydantic_ai_model(s: Session):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=f"{s.url}/v1", api_key=KEY))


def test_pydantic_ai_tools(serve):
    """An agent's tool run by pydantic-ai, its result sent back, the answer streamed (run_stream)."""
    import asyncio

    from pydantic_ai import Agent

    s = serve({"name": "read_notes", "arguments": {}})
    agent = Agent(pydantic_ai_model(s))

    @agent.tool_plain
    def read_notes() -> str:
        """The user's notes."""
        return s.secret

    async def session() -> str:
        async with agent.run_stream(PROMPT) as run:
            return await run.get_output()

    s.check(asyncio.run(session()))


def test_pydantic_ai_structured_output(serve):
    """pydantic-ai's default structured output (its final_result tool, forced) and its native output (a JSON
    schema as response_format)."""
    from pydantic_ai import Agent, NativeOutput

    s = serve({"name": "final_result", "arguments": {"text": "spectool-42"}})
    assert Agent(pydantic_ai_model(s), output_type=Note).run_sync("Write a note.").output == Note(text="spectool-42")
    native = Agent(pydantic_ai_model(s), output_type=NativeOutput(Note)).run_sync("Write a note.")
    assert native.output == Note(text="")
    assert [(e.body.get("response_format") or {}).get("type") for e in s.all_2xx()] == [None, "json_schema"]


def test_langchain_openai(serve):
    """ChatOpenAI with a bound tool: the call, the tool run by langchain, its result sent back and the answer
    streamed; with_structured_output (a JSON schema as response_format)."""
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    s = serve({"name": "read_notes", "arguments": {}})

    @tool
    def read_notes() -> str:
        """The user's notes."""
        return s.secret

    llm = ChatOpenAI(model=MODEL, base_url=f"{s.url}/v1", api_key=KEY, max_retries=0)
    bound = llm.bind_tools([read_notes])
    messages = [HumanMessage(PROMPT)]
    call = bound.invoke(messages)
    assert [c["name"] for c in call.tool_calls] == ["read_notes"]
    messages += [call, read_notes.invoke(call.tool_calls[0])]
    out = "".join(str(chunk.content) for chunk in bound.stream(messages))
    s.check(out)
    assert llm.with_structured_output(Note).invoke("Write a note.") == Note(text="")
    assert s.all_2xx()[-1].body["response_format"]["type"] == "json_schema"
