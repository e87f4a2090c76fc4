"""What the tests share: spectool run as a real process, waiting for a server to come up, talking to it, stopping
it, the addresses it must refuse, the tokens of a generation, and the drafters the tests run."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Callable

from spectool.core.evidence import DRAFT, Source
from spectool.core.protocol import Draft, Drafter
from spectool.drafters.hybrid import Hybrid

SPECTOOL = [sys.executable, "-m", "spectool"]


def spectool(*args, env=None, timeout=180, input=None, text=True) -> subprocess.CompletedProcess:
    """`spectool ARGS` in a process of its own, stdin closed unless `input` is given (so it never asks)."""
    return subprocess.run([*SPECTOOL, *map(str, args)], capture_output=True, text=text, env=env, timeout=timeout,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL)


def default_signals() -> None:
    """In a child before it runs: Ctrl-C's default action, which a suite started in the background (`cmd &` in a
    script) would otherwise pass on ignored, so that the child never hears the signals the tests send it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args, env=None) -> subprocess.Popen:
    return subprocess.Popen([*SPECTOOL, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=default_signals)


def wait_until_up(proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """Poll `ready()` until it holds; an error with the process's stderr if it exits first or never gets there."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {proc.stderr.read()}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not start")


def accepts(port: int, timeout: float = 1.0) -> bool:
    socket.create_connection(("127.0.0.1", port), timeout=timeout).close()
    return True


def tokens_of(g, prompt, stats=None) -> list[int]:
    """Every token a GenerationConfig produces for `prompt`."""
    from spectool.generate.loop import speculative_generate

    return [t for step in speculative_generate(g, prompt, stats) for t in step.tokens]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> tuple[int, str]:
    """Signal the process and wait for it (killing it after 30 s): (exit status, its stderr)."""
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err


class Server:
    """`spectool serve` on the tiny model in a process of its own, on a free port; up when made."""

    def __init__(self, model, *args, env=None):
        self.port = free_port()
        self.proc = start(["serve", "-m", model, "-c", "1024", "-t", "2", "--port", self.port, *args],
                          env={**os.environ, **(env or {})})
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until_up(self.proc, lambda: bool(urllib.request.urlopen(self.url + "/health", timeout=1)), "server")

    def request(self, method, path, body=None, headers=None, raw=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name) -> float:
        _, text = self.request("GET", "/metrics")
        return float(next(line.split()[1] for line in text.splitlines() if line.startswith(f"spectool_{name} ")))

    def client(self, key="none"):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def stop(self):
        return stop(self.proc)


def other_addresses() -> set[str]:
    """This machine's IPv4 addresses other than loopback: a server bound to 127.0.0.1 must refuse them all."""
    found = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # the address of the default route (sends nothing)
        try:
            s.connect(("192.0.2.1", 9))
            found.add(s.getsockname()[0])
        except OSError:
            pass
    return {a for a in found if not a.startswith("127.") and a != "0.0.0.0"}


def refuses(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=2).close()
        return False
    except OSError:
        return True


def drafters(draft_model) -> dict:
    """A maker of each drafter spectool runs, from the session layer's own factory (the one place drafters are
    made): lookup, the draft model, and hybrid."""
    from spectool.options import Mode
    from spectool.drafters.builder import drafter_for

    return {m.value: (lambda m=m: drafter_for(m, draft_model)[0]) for m in (Mode.lookup, Mode.draft, Mode.hybrid)}


class AlwaysWrong(Drafter):
    """A drafter whose every draft is `token` repeated, a token the target never picks here: each draft is
    rejected at its first token, so the output is plain decoding's only if the rejection is right."""

    def __init__(self, token: int):
        self.token = token

    def start(self, history, constraint=None):
        pass

    def peek(self, history, k_max, estimate=None):
        return [DRAFT] * k_max

    def propose(self, history, k, sampling, rng):
        return Draft([self.token] * k, None, Source.draft)


class SplitHybrid(Hybrid):
    """A hybrid that hands over to its second drafter after lookup's first token of each stretch: every draft of
    two or more tokens mixes lookup's deterministic tokens with the second drafter's (sampled) ones."""

    def peek(self, history, k_max, estimate=None, final=None):
        return super().peek(history, k_max, lambda key: 0.0 if key.pos else 1.0, final)


def poison(table: dict, factor: float, sizes: range) -> dict:
    """A saved cost table (Costs.to_json, this version's or an older one's) with the batches in `sizes` priced
    `factor`x, as a busy minute leaves them."""
    out = json.loads(json.dumps(table))
    for b, entry in out["verify"].items():
        if int(b) in sizes:
            if isinstance(entry, dict):
                entry["seconds"] = [factor * c for c in entry["seconds"]]
            else:
                out["verify"][b] = factor * entry
    return out


def one_run(target, table: dict | None, prompt: list[int], tokens: int, into=None, read=None):
    """One `spectool run --spec lookup`, as between two processes: the saved table read (`read`, default
    Costs.from_json; a fresh table for None), one prompt generated and added to `into` (else a bench.Result of its
    own), the table written: (the table, the Result)."""
    from spectool import bench
    from spectool.core.costs import Costs
    from spectool.core.stats import Stats

    costs = (read or Costs.from_json)(table) if table is not None else Costs()
    st, r = Stats(mode="lookup"), into or bench.Result("lookup")
    g = bench.Contender("lookup", "lookup", 32).generation(target, {}, tokens, costs)
    r.add(st, *bench.timed_generation(g, prompt, st))
    return costs.to_json(), r


def first_divergence_is_a_near_tie(model, prompt, plain, spec, max_gap):
    """Identical outputs pass. Otherwise the first differing position must be a near-tie for the target: the
    two candidate tokens' logits, recomputed by a plain prefill, differ by less than `max_gap`."""
    if plain == spec:
        return True
    j = next(i for i, (a, b) in enumerate(zip(plain, spec)) if a != b)
    model.reset()
    model.eval(prompt + plain[:j])
    logits = model.logits(-1)
    gap = abs(float(logits[plain[j]]) - float(logits[spec[j]]))
    print(f"diverged at {j}: plain {plain[j]} logit {logits[plain[j]]:.5f}, spec {spec[j]} {logits[spec[j]]:.5f}")
    assert gap < max_gap, f"not a near-tie: logit gap {gap:.4f} at position {j}"
    return False


def same_drafts_as_llama_cpp(target, drafter, prompt, theirs, min_steps: int) -> None:
    """The oracle tests' check (test_mtp.py, test_eagle3.py): `drafter` (greedy, 3-token drafts) proposes and has
    accepted what llama-speculative-simple did (`theirs`, llamacpp.draft_mtp's steps), step by step while both
    draft 3 tokens (near the end each tool cuts its last drafts to its own token budget), for at least `min_steps`
    steps with some accepted; both outputs are plain decoding's."""
    from spectool.core.controller import Controller
    from spectool.generate.loop import GenerationConfig, speculative_generate

    plain = tokens_of(GenerationConfig(target, None, max_tokens=60), prompt)
    proposed, propose = [], drafter.propose

    def recording(*args):
        d = propose(*args)
        proposed.append(list(d.tokens))
        return d

    drafter.propose = recording
    steps = list(speculative_generate(GenerationConfig(target, drafter, max_tokens=60, controller=Controller(
        k_max=3, k_min=3, adaptive=False)), prompt))
    ours = [(o, s.accepted) for o, s in zip(proposed, [s for s in steps if s.drafted])]
    n = next((i for i, (t, (o, _)) in enumerate(zip(theirs, ours)) if len(t.draft) < 3 or len(o) < 3),
             min(len(theirs), len(ours)))
    assert n >= min_steps and sum(t.accepted for t in theirs[:n]) > 0, (n, len(theirs), len(ours))
    assert [(t.draft, t.accepted) for t in theirs[:n]] == ours[:n]
    theirs_out = [t for s in theirs for t in s.draft[: s.accepted] + [s.last]]
    assert len(theirs_out) >= 30 and theirs_out == plain[: len(theirs_out)]
    assert [t for s in steps for t in s.tokens] == plain


def serve_drafts_with_head(target, head, mode: str, prompt: str) -> None:
    """The heads' serve tests (test_eagle3.py, test_dflash.py): `spectool serve -md HEAD --spec MODE` answers a
    greedy completion of `prompt` with --spec none's text, its usage saying the head drafted."""
    body = {"model": "any", "prompt": prompt, "max_tokens": 40, "temperature": 0}
    texts = []
    for args in (("--spec", "none"), ("-md", head, "--spec", mode)):
        s = Server(target, "-ngl", "0", *args)
        try:
            status, text = s.request("POST", "/v1/completions", body)
        finally:
            s.stop()
        assert status == 200, text
        reply = json.loads(text)
        texts.append(reply["choices"][0]["text"])
    assert texts[0] == texts[1]
    assert reply["usage"]["speculative"]["mode"] == mode and reply["usage"]["speculative"]["drafted"] > 0
