"""What the tests share: spectool run as a real process, waiting for a server to come up, stopping it, the
addresses it must refuse, and the tokens of a generation."""

import signal
import socket
import subprocess
import sys
import time
from typing import Callable

SPECTOOL = [sys.executable, "-m", "spectool"]


def spectool(*args, env=None, timeout=180, input=None, text=True) -> subprocess.CompletedProcess:
    """`spectool ARGS` in a process of its own, stdin closed unless `input` is given (so it never asks)."""
    return subprocess.run([*SPECTOOL, *map(str, args)], capture_output=True, text=text, env=env, timeout=timeout,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL)


def start(args, env=None) -> subprocess.Popen:
    return subprocess.Popen([*SPECTOOL, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


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
    """Every token a speculative.Generation produces for `prompt`."""
    from spectool.core.speculative import speculative_generate

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
    from spectool.session import build_drafter

    return {m.value: (lambda m=m: build_drafter(m, draft_model)[0]) for m in (Mode.lookup, Mode.draft, Mode.hybrid)}
