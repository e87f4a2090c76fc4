"""What the agent clients' tests share (tests/test_clients.py): the clients installed from npm, or from PyPI into
virtual environments of their own, in a cache that runs reuse, and a recording proxy between a client and `spectool serve` that keeps every request's method, path,
body and answer's status."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("SPECTOOL_CLIENTS_CACHE", Path.home() / ".cache" / "spectool-clients"))
NPM = {"claude": "@anthropic-ai/claude-code@2.1.197", "codex": "@openai/codex@0.171.0",
       "opencode": "opencode-ai@1.18.33", "cn": "@continuedev/cli@1.5.47",
       "qwen": "@qwen-code/qwen-code@0.24.4"}  # the versions tested, by command
PYPI = {"aider": "aider-chat==0.86.2", "instructor": "instructor==1.17.0"}  # in venvs of their own: aider pins
# exact versions of its dependencies, instructor caps jiter and rich below what the test extra's openai and rich need


def npm_client(name: str) -> Path:
    """The client's command, installed (once) with npm into the cache; an error where it cannot be."""
    folder = CACHE / "npm" / NPM[name].rsplit("@", 1)[0].replace("/", "+") / NPM[name].rsplit("@", 1)[1]
    binary = folder / "node_modules" / ".bin" / name
    if not binary.exists():
        assert shutil.which("npm"), f"npm is not installed: {NPM[name]} is installed with it (Node.js 20 or later)"
        folder.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(folder), NPM[name]],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and binary.exists(), f"npm install {NPM[name]} failed: {r.stderr[-2000:]}"
    return binary


def pypi_venv(name: str) -> Path:
    """A virtual environment of its own in the cache with the pinned package installed (once); an error where it
    cannot be."""
    folder = CACHE / "pypi" / PYPI[name].replace("==", "+")
    if not (folder / "installed").exists():
        r = subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], capture_output=True, text=True)
        assert r.returncode == 0, f"python -m venv {folder} failed: {r.stderr[-2000:]}"
        r = subprocess.run([folder / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            PYPI[name]], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"pip install {PYPI[name]} failed: {r.stderr[-2000:]}"
        (folder / "installed").touch()
    return folder


@dataclass
class Exchange:
    method: str
    path: str
    body: dict | None
    status: int


class Recorder:
    """A proxy on a free port to the server at `upstream` (http://host:port): each request forwarded, its answer
    streamed back as it comes, and both kept in `exchanges`."""

    def __init__(self, upstream: str):
        host, port = upstream.removeprefix("http://").split(":")
        self.exchanges: list[Exchange] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(host, int(port), timeout=300)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body or None, headers)
                answer = conn.getresponse()
                recorder.exchanges.append(Exchange(self.command, self.path, parsed(body), answer.status))
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                        self.send_header(k, v)
                self.end_headers()  # HTTP/1.0: the body runs to the connection's close
                while self.command != "HEAD" and (chunk := answer.read1(65536)):
                    self.wfile.write(chunk)
                    self.wfile.flush()
                conn.close()

            do_GET = do_POST = do_HEAD = forward

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def posts(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == "POST"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def parsed(body: bytes) -> dict | None:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None
