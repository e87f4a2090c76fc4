"""Ctrl-C and SIGTERM: a generation stops between steps and keeps its text; a second signal stops at
once."""

from __future__ import annotations

import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so that cleanup (finally blocks, temporary files) runs."""


def on_sigterm(signum, frame):
    raise Terminated()


class SigintFlag:
    """Ctrl-C (or SIGTERM) sets a flag the loop checks between steps, so no cache is left
    half-updated and the text so far is kept; a second signal raises at once."""

    def __init__(self):
        self.set = False
        self.terminated = False

    def __enter__(self):
        self._old = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handler(self, signum, frame):
        if self.set:
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        self.set = True
        self.terminated = signum == signal.SIGTERM

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)

    def __call__(self) -> bool:
        return self.set

    @property
    def exit_code(self) -> int:
        return 143 if self.terminated else 130
