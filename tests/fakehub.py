"""A small HTTP server on 127.0.0.1 that speaks the Hugging Face Hub's file endpoints, for download tests:
HEAD and GET on /{owner}/{repo}/resolve/{revision}/{file}, with X-Repo-Commit, ETag / X-Linked-Etag,
X-Linked-Size, Content-Length and Range, and the Hub's error codes (X-Error-Code)."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.gated: set[str] = set()
        self.unauthorized: set[str] = set()
        self.cut_once: dict[str, int] = {}  # file -> bytes to send before the first GET's connection drops
        self.slow: set[str] = set()  # files sent in small chunks with pauses (to interrupt a download)
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._serve(self, body=False)

            def do_GET(self):
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo: str, files: dict[str, bytes | Path]) -> None:
        self.repos.setdefault(repo, {}).update(
            {k: (v.read_bytes() if isinstance(v, Path) else v) for k, v in files.items()}
        )

    def gets(self, file: str | None = None) -> list:
        return [e for e in self.log if e[0] == "GET" and (file is None or e[1].endswith("/" + file))]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _error(self, h, status: int, code: str | None):
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("Content-Length", "0")
        h.end_headers()

    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(h.path.split("?")[0])
        self.log.append((h.command, path, h.headers.get("Range")))
        parts = path.strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._error(h, 404, None)
        repo, file = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
        if repo in self.unauthorized:
            return self._error(h, 401, None)
        if repo in self.gated:
            return self._error(h, 403, "GatedRepo")
        if repo not in self.repos:
            return self._error(h, 404, "RepoNotFound")
        data = self.repos[repo].get(file)
        if data is None:
            return self._error(h, 404, "EntryNotFound")
        etag = hashlib.sha256(data).hexdigest()
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0] or 0)
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("ETag", f'"{etag}"')
        h.send_header("X-Linked-Etag", f'"{etag}"')
        h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if not body:
            return
        chunk = data[start:]
        cut = self.cut_once.pop(file, None)
        if cut is not None:  # an interrupted transfer: part of the body, then the connection drops
            h.wfile.write(chunk[:cut])
            h.wfile.flush()
            h.close_connection = True
            return
        if file in self.slow:
            import time

            for i in range(0, len(chunk), 1 << 16):
                h.wfile.write(chunk[i : i + (1 << 16)])
                h.wfile.flush()
                time.sleep(0.05)
            return
        h.wfile.write(chunk)
