"""What a web page may make the server do: nothing, unless it is the server's own page or one the
user allows. A page whose name rebinds to 127.0.0.1 (DNS rebinding) sends its own name as `Host`,
so a Host that is not this server's is a 403, as ollama's host check answers it; a page on another
site sends its `Origin`, so a request from an origin not allowed is a 403, as ollama's
OLLAMA_ORIGINS check; and its "simple" POST (text/plain, a form, no type at all), which needs no
CORS preflight, is a 415: every POST takes only `application/json`. Clients that are not browsers
send no Origin and name the address they reach. Each refusal comes before the body is read, in its
API's error shape.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from spectool.options import UserError
from spectool.server.errors import ApiError
from spectool.server.messages import error_body

WILDCARDS = ("0.0.0.0", "::", "")  # a --host that listens on every address


def host_name(value: str) -> str | None:
    """The name in a Host header or an origin's authority (`name:port`, `[::1]:port`), lowercase,
    without a trailing dot; None when there is none."""
    try:
        name = urlsplit("//" + value.strip()).hostname
    except ValueError:
        return None
    return name.rstrip(".") or None if name else None


def address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def split(value: str | None) -> list[str]:
    return [v.strip().lower() for v in (value or "").split(",") if v.strip()]


def origin_of(value: str, flag: str = "--cors-origins") -> str:
    """An origin as browsers send it (`scheme://host[:port]`, lowercase, no path), else a
    UserError."""
    if value.strip() == "*":
        return "*"
    parts = urlsplit(value.strip().lower().rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path:
        raise UserError(f"{flag} {value}: not an origin (scheme://host[:port], as a browser "
                        "sends it)", code=2)
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class Guard:
    """The names a request's Host may give, and the origins a page may call from."""

    # besides loopback's: --host's (0.0.0.0 or ::: the machine's name), --allowed-hosts' ("*": any;
    # ".x": x's)
    names: frozenset[str]
    any_address: bool  # --host 0.0.0.0 or ::: any IP address (a rebinding names a host)
    origins: frozenset[str]  # the server's own pages' and --cors-origins' ("*": any)

    @classmethod
    def of(cls, host: str, port: int | None, allowed_hosts: str | None = None,
           cors_origins: str | None = None) -> Guard:
        """The guard of a server on `host`:`port`, with the options' names and origins."""
        served = host.strip().strip("[]").lower().rstrip(".")
        own = {f"http://{f'[{n}]' if ':' in n else n}:{port}" for n in
               ("localhost", "127.0.0.1", "::1", served) if port is not None and n not in WILDCARDS}
        names = {served} | ({socket.gethostname().lower()} if host in WILDCARDS else set())
        return cls(frozenset(split(allowed_hosts)) | names, host in WILDCARDS,
                   frozenset(own | {origin_of(o) for o in split(cors_origins)}))

    def allows_host(self, name: str | None) -> bool:
        ip = address(name or "")
        return name is not None and (
            "*" in self.names or name == "localhost" or name.endswith(".localhost")
            or (ip is not None and (ip.is_loopback or self.any_address))
            or any(name == n.lstrip(".") or (n.startswith(".") and name.endswith(n))
                   for n in self.names))

    def allows_origin(self, origin: str, host: str | None) -> bool:
        """A page's origin: the server's own (the one the request reaches, or a loopback name on
        its port), or one --cors-origins names."""
        origin = origin.strip().lower().rstrip("/")
        parts = urlsplit(origin)
        same = host is not None and parts.netloc == host.strip().lower()
        return "*" in self.origins or origin in self.origins or (
            same and parts.scheme in ("http", "https"))

    def refusal(self, method: str, headers) -> ApiError | None:
        """Why a request is refused (a 403 or a 415), or None."""
        host = headers.get("host")
        if host is not None and not self.allows_host(host_name(host)):
            return ApiError(403, f"the Host header names {host[:100]!r}, not this server (serve "
                                 "--allowed-hosts adds names)", code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not self.allows_origin(origin, host):
            return ApiError(403, f"requests from {origin[:100]!r} are not allowed (serve "
                                 "--cors-origins adds origins)", code="origin_not_allowed")
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        if method == "POST" and kind != "application/json":
            return ApiError(415, "send the body as JSON, with 'Content-Type: application/json'",
                            code="unsupported_media_type")
        return None


class Guarded:
    """The ASGI application `app` behind `guard`: a refused request is answered here."""

    def __init__(self, app, guard: Guard):
        self.app, self.guard = app, guard

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            from starlette.datastructures import Headers
            from starlette.responses import JSONResponse

            refused = self.guard.refusal(scope["method"], Headers(scope=scope))
            if refused is not None:
                shape = error_body if scope["path"].startswith("/v1/messages") else ApiError.body
                await JSONResponse(shape(refused), status_code=refused.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)
