"""Presentation: streams text to stdout and shows live statistics on stderr. It never reaches into
the loop: it consumes the (text, step) events the loop yields and the Stats object it fills.

- stderr a terminal: a Rich Live panel (tokens/s, acceptance, tokens per step, acceptance by draft
  position, lookup vs draft-model share, the draft length in use, elapsed), refreshed 5 times a
  second (a small share of the loop, research/notes/2026-12-02-lab.md), then a small summary table.
- stderr not a terminal: no live panel; a one-line summary at the end.
- stdout carries only the generated text; when stdout is a terminal, tokens from accepted drafts can
  be coloured (`--color-drafts`).
"""

from __future__ import annotations

import sys
import time
from typing import IO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
)
from rich.table import Table
from rich.text import Text

from spectool.core.evidence import Source
from spectool.core.stats import Stats
from spectool.options import CTX_SIZE

# ANSI colours of accepted-draft text, one for every source a step's drafts can come from: green
# (lookup), bright green (lookup in the corpus of earlier requests), cyan (draft model), yellow (MTP
# head), bright yellow (EAGLE-3 head), bright blue (DFlash head), magenta for a hybrid step's
# drafts (lookup's tokens, then the others'), blue for the tokens a grammar forced and bright cyan
# for a prediction's (--prediction)
SOURCE_STYLE = {Source.lookup: 32, Source.corpus: 92, Source.draft: 36, Source.mtp: 33,
                Source.eagle3: 93, Source.dflash: 94, Source.hybrid: 35,
                Source.grammar: 34, Source.prediction: 96}


def sources_text(st: Stats, shares: bool = True) -> str:
    """The drafted tokens by source, with their shares: `grammar 40 (62%), lookup 25 (38%)`."""
    return ", ".join(f"{k} {v}" + (f" ({100 * v / st.n_drafted:.0f}%)" if shares else "")
                     for k, v in sorted(st.by_source.items()))


def summary_line(st: Stats) -> str:
    # the sources, where the mode does not name them all: `[lookup] ... drafted 58 (grammar 20,
    # lookup 38)`
    sources = (
        f" ({sources_text(st, shares=False)})"
        if st.by_source and set(st.by_source) != {st.mode}
        else ""
    )
    return (
        f"[{st.mode}] {st.n_generated} tokens in {st.decode_seconds:.2f}s = "
        f"{st.tokens_per_second:.1f} tok/s; drafted {st.n_drafted}{sources}, accepted "
        f"{st.n_accepted} ({100 * st.acceptance_rate:.0f}%); {st.mean_accepted_length:.2f} "
        f"tokens/step;{tree_text(st)} prompt {st.n_prompt_tokens} tokens in "
        f"{st.prompt_seconds:.2f}s; finish: {st.finish_reason}"
    )


def tree_text(st: Stats) -> str:
    """` trees 4 steps, 6 siblings, 1 taken;` where steps verified draft trees, else nothing."""
    if not st.tree_steps:
        return ""
    return f" trees {st.tree_steps} steps, {st.tree_branches} siblings, {st.tree_taken} taken;"


def offload_text(offload: dict) -> str:
    """`CPU` or `CUDA0 25/25 layers`, and the draft's after `draft`."""
    parts = []
    for role, o in offload.items():
        if o:
            where = o["backend"] + (f" {o['layers']}/{o['of']} layers" if o["layers"] else "")
            parts.append(where if role == "target" else f"{role} {where}")
    return ";  ".join(parts)


def _bar(frac: float, width: int = 12) -> str:
    full = int(round(frac * width))
    return "█" * full + "·" * (width - full)


def stats_table(st: Stats, elapsed: float | None = None) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("mode", st.mode + (f"  (draft length {st.last_k})" if st.mode != "none" else ""))
    t.add_row("speed",
              f"{st.tokens_per_second:.1f} tok/s  ({st.n_generated} tokens, {st.n_steps} steps)")
    if st.offload:
        t.add_row("backend", offload_text(st.offload))
    if st.n_drafted:
        t.add_row("accepted", f"{100 * st.acceptance_rate:.0f}%  of {st.n_drafted} drafted;  "
                  f"{st.mean_accepted_length:.2f} tokens/step")
        t.add_row("drafts from", sources_text(st))
        if st.tree_steps:
            t.add_row("trees", tree_text(st).strip(" ;"))
        for i, (d,
                a) in enumerate(zip(st.drafted_per_position, st.accepted_per_position + [0] * 64)):
            if i >= 8:
                break
            t.add_row(f"  position {i + 1}",
                      f"{_bar(a / d if d else 0)} {100 * a / d if d else 0:3.0f}%  ({d})")
    if elapsed is not None:
        t.add_row("elapsed", f"{elapsed:.1f}s")
    return t


class Display:
    """Consumes generation events. Use as a context manager around the loop."""

    def __init__(self, stats: Stats, *, quiet: bool = False, color_drafts: bool = False,
                 out: IO[str] | None = None, err: IO[str] | None = None, live: bool | None = None):
        self.stats = stats
        self.quiet = quiet
        self.out = out or sys.stdout
        self.err_console = Console(file=err or sys.stderr, stderr=err is None)
        self.out_console = Console(file=self.out)
        self.live_on = (not quiet and self.err_console.is_terminal) if live is None else live
        self.color = color_drafts and self.out_console.is_terminal and not self.out_console.no_color
        self.ended_with_newline = True
        self.live: Live | None = None
        self.t0 = time.perf_counter()
        self.render_seconds = 0.0
        # the unfinished line, shown in the live panel when stdout shares its terminal
        self.partial = ""
        self.share_terminal = False
        # prompt processing, shown in the live panel while it lasts
        self.prompt_bar: Progress | None = None

    def __enter__(self) -> "Display":
        if self.live_on:
            # when stdout is the same terminal, Live takes it over and prints finished lines above
            # the panel; the unfinished line is shown inside the panel
            self.share_terminal = self.out_console.is_terminal
            self.live = Live(console=self.err_console, refresh_per_second=5, transient=True,
                             redirect_stdout=self.share_terminal, redirect_stderr=False,
                             get_renderable=self._render)
            self.live.__enter__()
            if self.share_terminal:
                self.out = sys.stdout  # Rich's proxy
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            if self.share_terminal and not self.ended_with_newline:
                self.out.write("\n")  # Rich's proxy prints whole lines only: finish the last one
                self.ended_with_newline = True
            self.live.__exit__(*exc)
            self.live = None
            self.out = sys.stdout
        if not self.ended_with_newline:
            self.out.write("\n")
        self.out.flush()

    def _render(self) -> Group:
        t = time.perf_counter()
        parts: list[RenderableType] = [Text.from_ansi(self.partial)] if self.partial else []
        parts += [Text("── spectool "
                       "──", style="bold magenta"), stats_table(self.stats, t - self.t0)]
        if self.prompt_bar is not None:
            parts.append(self.prompt_bar)
        self.render_seconds += time.perf_counter() - t
        return Group(*parts)

    def text(self, piece: str, source: Source = Source.none) -> None:
        if not piece:
            return
        # colour each line, so no escape code spans a newline
        if self.color and source in SOURCE_STYLE:
            code = SOURCE_STYLE[source]
            piece = "\n".join(f"\x1b[{code}m{line}\x1b[0m" if line else ""
                              for line in piece.split("\n"))
        self.out.write(piece)
        # Rich's proxy would print a flushed partial line as a line of its own
        if not self.share_terminal:
            self.out.flush()
        self.ended_with_newline = piece.endswith("\n")
        if self.live is not None and self.share_terminal:
            self.partial = (self.partial + piece).rsplit("\n", 1)[-1]

    def prefill(self, done: int, total: int) -> None:
        """Prompt processing has reached `done` of `total` tokens: a bar with the rate in the live
        panel."""
        if self.live is None:
            return
        if self.prompt_bar is None:
            self.prompt_bar = Progress(TextColumn("prompt"), BarColumn(), MofNCompleteColumn(),
                                       TextColumn("tokens"),
                                       _Rate("tokens"))
            self.prompt_bar.add_task("prompt", total=total)
        self.prompt_bar.update(self.prompt_bar.task_ids[0], completed=done, total=total)
        if done >= total:
            self.prompt_bar = None

    def stream(self, pieces) -> None:
        """Show (text, Step) pairs as they come (speculative.generate_text): each step's notice,
        then its text, the part that came from accepted drafts in its source's colour."""
        for piece, step in pieces:
            if step.notice:
                self.notice(step.notice)
            self.text(piece[: step.draft_chars], step.source)
            self.text(piece[step.draft_chars :])

    def notice(self, message: str) -> None:
        self.err_console.print(f"spectool: {message}", markup=False, highlight=False)

    def summary(self) -> None:
        if self.quiet:
            return
        if self.err_console.is_terminal:
            self.err_console.print(stats_table(self.stats))
        else:
            print(summary_line(self.stats), file=self.err_console.file)


class WaitBar:
    """A progress bar on stderr for a wait that can be long: processing a long prompt, loading large
    weights, preparing a pruned draft. It appears only when stderr is a terminal and the wait has
    lasted `delay` seconds, and it leaves nothing behind. `update(done, total)` counts `unit`s (with
    their rate); `fraction(f)` takes a share of 1 (llama.cpp's loading progress)."""

    def __init__(self, description: str, unit: str = "tokens", delay: float = 1.0,
                 console: Console | None = None):
        self.description, self.unit, self.delay = description, unit, delay
        self.console = console or Console(stderr=True)
        self.t0 = time.perf_counter()
        self.progress: Progress | None = None
        self.task = TaskID(0)

    def update(self, done: float, total: float) -> None:
        if not self.console.is_terminal or done >= total and self.progress is None:
            return
        if self.progress is None:
            if time.perf_counter() - self.t0 < self.delay:
                return
            counted = ([MofNCompleteColumn(), TextColumn(self.unit), _Rate(self.unit)] if self.unit
                       else [])
            self.progress = Progress(TextColumn(self.description), BarColumn(),
                                     TaskProgressColumn(), *counted,
                                     console=self.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task(self.description, total=total)
        self.progress.update(self.task, completed=done, total=total)
        if done >= total:
            self.close()

    def fraction(self, f: float) -> None:
        self.update(f, 1.0)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def __enter__(self) -> "WaitBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Rate(ProgressColumn):
    """The task's speed, in units a second."""

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        return Text(f"{task.speed:.0f} "
                    f"{self.unit}/s" if task.speed else "", style="progress.data.speed")


def pairs_table(rows: list[dict]) -> None:
    """`spectool models` on the terminal: a table, or a block of short lines per pair when it is
    narrow."""
    console = Console()
    caption = (
        f"* the default pair.  memory: RAM (or VRAM) to run it at -c {CTX_SIZE}.  "
        "spectool pull NAME;  "
        "spectool run --pair NAME"
    )

    def memory(r: dict) -> str:
        return f"{r['memory_gb']:.1f} GB" if r["memory_gb"] else "?"

    if console.width < 120:  # too narrow for a table of file names
        width = max(len(r["name"]) for r in rows) + 2
        for r in rows:
            name = r["name"] + (" *" if r["default"] else "")
            console.print(f"{name:<{width}} {r['size_gb']:>5.2f} GB, needs {memory(r)}  "
                          f"{r['status']:<10}  {r['disk_bytes'] / 1e9:.2f} GB on "
                          "disk", style="bold", markup=False, highlight=False)
            for label, value in (("target", r["target"].split("/")[-1]),
                                 ("draft", r["draft"].split("/")[-1]),
                                 ("licence", r["license"])):
                console.print(f"  {label:<8}{value}", markup=False, highlight=False, soft_wrap=True)
        console.print(caption, style="dim")
        return
    t = Table(title="spectool pairs", caption=caption)
    for col in ("pair", "target / draft", "size", "memory", "licence", "status", "on disk"):
        t.add_column(col, no_wrap=col in ("pair", "status"))
    for r in rows:
        name = r["name"] + (" *" if r["default"] else "")
        files = [ref.split("/")[-1] for ref in (r["target"], r["draft"])]
        t.add_row(name, "\n".join(files), f"{r['size_gb']:.2f} GB", memory(r), r["license"],
                  r["status"], f"{r['disk_bytes'] / 1e9:.2f} GB")
    console.print(t)


def info_lines(data: dict) -> list[str]:
    """`spectool info` on the terminal: one aligned line per fact of devices.installation_info (and
    the cost tables)."""
    from spectool.llama.devices import REINSTALL_RPC

    mib = 1 << 20
    rows = [("spectool", data["spectool"]),
            ("llama.cpp",
             f"llama-cpp-python {data['llama_cpp_python']}, ggml {data['ggml']} "
             f"({data['ggml_commit']})"),
            ("CPU", data["system_info"]),
            ("GPU offload", "yes: -ngl auto offloads every layer" if data["gpu_offload"] else
             "no GPU device (a CPU-only build, or no driver): -ngl auto keeps the layers on the "
             "CPU"),
            ("RPC", "built in (spectool worker, --rpc)" if data["rpc"] else REINSTALL_RPC),
            ("threads", f"{data['threads']} by default (-t)")]
    rows += [(f"device {d['name']}", f"{d['type']}, {d['backend']}: {d['description']}; "
              f"{d['memory_total'] // mib} MiB, {d['memory_free'] // mib} MiB "
              "free") for d in data["devices"]]
    rows += [(f"{k} folder", v) for k, v in data["paths"].items()]
    rows += [("cost table", t) for t in data["cost_tables"]
             or ["none saved yet (spectool run measures and keeps this machine's costs; bench "
                                                                 "--reset-costs clears)"]]
    width = max(len(k) for k, _ in rows)
    return [f"{k:<{width}}  {v}" for k, v in rows]
