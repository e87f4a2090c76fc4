"""The chat page at `/` (server/page/: plain HTML, CSS and JavaScript, no build step, nothing
fetched from another host): its files, each answered with a Content-Security-Policy that runs only
the page's own script and style, and lets it talk only to this server. `--no-webui`: no page, and
`/` is a 404 as any unknown path."""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response

# the page's files: path -> (file under page/, media type)
FILES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/webui/app.js": ("app.js", "text/javascript; charset=utf-8"),
         "/webui/style.css": ("style.css", "text/css; charset=utf-8")}
# no inline script or style, no other host: model output can never run as the page's code
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def read(name: str) -> bytes:
    return (files("spectool.server") / "page" / name).read_bytes()


async def page(request: Request) -> Response:
    """One of the page's files (read from the package each time: small, and edits show at once)."""
    name, kind = FILES[request.url.path]
    return Response(read(name), media_type=kind, headers=HEADERS)
