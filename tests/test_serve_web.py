"""`spectool serve` seen from a web page and from other clients (issue 58 items 3, 4, 5, 11 and 12), on real servers
over HTTP: a Host that is not the server's (DNS rebinding) is a 403, and --host and --allowed-hosts widen it; a
page's Origin is refused unless it is the server's own or --cors-origins names it; every POST takes only JSON;
/metrics sits behind the key, the key's scheme in any case; what /slots, /metrics and the other endpoints about
the server show is what server/slots.py's SHOWN lists, and never another client's grammar, tools, schema, prompt
or field names."""

import http.client
import json
import os
import socket
import urllib.request

import pytest
from spectool_lab.helpers import Server, free_port, start, stop, wait_until_up

from spectool.server.fields import APIS, label
from spectool.server.slots import SHOWN

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
GENERATION = [("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
              ("/v1/messages", {**CHAT, "model": "m"}), ("/v1/responses", {"input": "hi", "max_output_tokens": 2})]
ABOUT = ["/health", "/v1/models", "/props", "/slots", "/metrics"]


@pytest.fixture(scope="module")
def server(tiny):
    s = Server(tiny["target"], "--allowed-hosts", "myhost.lan,.corp.example",
               "--cors-origins", "https://app.example")
    yield s
    _, err = s.stop()
    assert "Traceback" not in err and "error:" not in err, err


def call(port, path, body=None, headers=None, method=None, host="127.0.0.1"):
    """(status, the answer's bytes, the response) of one request on a connection of its own."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    data = json.dumps(body) if isinstance(body, dict) else body
    conn.request(method or ("GET" if body is None else "POST"), path, data, headers or {})
    r = conn.getresponse()
    out = r.read()
    conn.close()
    return r.status, out, r


JSON = {"Content-Type": "application/json"}


def test_a_host_that_is_not_the_servers_is_a_403_on_every_endpoint(server):
    """Item 3: with `Host: evil.example` (a page whose name rebinds to 127.0.0.1) every endpoint answered 200;
    the loopback names, the address served and --allowed-hosts' names (".corp.example": it and its subdomains)
    are served."""
    port = server.port
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil.example",
                 "corp.example.evil", "10.0.0.1"):
        for path, body in [(p, None) for p in ABOUT] + GENERATION:
            status, out, _ = call(port, path, body, {**JSON, "Host": host})
            assert status == 403 and "the Host header" in json.loads(out)["error"]["message"], (host, path, out)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", f"[::1]:{port}", "127.0.0.2",
                 "app.localhost", "myhost.lan", "corp.example", f"a.b.corp.example:{port}"):
        for path in ABOUT:
            assert call(port, path, headers={"Host": host})[0] == 200, (host, path)
    assert call(port, "/v1/completions", GENERATION[1][1], {**JSON, "Host": "myhost.lan"})[0] == 200


def test_host_0_0_0_0_serves_any_address_but_no_other_name(tiny):
    """--host widens the check: on every address, a Host that is an address is this server's (a rebinding
    page names a host, never an address), and so is the machine's name; other names are still refused."""
    s = Server(tiny["target"], "--host", "0.0.0.0", "--api-key", "k")
    try:
        for host, status in (("192.0.2.7:80", 200), ("[2001:db8::1]", 200), (socket.gethostname(), 200),
                             ("evil.example", 403)):
            assert call(s.port, "/v1/models", headers={"Host": host, "Authorization": "Bearer k"})[0] == status
    finally:
        s.stop()


def test_a_page_on_another_origin_is_refused_and_its_own_and_the_allowed_ones_are_served(server):
    """Item 4: a page on another origin made the server generate with a "simple" POST (no preflight); the server's
    own pages (http://127.0.0.1:PORT, http://localhost:PORT: the page at / that is coming) and --cors-origins'
    are served, and the allowed one may read the answer (CORS)."""
    port = server.port
    for origin in ("http://evil.example", "null", f"http://evil.example:{port}", "https://app.example.evil",
                   f"http://127.0.0.1:{port + 1}"):
        for kind in ("text/plain", "application/x-www-form-urlencoded", "application/json"):
            for path, body in GENERATION:
                status, out, _ = call(port, path, body, {"Content-Type": kind, "Origin": origin})
                assert status == 403 and "not allowed" in json.loads(out)["error"]["message"], (origin, path, out)
        # a preflight too
        status, _, _ = call(port, "/v1/chat/completions", method="OPTIONS", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        assert status == 403
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", "https://app.example"):
        status, out, r = call(port, "/v1/completions", GENERATION[1][1], {**JSON, "Origin": origin})
        assert status == 200 and json.loads(out)["choices"], (origin, out)
    status, _, r = call(port, "/v1/models", headers={"Origin": "https://app.example"})
    assert status == 200 and r.getheader("access-control-allow-origin") == "https://app.example"
    status, _, r = call(port, "/v1/chat/completions", method="OPTIONS", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 200 and "POST" in r.getheader("access-control-allow-methods")


def test_every_post_takes_only_json(server):
    """Item 4's last part: a body sent as text/plain, a form, multipart or with no type was parsed and run."""
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        for path, body in GENERATION + [("/tokenize", {"content": "hi"})]:
            status, out, _ = call(server.port, path, body, {"Content-Type": kind} if kind else {})
            assert status == 415 and json.loads(out)["error"], (kind, path, out)
    status, out, _ = call(server.port, "/v1/completions", GENERATION[1][1],
                          {"Content-Type": "Application/JSON; charset=utf-8"})
    assert status == 200
    assert server.client().completions.create(model="m", prompt="hi", max_tokens=2).choices[0].text is not None


def test_metrics_need_the_key_and_its_scheme_is_read_in_any_case(tiny):
    """Items 11 and 12: /metrics answered without the key; "bearer KEY" was a 401 (RFC 7235: the scheme is
    case-insensitive). /health stays open, for probes that hold no key."""
    s = Server(tiny["target"], "--api-key", "sk-1")
    try:
        assert call(s.port, "/metrics")[0] == 401
        assert call(s.port, "/metrics", headers={"Authorization": "Bearer sk-2"})[0] == 401
        assert call(s.port, "/metrics", headers={"x-api-key": "sk-1"})[0] == 200
        for auth in ("Bearer sk-1", "bearer sk-1", "BEARER  sk-1"):
            for path in ("/metrics", "/v1/models", "/slots"):
                assert call(s.port, path, headers={"Authorization": auth})[0] == 200, (auth, path)
        for auth in ("Basic sk-1", "sk-1", "Bearer", "Bearersk-1"):
            assert call(s.port, "/v1/models", headers={"Authorization": auth})[0] == 401, auth
        assert call(s.port, "/health")[0] == 200
    finally:
        s.stop()


def test_a_loopback_host_other_than_127_0_0_1_gets_no_warning(tiny):
    """Item 12: --host 127.0.0.2 (loopback) printed the warning that anyone who can reach the port can use the
    model."""
    port = free_port()
    proc = start(["serve", "-m", tiny["target"], "-c", "1024", "-t", "2", "--host", "127.0.0.2", "--port", port],
                 env=os.environ)
    wait_until_up(proc, lambda: bool(urllib.request.urlopen(f"http://127.0.0.2:{port}/health", timeout=1)), "server")
    _, err = stop(proc)
    assert "serving" in err and "warning" not in err, err


SECRET = "4471"  # in everything client A sends that another client must not see


def paths(value, prefix=""):
    """The paths of a JSON value's keys, as SHOWN lists them."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield f"{prefix}{k}"
            yield from paths(v, f"{prefix}{k}/")
    elif isinstance(value, list):
        for v in value:
            yield from paths(v, prefix)


def metric_names(text: str) -> set[str]:
    """The names and label names of /metrics, each label's value checked."""
    import re

    names = set()
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, labels = re.fullmatch(r"(\w+?)(?:_total)?(?:\{(.*)\})? \S+", line).groups()
        names.add(name)
        for key, value in re.findall(r'(\w+)="([^"]*)"', labels or ""):
            names.add(key)
            api = re.search(r'api="(\w+)"', labels)
            ok = {"api": value in APIS, "slot": value.isdigit(), "result": value in ("won", "lost"),
                  "field": api is not None and label(api.group(1), value) == value}
            assert ok.get(key), line
    return names


def test_what_each_endpoint_about_the_server_shows_is_its_list_and_no_other_clients_text(tiny):
    """Items 5 and 11: after client A's requests (a schema with an enum and a const, a tool, a grammar, a prompt,
    a field of its own named after a user's data), GET /slots showed A's enum in params.grammar, and /metrics a
    label `user_ssn_123-45-6789`. Each endpoint's answer is within SHOWN, and none holds what A sent."""
    s = Server(tiny["target"], "-c", "2048", "--parallel", "2")
    try:
        schema = {"type": "object", "properties": {"pin": {"enum": [f"SECRET-PIN-{SECRET}"]},
                                                   "k": {"const": f"c{SECRET}"}}}
        tool = {"type": "function", "function": {"name": f"secret_tool_{SECRET}", "parameters": schema}}
        for body in ({**CHAT, "json_schema": schema, f"user_ssn_123-45-{SECRET}": 1},
                     {**CHAT, "tools": [tool], "tool_choice": "required", "max_tokens": 8},
                     {"prompt": f"SECRET {SECRET}", "max_tokens": 2, "grammar": f'root ::= "{SECRET}"'}):
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            assert s.request("POST", path, body)[0] == 200, body
        for path in ABOUT:
            status, text = s.request("GET", path)
            assert status == 200 and SECRET not in text and "ssn" not in text, (path, text)
            shown = metric_names(text) if path == "/metrics" else set(paths(json.loads(text)))
            assert shown <= SHOWN[path], (path, shown - SHOWN[path])
    finally:
        s.stop()
