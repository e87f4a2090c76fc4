"""Helpers for tests that run spectool as a real server process (serve, worker)."""

import signal
import socket
import subprocess


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
