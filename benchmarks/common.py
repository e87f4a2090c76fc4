"""What the benchmark scripts share beyond spectool.bench: the machine a result was measured on, and running a
reference contender to the end."""

from __future__ import annotations

from typing import Iterator

from spectool.bench import Result


def machine(threads: int | None) -> str:
    """What a result was measured on, dated: "2026-11-30, Intel(R) Xeon(R) Processor (x86_64, AVX-512), 2 cores (2
    threads)"."""
    import datetime
    import os
    import platform

    cpu, flags = platform.processor() or platform.machine(), ""
    try:
        info = open("/proc/cpuinfo").read()
        cpu = next(ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name"))
        flags = ", AVX-512" if " avx512f" in info else ", AVX2" if " avx2" in info else ""
    except (OSError, StopIteration):
        pass
    n = os.cpu_count() or 1
    return f"{datetime.date.today()}, {cpu} ({platform.machine()}{flags}), {n} cores ({threads or n} threads)"


def drain(baseline: tuple[Result, Iterator[None]]) -> Result:
    """A reference contender (spectool.bench.reference) run on all its prompts at once."""
    for _ in baseline[1]:
        pass
    return baseline[0]


def say(line: str) -> None:
    """A reference contender's failures, as the scripts print them."""
    print(f"  {line}", flush=True)
