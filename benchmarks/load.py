"""`spectool serve` under load (issue 47 item 3): many clients at once, each with the official `openai` client, mixing
streamed chat, tool calls, `json_schema` answers and log-probabilities, against a real server on a tiny model.

    python benchmarks/load.py                       # 300 requests from 16 clients
    python benchmarks/load.py --requests 600 --queue 8

Every answer is checked whole (spectool_lab.loadmix says how), and anything else is an error: the only error a client may
get is the 503 of a full queue (docs/serve.md). It prints the requests, the errors by status, the server's resident
memory (/proc/PID/status VmRSS) once up, after a warm-up of the same mix and after the load, and the latency of /health,
asked every 50 ms during the load. The suite runs the same load with fewer requests (tests/test_hardening_load.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=64, help="requests of the same mix before the first RSS")
    ap.add_argument("--queue", type=int, default=16, help="the server's --queue (8 is its default)")
    args = ap.parse_args()
    from spectool_lab.helpers import Server
    from spectool_lab.loadmix import SERVER_ARGS, run_load, settled_rss_mb
    from spectool_lab.tinymodels import write_tool_models

    model = write_tool_models(Path(tempfile.mkdtemp(prefix="spectool-load-")))["hermes"]
    s = Server(model, *SERVER_ARGS, "--queue", args.queue)
    try:
        fresh = settled_rss_mb(s.proc.pid)
        run_load(s.url, s.port, args.warmup, args.clients, start=10_000)
        before = settled_rss_mb(s.proc.pid)
        got = run_load(s.url, s.port, args.requests, args.clients)
        after = settled_rss_mb(s.proc.pid)
    finally:
        s.stop()
    errors = {k: v for k, v in sorted(got.outcomes.items()) if k != "200"}
    print(f"requests: {args.requests} from {args.clients} clients in {got.seconds:.1f} s "
          f"(--queue {args.queue}, warm-up {args.warmup}); answered 200: {got.outcomes['200']}")
    print(f"errors by status: {errors or 'none'}")
    for line in got.invalid[:5]:
        print(f"  {line}")
    print(f"server RSS: {fresh:.1f} MB once up, {before:.1f} MB after the warm-up, {after:.1f} MB after the load "
          f"({100 * (after - before) / before:+.1f}%)")
    print(f"/health during the load: p95 {1000 * got.p95():.1f} ms, max {1000 * max(got.health):.1f} ms "
          f"over {len(got.health)} probes")


if __name__ == "__main__":
    main()
