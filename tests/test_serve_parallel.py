"""`spectool serve --parallel N` (server/batching.py) as a real server process, with the official
`openai` client: requests generated together give each the text the one-sequence server gives, a
second stream starts while the first still runs (the one-sequence server queues it), and what a
batch cannot draft with is refused before anything loads. A request's own drafting (`speculative`)
on either server; GET /slots and /metrics with each slot's own state; a dropped stream's slot free
at the next step; the memory for N sequences named, and checked before loading; a resent
conversation back on the slot that holds its prefix."""

import http.client
import json
import threading
import time

import pytest
from spectool_lab.helpers import Server, spectool

PROMPTS = ["The quick brown fox", "def add(a, b):\n    return a + b\n\ndef greet(name):",
           "Speculative decoding lets a small draft model", "for i in range(10):\n"]
RECORD = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture(scope="module")
def servers(tiny):
    # (each of the four sequences holds 4096 tokens, as the one-sequence server's context). Both
    # draft at least a token a step where lookup offers one (--draft-min 1): on the tiny model a
    # batch of 2 costs several of 1, so whether the timed controller drafts at all turns on how busy
    # the machine is, and the tests below count drafts (the full suite once drafted none here)
    spec = ("--draft-min", "1")
    one = Server(tiny["target"], "-c", "4096", *spec)
    four = Server(tiny["target"], "-c", "16384", "--parallel", "4", *spec)
    yield one, four
    one.stop()
    four.stop()


def complete(server, i, out, **kw):
    out[i] = server.client().completions.create(model="tiny", prompt=PROMPTS[i % 4], **kw)


def test_requests_together_answer_as_one_at_a_time(servers):
    """Four greedy completions at once, one under a JSON schema: each text and finish reason is
    the one-sequence server's."""
    one, four = servers
    kw = [dict(max_tokens=40 + 10 * i, temperature=0) for i in range(4)]
    kw[2]["extra_body"] = {"json_schema": RECORD}
    alone: list = [None] * 4
    for i in range(4):
        complete(one, i, alone, **kw[i])
    together: list = [None] * 4
    threads = [threading.Thread(target=complete, args=(four, i, together), kwargs=kw[i])
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [(r.choices[0].text, r.choices[0].finish_reason) for r in together] == \
        [(r.choices[0].text, r.choices[0].finish_reason) for r in alone]
    assert together[2].choices[0].text.startswith('{"name"')  # the schema held
    assert len({r.choices[0].text for r in together}) == 4


def overlap(server) -> bool:
    """Whether a second stream's first text comes well before a long first stream's last: by more
    than a quarter of the first's time (a queued second may read its first text a moment before
    the thread reading the first stream is scheduled to see its end)."""
    first_done: list[float] = []
    started = time.monotonic()
    c = server.client()
    a = c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=900, temperature=0,
                             stream=True)
    chunks = iter(a)
    next(chunks)

    def drain():
        for _ in chunks:
            pass
        first_done.append(time.monotonic())

    reader = threading.Thread(target=drain)
    reader.start()
    b = c.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=4, stream=True)
    next(ch for ch in b if ch.choices and ch.choices[0].text)
    second_started = time.monotonic()
    reader.join(timeout=300)
    return first_done[0] - second_started > 0.25 * (first_done[0] - started)


def test_a_second_stream_starts_while_the_first_runs(servers):
    one, four = servers
    assert overlap(four)
    assert not overlap(one)  # the one-sequence server queues it


def test_what_a_batch_cannot_draft_with_is_refused_before_loading(tiny):
    out = spectool("serve", "-m", tiny["target"], "-md", tiny["draft"], "--spec", "draft",
                   "--parallel", "2", timeout=120)
    assert out.returncode == 2 and "--parallel above 1 drafts by prompt lookup only" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# greedy, the tiny model loops on this prompt without an end-of-generation token: lookup drafts
# long runs of it, and 4000 tokens undrafted take seconds
LOOP = "the dog the fox the dog the fox the dog the"


def test_a_request_sets_its_own_drafting(servers):
    """`"speculative": false` drafts nothing, `{"n_max": 1}` at most one token a step (llama-server's
    older flat `speculative.n_max` too), on the one-sequence server and in a batch alike; the text
    is the same greedy text. Other shapes are a 400 naming the field; `n_min` is ignored, counted."""
    for server in servers:
        c = server.client()

        def ask(**extra):
            return c.completions.create(model="tiny", prompt=LOOP, max_tokens=200, temperature=0,
                                        extra_body=extra)

        default, off, one, flat = (ask(), ask(speculative=False), ask(speculative={"n_max": 1}),
                                   ask(**{"speculative.n_max": 0}))
        assert {r.choices[0].text for r in (off, one, flat)} == {default.choices[0].text}
        spec = [r.usage.model_extra["speculative"] for r in (default, off, one, flat)]
        assert spec[1]["drafted"] == spec[3]["drafted"] == 0
        # a step makes its accepted drafts and one token, bar the last (cut by the budget): with at
        # most one draft a step, there are at most completion - accepted + 2 steps, as many drafts
        steps = one.usage.completion_tokens - spec[2]["accepted"] + 2
        # (uncapped, the same request drafted 206 against a bound of 22; the server's own adaptive
        # drafting is no yardstick: on a busy machine its timed costs may find fewer drafts worth it)
        assert 0 < spec[2]["drafted"] <= steps
        for body, param in [({"speculative": "no"}, "speculative"),
                            ({"speculative": {"n_max": -1}}, "speculative.n_max"),
                            ({"speculative": {"n_max": 1.5}}, "speculative.n_max"),
                            ({"speculative": {"type": "ngram"}}, "speculative.type"),
                            ({"speculative": False, "speculative.n_max": 2}, "speculative.n_max")]:
            status, answer = server.request("POST", "/v1/completions",
                                            {"prompt": "hi", "max_tokens": 2, **body})
            assert status == 400 and json.loads(answer)["error"]["param"] == param, answer
        status, _ = server.request("POST", "/v1/completions", {
            "prompt": "hi", "max_tokens": 2, "speculative": {"n_max": 2, "n_min": 1}})
        assert status == 200
        assert metrics(server)['spectool_ignored_fields_total{api="completions",'
                               'field="speculative.n_min"}'] == 1


def opened(server, **body) -> http.client.HTTPConnection:
    """A streamed completion of LOOP on a connection of its own, read up to its first text."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps(
        {"prompt": LOOP, "temperature": 0, "stream": True, **body}),
        {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    while line := r.readline():
        if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
            return conn
    raise AssertionError("the stream ended before its first text")


def get(server, path):
    status, body = server.request("GET", path)
    assert status == 200
    return json.loads(body)


def metrics(server) -> dict[str, float]:
    _, text = server.request("GET", "/metrics")
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def idle(server) -> list[dict]:
    """GET /slots once no slot is processing (a dropped stream ends within a step of 0.25 s)."""
    deadline = time.monotonic() + 60
    while True:
        slots = get(server, "/slots")
        if not any(s["is_processing"] for s in slots):
            return slots
        assert time.monotonic() < deadline, slots
        time.sleep(0.05)


def test_slots_lists_each_sequence_with_its_own_state(servers):
    """Two streams at once, one undrafted: GET /slots lists the four slots, the two busy ones each
    with its own task, counts and drafting."""
    _, four = servers
    idle(four)
    plain, drafting = opened(four, max_tokens=3000, speculative=False), opened(four, max_tokens=3000)
    try:
        deadline = time.monotonic() + 30
        while True:
            slots = get(four, "/slots")
            busy = sorted((s for s in slots if s["is_processing"]), key=lambda s: s["id_task"])
            if len(busy) < 2 or busy[1]["draft_n_accepted"] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert [s["id"] for s in slots] == [0, 1, 2, 3] and {s["n_ctx"] for s in slots} == {4096}
        assert len(busy) == 2 and busy[0]["id_task"] < busy[1]["id_task"]
        p, d = busy  # the undrafted one came first
        assert p["speculative"] is False and p["params"]["speculative.n_max"] == 0
        assert p["draft_n"] == p["draft_n_accepted"] == 0
        assert d["speculative"] is True and d["params"]["speculative.n_max"] > 0
        assert d["draft_n"] >= d["draft_n_accepted"] > 0
        assert all(s["next_token"][0]["n_decoded"] > 0 for s in busy)
        assert all(s["next_token"][0]["has_next_token"] for s in busy)
    finally:
        plain.close()
        drafting.close()
    (ended,) = [s for s in idle(four) if s.get("id_task") == p["id_task"]]
    assert ended["next_token"][0]["n_decoded"] < 3000  # cut short where its client left


def test_a_dropped_stream_frees_its_slot_at_the_next_step(servers):
    """A stream dropped after its first text: its generation ends at the next step (short of its
    budget), and four new streams all start at once, the dropped one's slot among them."""
    _, four = servers
    idle(four)
    before = metrics(four)
    opened(four, max_tokens=4000, speculative=False).close()
    conns = [opened(four, max_tokens=4000, speculative=False) for _ in range(4)]
    try:
        assert all(s["is_processing"] for s in get(four, "/slots"))
        deadline = time.monotonic() + 10
        while (m := metrics(four))["spectool_requests_cancelled_total"] == \
                before["spectool_requests_cancelled_total"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert m["spectool_requests_cancelled_total"] == before["spectool_requests_cancelled_total"] + 1
        # (the four are still running: only the dropped one is counted, short of its 4000 tokens)
        assert 0 < m["spectool_completion_tokens_total"] - before["spectool_completion_tokens_total"] < 4000
    finally:
        for conn in conns:
            conn.close()
    idle(four)


def test_metrics_give_each_slot_and_the_batch(servers):
    """/metrics: the slots and how many are busy, each slot's generated, drafted and accepted tokens
    (summing to the server's), and the batch's steps, rows and sequences; one slot and no batch on
    the one-sequence server."""
    one, four = servers
    idle(four)
    before = metrics(four)
    conns = [opened(four, max_tokens=3000), opened(four, max_tokens=3000)]
    try:
        during = metrics(four)
    finally:
        for conn in conns:
            conn.close()
    assert during["spectool_slots"] == 4 and during["spectool_slots_busy"] == 2
    assert sum(during[f'spectool_slot_busy{{slot="{i}"}}'] for i in range(4)) == 2
    idle(four)
    after = metrics(four)

    def grew(name):
        return after[name] - before[name]

    def per_slot(name):
        return sum(grew(f'spectool_slot_{name}_total{{slot="{i}"}}') for i in range(4))

    deadline = time.monotonic() + 10  # (a generation's totals are counted just after its slot frees)
    while per_slot("completion_tokens") != grew("spectool_completion_tokens_total") and \
            time.monotonic() < deadline:
        time.sleep(0.05)
        after = metrics(four)
    assert after["spectool_slots_busy"] == 0
    for name in ("completion_tokens", "drafted_tokens", "accepted_tokens"):
        assert per_slot(name) == grew(f"spectool_{name}_total") > 0, name
    steps, rows, seqs = (grew(f"spectool_batch_{n}_total") for n in ("steps", "rows", "sequences"))
    assert 0 < steps <= seqs <= 2 * steps and seqs <= rows
    m = metrics(one)
    assert m["spectool_slots"] == 1 and m['spectool_slot_busy{slot="0"}'] == 0
    assert not any(name.startswith("spectool_batch_") for name in m)


def test_the_memory_for_n_sequences_is_named_and_checked_before_loading(tiny):
    """A KV cache for 4 sequences that no memory holds (-c 10^9: the tiny model's 384 bytes a token,
    366 GiB): one line before the weights load, naming the sequences; one that fits is named on
    the start line, -c 0 giving each sequence the model's trained context."""
    out = spectool("serve", "-m", tiny["target"], "-c", "1000000000", "--parallel", "4", "-ngl", "0",
                   timeout=120)
    assert out.returncode == 1 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: 4 sequences of 250000000 tokens (-c 1000000000, --parallel 4) "
                           "need a KV cache of 366210 MiB in RAM for target.gguf"), line
    assert line.endswith("try a smaller -c or --parallel"), line
    s = Server(tiny["target"], "-c", "0", "--parallel", "2")
    try:
        assert get(s, "/props")["total_slots"] == 2
        assert [slot["n_ctx"] for slot in get(s, "/slots")] == [2048, 2048]  # trained: 2048
    finally:
        _, err = s.stop()
    assert "2 sequences of 2048 tokens each, a KV cache of 1 MiB in all" in err, err


COLOURS = [{"role": "system", "content": "You answer about colours."},
           {"role": "user", "content": "Name a colour."}]
CODE = [{"role": "user", "content": "def add(a, b):\n    return a + b\n\nWhat does it do?"}]


def then(messages, reply, user):
    """A conversation resent with its answer and one more turn, as an agent resends it."""
    return [*messages, {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": user}]


def conversations(server, parallel: bool):
    """Two conversations, one after the other, then the second resent with one more turn, then the
    first resent as a long stream, the second again while that stream runs: each reply, the
    stream's first texts, and /slots after the second's resent turn and during the stream."""
    c = server.client()

    def ask(messages, **kw):
        return c.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                         max_tokens=kw.pop("max_tokens", 16), **kw)

    a1, b1 = ask(COLOURS), ask(CODE)
    b2 = ask(code2 := then(CODE, b1, "Another one?"))
    after_b2 = get(server, "/slots") if parallel else None
    # (the one-sequence server queues the second behind the stream: it reads the stream first)
    stream = ask(then(COLOURS, a1, LOOP), max_tokens=1000 if parallel else 60, stream=True,
                 extra_body={"speculative": False})
    chunks = iter(stream)
    first = next(ch for ch in chunks if ch.choices and ch.choices[0].delta.content)
    text = [first.choices[0].delta.content]
    text += [ch.choices[0].delta.content or "" for ch, _ in zip(chunks, range(20 if parallel
                                                                              else 10**6))
             if ch.choices]
    b3 = ask(then(code2, b2, "One more?"))
    during = get(server, "/slots") if parallel else None
    stream.close()
    return [a1, b1, b2, b3], "".join(text), after_b2, during


def test_a_resent_conversation_lands_on_the_slot_holding_its_prefix(servers, tiny):
    """--parallel 2: two conversations take a slot each; the second resent with one more turn goes
    back to its own slot (the least recently used slot and the lowest id are the first's) and
    prefills only the new turn, as does the first resent while the second's runs on the other slot
    and the second resent again beside it; every greedy text is the one-sequence server's."""
    one, _ = servers
    two = Server(tiny["target"], "-c", "8192", "--parallel", "2")
    try:
        (a1, b1, b2, b3), streamed, after_b2, during = conversations(two, True)
    finally:
        two.stop()
    alone, whole, _, _ = conversations(one, False)
    assert [r.choices[0].message.content for r in (a1, b1, b2, b3)] == \
        [r.choices[0].message.content for r in alone]
    assert whole.startswith(streamed)

    def cached(r):
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached(a1) == cached(b1) == 0
    assert cached(b1) < 5 and cached(b2) >= b1.usage.prompt_tokens - 1, b2.usage
    assert cached(b3) >= b2.usage.prompt_tokens - 1, b3.usage
    # /slots: slot 0 holds the colours, slot 1 the code; each slot's cached prompt tokens
    assert [s["n_prompt_tokens"] for s in after_b2] == [a1.usage.prompt_tokens,
                                                        b2.usage.prompt_tokens]
    assert after_b2[1]["n_prompt_tokens_cache"] >= b1.usage.prompt_tokens
    assert during[0]["is_processing"] and during[0]["n_prompt_tokens_cache"] >= \
        a1.usage.prompt_tokens
    assert during[1]["n_prompt_tokens"] == b3.usage.prompt_tokens


def test_a_unified_kv_cache_lets_a_sequence_hold_the_whole_context(tiny, servers):
    """--kv-unified (llama-server's -kvu): with -c 1024 --parallel 2 a prompt of about 700 tokens, over a
    sequence's 512 otherwise, is answered, as the one-sequence server answers it; without it, it is the
    context's 400."""
    one, _ = servers
    prompt = "the dog the fox " * 175
    kw = dict(model="tiny", prompt=prompt, max_tokens=16, temperature=0)
    alone = one.client().completions.create(**kw).choices[0].text
    split = Server(tiny["target"], "-c", "1024", "--parallel", "2")
    unified = Server(tiny["target"], "-c", "1024", "--parallel", "2", "--kv-unified")
    try:
        assert split.request("POST", "/v1/completions", kw)[0] == 400
        assert unified.client().completions.create(**kw).choices[0].text == alone
    finally:
        split.stop()
        unified.stop()


def test_the_batch_s_cost_table_is_kept_for_the_next_server(tiny, tmp_path):
    """What a `--parallel 2` server measured of decodes of two sequences is saved with its cost
    table when it stops, and read back as the next run reads it (`spectool info` names it)."""
    import os

    env = {**os.environ, "SPECTOOL_CACHE": str(tmp_path)}
    server = Server(tiny["target"], "-c", "2048", "--parallel", "2", env=env)
    out: list = [None] * 4  # (indexed by the prompts 1 and 3)
    threads = [threading.Thread(target=complete, args=(server, i, out),
                                kwargs=dict(max_tokens=200, temperature=0)) for i in (1, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    server.stop()
    saved = json.loads(next((tmp_path / "costs").glob("*.json")).read_text())
    assert set(saved["shapes"]) == {"2"} and saved["shapes"]["2"]["verify"]
    info = spectool("info", env=env)
    assert "sizes of 2 sequences at once" in info.stdout, info.stdout
