"""llama-server's GET /props and GET /slots through a real `spectool serve` started with its own defaults (no -c:
the model's trained context), in llama-server's shapes as its own tests read them (tools/server/tests/unit/
test_basic.py: model_path, total_slots, default_generation_settings' n_ctx and seed; a slot that has run nothing
has no params), and as they change: the last task's counts and settings, a slot busy while it generates
(`?fail_on_no_slot=1` then a 503), the key asked for where the server has one."""

import json
import os
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from spectool_lab.helpers import Server, free_port, start, stop, wait_until_up

from spectool.server.slots import LLAMA_DEFAULT_SEED


class Defaults(Server):
    """`spectool serve -m MODEL` with serve's own defaults (helpers.Server sets -c)."""

    def __init__(self, model, *args):
        self.port = free_port()
        self.proc = start(["serve", "-m", model, "-t", "2", "--port", self.port, *args], env=dict(os.environ))
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until_up(self.proc, lambda: bool(urllib.request.urlopen(self.url + "/health", timeout=1)), "server")


@pytest.fixture(scope="module")
def server(tiny):
    s = Defaults(tiny["target"], "--no-lookup-corpus")
    yield s
    stop(s.proc)


def get(server, path):
    status, body = server.request("GET", path)
    return status, json.loads(body)


def test_props_are_llama_servers_with_the_trained_context(server):
    status, props = get(server, "/props")
    assert status == 200 and props["model_path"].endswith(".gguf") and props["total_slots"] == 1
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 2048  # the tiny model's trained context: serve's default, memory allowing
    params = settings["params"]
    assert params["seed"] == LLAMA_DEFAULT_SEED and params["temperature"] == 0.0 and params["top_k"] == 40
    assert params["samplers"] == ["penalties", "top_k", "top_p", "min_p", "temperature"]
    assert params["n_predict"] == params["max_tokens"] == 256 and params["speculative.types"] == "lookup"
    assert props["chat_template"] and props["build_info"].startswith("spectool ") and props["is_sleeping"] is False
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}


def test_a_slot_says_what_it_ran_last(server):
    status, slots = get(server, "/slots")
    assert status == 200 and len(slots) == 1 and slots[0]["n_ctx"] == 2048 and slots[0]["is_processing"] is False
    assert "params" not in slots[0]  # nothing run yet, as llama-server's test reads it
    r = server.client().chat.completions.create(model="any", max_tokens=5, seed=7, temperature=0.5,
                                                messages=[{"role": "user", "content": "Say something."}])
    (slot,) = get(server, "/slots")[1]
    assert slot["is_processing"] is False and slot["n_prompt_tokens"] == r.usage.prompt_tokens
    assert slot["next_token"][0]["n_decoded"] == r.usage.completion_tokens == 5
    assert slot["next_token"][0]["n_remain"] == 0 and slot["next_token"][0]["has_next_token"] is False
    assert (slot["params"]["seed"], slot["params"]["temperature"], slot["params"]["n_predict"]) == (7, 0.5, 5)
    assert slot["n_prompt_tokens_processed"] + slot["n_prompt_tokens_cache"] == r.usage.prompt_tokens
    assert get(server, "/slots?fail_on_no_slot=1")[0] == 200


def test_a_busy_slot_is_processing_and_fail_on_no_slot_is_a_503(server):
    long = " ".join(f"word{i}" for i in range(300))  # (a prefill long enough to be seen at)
    done, answers = threading.Event(), []

    def generate():
        try:
            answers.append(server.client().chat.completions.create(model="any", max_tokens=64, messages=[
                {"role": "user", "content": long}]))
        finally:
            done.set()

    thread = threading.Thread(target=generate)
    thread.start()
    seen = None
    while not done.is_set() and seen is None:
        status, slots = get(server, "/slots?fail_on_no_slot=1")
        seen = (status, slots) if status == 503 else None
        time.sleep(0.01)
    thread.join()
    assert answers and seen is not None and seen[1]["error"]["message"] == "no slot available"
    assert get(server, "/slots")[1][0]["is_processing"] is False


def test_props_and_slots_need_the_key_where_there_is_one(tiny):
    s = Server(tiny["target"], "--api-key", "s3cret")
    try:
        assert s.request("GET", "/props")[0] == 401 and s.request("GET", "/slots")[0] == 401
        assert s.request("GET", "/props", headers={"Authorization": "Bearer s3cret"})[0] == 200
    finally:
        s.stop()


def test_draft_trees_serve_the_same_text_and_are_counted(server, tiny):
    """`serve --draft-tree 4`: the model's trained context for its one sequence (the leaves' sequences share it); the
    same greedy text as the server without trees; the response's usage, the slot and /metrics count the trees
    alike."""
    trees = Defaults(tiny["target"], "--no-lookup-corpus", "--draft-tree", "4")
    try:
        assert get(trees, "/props")[1]["default_generation_settings"]["n_ctx"] == 2048
        ask = dict(model="any", max_tokens=30, temperature=0.0,
                   prompt="the dog the fox the dog the fox the dog the fox the dog the")
        r = trees.client().completions.create(**ask)
        assert r.choices[0].text == server.client().completions.create(**ask).choices[0].text
        tree = r.usage.model_extra["speculative"]["tree"]
        (slot,) = get(trees, "/slots")[1]
        assert slot["draft_tree"] == tree and set(tree) == {"steps", "branches", "taken"}
        metrics = urllib.request.urlopen(trees.url + "/metrics", timeout=5).read().decode()
        assert f"spectool_tree_steps_total {tree['steps']}" in metrics
        assert f"spectool_tree_branches_total {tree['branches']}" in metrics
    finally:
        stop(trees.proc)


def test_draft_trees_under_parallel_serve_each_client_plain_text(server, tiny):
    """`serve --parallel 2 --draft-tree 4`: two slots (each with a spare sequence for every leaf of its trees, one
    KV buffer, each slot holding its share of it); two clients at once get the greedy texts of the server without trees, and each slot's tree counts
    are its request's, summed in /metrics; a request under a grammar beside a free one gets the constrained text of the
    server without trees (whether a step drafts a tree is the controller's call on this machine's
    costs: test_tree.py's batch tests price rows free to make every step one)."""
    trees = Defaults(tiny["target"], "--no-lookup-corpus", "--draft-tree", "4", "--parallel", "2")
    prompts = ["the dog the fox the dog the fox the dog the fox the dog the cat the", "def add(a, b):\n    return a + b\n"]
    try:
        props = get(trees, "/props")[1]  # each slot the trained context, as without trees (the buffer holds two)
        assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 2048

        def ask(s, prompt, **kw):
            return s.client().completions.create(model="any", max_tokens=30, temperature=0.0, prompt=prompt, **kw)

        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda p: ask(trees, p), prompts))
        assert [r.choices[0].text for r in got] == [ask(server, p).choices[0].text for p in prompts]
        made = [r.usage.model_extra["speculative"]["tree"] for r in got]
        slots = get(trees, "/slots")[1]
        assert sorted(slot["id"] for slot in slots) == [0, 1]
        assert sorted(map(str, made)) == sorted(str(slot["draft_tree"]) for slot in slots)
        metrics = urllib.request.urlopen(trees.url + "/metrics", timeout=5).read().decode()
        assert f"spectool_tree_steps_total {sum(t['steps'] for t in made)}" in metrics
        # under a grammar (llama-server's field), beside a free request: trees under it, the same constrained text
        record = 'root ::= "{\\"name\\": \\"" [a-z ]{1,10} "\\", \\"n\\": " [0-9]{1,3} "}"'
        under = dict(prompt='{"name": "ann lee", "n": 42} {"name": "bob lee", "n": 7} ', extra_body={"grammar": record})
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda kw: ask(trees, **kw), [under, dict(prompt=prompts[0])]))
        assert got[0].choices[0].text == ask(server, **under).choices[0].text
        assert got[0].choices[0].text.startswith('{"name": "')
    finally:
        stop(trees.proc)
