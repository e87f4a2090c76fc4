"""The load of `spectool serve` that benchmarks/load.py runs and tests/test_hardening_load.py runs with fewer requests
(issue 47 item 3): clients, each with the official `openai` client, mixing streamed chat, tool calls, `json_schema`
answers, chat log-probabilities and completions with log-probabilities, every answer checked whole.

What counts as whole and valid: a stream ends with one chunk carrying its finish reason and then usage; a tool call
names the tool and its arguments parse and name a city of the tool's enum; a `json_schema` answer parses and holds
to the schema; log-probabilities have one entry per token (chat: 5 alternatives each, whose bytes make the answer).
Anything else is an error; the only error a client may get is the 503 of a full queue (docs/serve.md).

The server is spectool_lab.helpers.Server on the tiny Hermes-template model (spectool_lab.tinymodels) with
SERVER_ARGS: one thread and --lookup-corpus-size 2000, so that a warm-up of the same mix fills the corpus to its
bound and what grows after it would be a leak, not the corpus filling up.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

CITIES = ["Paris", "Lyon", "Rome"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                   "required": ["city"], "additionalProperties": False}}}
CHOICE = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
          "required": ["colour", "ok"], "additionalProperties": False}
WORDS = "fox dog cat bird tree river stone cloud lamp door bread salt rain wind road ship".split()
# one thread: the tiny model needs no second, and it leaves the other core to the clients (on a 2-core machine
# llama.cpp's two threads wait on each other's turn of the CPU while 16 clients keep it busy)
SERVER_ARGS = ("-c", "2048", "-t", "1", "--lookup-corpus-size", "2000")
KINDS = ("stream", "tools", "schema", "logprobs", "completion")


def prompt(i: int) -> str:
    """A different prompt for each request, with text that earlier ones share (the corpus and the KV cache)."""
    return f"Tell me about the {WORDS[i % len(WORDS)]} and the {WORDS[(i * 7 + 3) % len(WORDS)]}, number {i}."


def stream_chat(c, i: int) -> None:
    chunks = list(c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt(i)}], max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    ends = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(ends in (["stop"], ["length"]) and chunks[-1].usage is not None, "a stream without its last chunk")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(ends == ["stop"] or bool(text), "an empty stream cut at its length")


def tools(c, i: int) -> None:
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Weather? {prompt(i)}"}],
                                  tools=[WEATHER], tool_choice="required", max_tokens=160, temperature=0)
    choice = r.choices[0]
    check(choice.finish_reason == "tool_calls" and bool(choice.message.tool_calls), f"no tool call: {choice}")
    for call in choice.message.tool_calls or ():
        check(call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in CITIES,
              f"a tool call off its schema: {call}")


def schema(c, i: int) -> None:
    r = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt(i)}], max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": CHOICE, "strict": True}})
    answer = json.loads(r.choices[0].message.content or "")
    check(r.choices[0].finish_reason == "stop" and set(answer) == {"colour", "ok"}
          and answer["colour"] in ("red", "green", "blue") and isinstance(answer["ok"], bool),
          f"an answer off its schema: {answer}")


def logprobs(c, i: int) -> None:
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt(i)}], max_tokens=24,
                                  temperature=0, logprobs=True, top_logprobs=5)
    entries = r.choices[0].logprobs.content
    check(len(entries) == r.usage.completion_tokens and all(len(e.top_logprobs) == 5 for e in entries),
          "log-probabilities missing")
    check(b"".join(bytes(e.bytes) for e in entries).decode(errors="replace") == r.choices[0].message.content,
          "log-probabilities that do not make the answer")


def completion(c, i: int) -> None:
    r = c.completions.create(model="m", prompt=prompt(i), max_tokens=24, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    check(r.choices[0].finish_reason in ("stop", "length") and len(lp.tokens) == r.usage.completion_tokens
          and all(lp.top_logprobs), "a completion's log-probabilities missing")  # (texts may coincide)


ASK = dict(zip(KINDS, (stream_chat, tools, schema, logprobs, completion)))


class Invalid(Exception):
    """An answer that came back 200 but is not whole or not valid."""


def check(ok: bool, what: str) -> None:
    if not ok:
        raise Invalid(what)


@dataclass
class Load:
    """What a load run saw: each request's outcome ("200", an error's status, "no answer: ..." or "invalid"; the
    invalid ones' reasons in `invalid`), and /health's latencies in seconds."""
    outcomes: Counter = field(default_factory=Counter)
    invalid: list[str] = field(default_factory=list)
    health: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def p95(self) -> float:
        got = sorted(self.health)
        return got[min(len(got) - 1, int(0.95 * len(got)))] if got else float("nan")


def one(c, i: int) -> str:
    """Request `i` of the mix: "200", an error's status, "no answer: ..." or "invalid: ..."."""
    import openai

    try:
        ASK[KINDS[i % len(KINDS)]](c, i)
        return "200"
    except openai.APIStatusError as e:
        return str(e.status_code)
    except openai.APIConnectionError as e:  # a connection closed or timed out: no answer at all
        return f"no answer: {type(e).__name__}"
    except Exception as e:  # noqa: BLE001 - an answer that is not whole or not valid (Invalid, or fields missing)
        return f"invalid: {KINDS[i % len(KINDS)]}: {type(e).__name__}: {e}"[:300]


def poll_health(port: int, until: threading.Event, into: list[float]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while not until.is_set():
        t0 = time.perf_counter()
        conn.request("GET", "/health")
        r = conn.getresponse()
        r.read()
        if r.status == 200:
            into.append(time.perf_counter() - t0)
        time.sleep(0.05)
    conn.close()


def run_load(url: str, port: int, requests: int, clients: int, start: int = 0) -> Load:
    """`requests` requests of the mix (numbered from `start`) from `clients` threads, each its own openai client,
    /health asked every 50 ms meanwhile."""
    import openai

    out, done = Load(), threading.Event()
    pool = [openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300) for _ in range(clients)]
    poller = threading.Thread(target=poll_health, args=(port, done, out.health), daemon=True)
    poller.start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        results = list(ex.map(lambda i: one(pool[i % clients], i), range(start, start + requests)))
    out.seconds = time.perf_counter() - t0
    done.set()
    poller.join()
    for r in results:
        out.outcomes["invalid" if r.startswith("invalid") else r] += 1
        if r.startswith("invalid"):
            out.invalid.append(r)
    return out


def vm_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def settled_rss_mb(pid: int) -> float:
    """The server's resident memory once it is idle (a moment for the last answers' buffers to go)."""
    time.sleep(1.0)
    return vm_rss_mb(pid)
