"""The command line: Typer declarations and printing. Options are declared once in options.py,
errors become one line in errors.py; the work is done by the session layer (run, chat, serve,
bench), repl.py (the REPL), bench.py and devices.py (info, worker).

Heavy modules (llama_cpp, numpy, huggingface_hub) are imported inside commands so `spectool --help`
is instant.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from spectool import __version__
from spectool.cli.errors import cli_errors
from spectool.options import (
    COMMON,
    DRAFTING,
    GENERATION,
    GRAMMAR,
    HARDWARE,
    LLAMA_CPP_TEMP,
    LOOKUP_CACHE,
    MODELS,
    PREDICTION,
    SAMPLING,
    SERVE,
    Options,
    UserError,
    is_loopback,
    read_bounded,
    takes,
    with_corpus_default,
)
from spectool.cli.signals import SigintFlag, on_sigterm

app = typer.Typer(
    name="spectool",
    help="Fast local LLM generation with speculative decoding over llama.cpp.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# options that are not about models or generation, each declared once
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Host = Annotated[str,
                 typer.Option("--host",
                              help="Address to listen on (127.0.0.1: this machine only).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")]
Prompt = Annotated[Optional[str],
                  typer.Argument(help="The prompt; piped stdin is read and joined with it.")]
PromptOption = Annotated[Optional[str], typer.Option(
    "--prompt", "-p", help="The prompt, as llama.cpp's -p (instead of PROMPT).")]
Stop = Annotated[Optional[list[str]],
                 typer.Option("--stop", help="Stop when this text appears (repeatable).")]
Truncate = Annotated[bool, typer.Option(
    "--truncate", help="Keep the end of a prompt too long for the context.")]
StatsJson = Annotated[Optional[Path],
                      typer.Option("--stats-json", help="Write generation statistics here.")]
ColorDrafts = Annotated[bool, typer.Option(
    "--color-drafts",
    help="Colour text from accepted drafts (green: lookup, bright green: lookup in the corpus, "
    "cyan: draft model, yellow: MTP head, bright yellow: EAGLE-3 head, bright blue: DFlash head, "
    "magenta: a hybrid step's drafts, blue: tokens a grammar forced, bright cyan: the "
    "--prediction).")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"spectool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True,
                     help="Show the version and exit.")
    ] = False,
) -> None:
    """Fast local LLM generation with speculative decoding over llama.cpp."""


# -- helpers
# --------------------------------------------------------------------------------------------------
def say(line: str) -> None:
    print(f"spectool: {line}", file=sys.stderr, flush=True)


def read_prompt(prompt: str | None) -> str:
    """PROMPT joined after piped stdin (at most INPUT_BYTES of it), as `llm` does; an error only
    when both are empty."""
    parts = []
    if not sys.stdin.isatty():
        data = read_bounded(sys.stdin.buffer, "stdin")
        if b"\x00" in data:
            raise UserError("stdin looks binary (it contains NUL bytes); pipe text instead")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"stdin is not valid UTF-8 (byte {e.start})") from None
        if text.strip():
            parts.append(text.rstrip("\n"))
    if prompt:
        parts.append(prompt)
    if not parts:
        raise UserError("no prompt: give PROMPT or pipe text on stdin", code=2)
    return "\n".join(parts)


def writable(path: Path, flag: str) -> None:
    """A file a command writes when it ends, checked before anything loads, so that a bad path costs
    no generation: a directory, a device or a FIFO (what is not a regular file), a missing folder,
    a folder it cannot write in, or a read-only file (replacing it would drop its mode) is one line
    naming the path as given. A symbolic link is written through: what it names is checked."""
    real = Path(os.path.realpath(path))
    if real.is_dir():
        raise UserError(f"{flag} {path}: is a directory", code=2)
    if real.exists() and not real.is_file():
        raise UserError(f"{flag} {path}: not a regular file (a device, a FIFO or a socket); "
                        "spectool writes only files", code=2)
    if real.exists() and (not os.access(real, os.W_OK) or not real.stat().st_mode & 0o222):
        raise UserError(f"{flag} {path}: the file is read-only", code=2)
    if not real.parent.is_dir():
        raise UserError(f"{flag} {path}: no such directory {path.parent}", code=2)
    import tempfile

    try:  # what saving will do: make a file in that folder
        tempfile.TemporaryFile(dir=real.parent).close()
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write in {path.parent} "
                        f"({e.strerror})", code=2) from None


def save_stats(stats, path: Path | None) -> None:
    from spectool.models.store import write_json_atomic

    if path:
        try:
            write_json_atomic(path, stats.to_json())  # --stats-json: written whole or not at all
        except OSError as e:  # the temporary file's name would mean nothing to the user
            raise UserError(f"--stats-json {path}: could not write it ({e.strerror})") from None


def _confirm(question: str) -> bool:
    return typer.confirm(question, default=True, err=True)


def hooks():
    """What the session layer asks of the user, answered on the terminal: download confirmations
    (only when stdin is one), progress bars and one-line messages on stderr."""
    from spectool.session import Hooks
    from spectool.cli.display import WaitBar

    return Hooks(ask=_confirm if sys.stdin.isatty() else None, bar=lambda label,
                 unit: WaitBar(label, unit=unit),
                 say=say)


@contextlib.contextmanager
def session(o: Options):
    from spectool.session import open_session

    with open_session(o, hooks()) as s:
        for n in s.notices:
            say(n)
        checked_grammar(s, o)
        yield s


def checked_grammar(s, o: Options) -> None:
    """The grammar the flags ask for, against the model's vocabulary (a token id or special token
    it lacks), before anything generates: one line naming the flag."""
    from spectool.core.grammar import GrammarError

    try:
        if s.gen.grammar is not None:
            s.gen.grammar.check(s.gen.target)
    except GrammarError as e:
        raise UserError(f"{o.grammar_flag()}: {e}", code=2) from None


# -- run
# --------------------------------------------------------------------------------------------------
@app.command(epilog="Examples:\n\n"
             "  spectool run -m model.gguf \"Write a haiku about autumn\"\n\n"
             "  cat notes.md | spectool run -m model.gguf \"Summarize:\"\n\n"
             "  spectool run -m big.gguf -md small.gguf --spec draft -n 200 \"Tell me a story\""
             "\n\n  cat app.py | spectool run -m model.gguf \"Add type hints\" --prediction app.py")
@takes(MODELS, DRAFTING, GENERATION, SAMPLING, GRAMMAR, HARDWARE, LOOKUP_CACHE, PREDICTION, COMMON)
def run(
    o: Options,
    prompt: Prompt = None,
    prompt_option: PromptOption = None,
    stop: Stop = None,
    truncate: Truncate = False,
    color_drafts: ColorDrafts = False,
    stats_json: StatsJson = None,
    quiet: Quiet = False,
) -> None:
    """Generate text once: stream it to stdout, live statistics to stderr. Greedy unless --temp is
    given, so that pipes and code edits reproduce."""
    with cli_errors(o.debug):
        from spectool.session import text_completion
        from spectool.cli.display import Display

        if prompt and prompt_option:
            raise UserError("give the prompt once: PROMPT or -p/--prompt", code=2)
        text = read_prompt(prompt or prompt_option)
        if stats_json:
            writable(stats_json, "--stats-json")
        if o.lookup_cache is not None:  # written back when the run ends
            writable(Path(o.lookup_cache), "--lookup-cache")
        with session(with_corpus_default(o, False)) as s, SigintFlag() as interrupted:
            stats = s.stats()
            display = Display(stats, quiet=quiet, color_drafts=color_drafts)
            pieces = text_completion(s, text, stop, truncate, interrupted, stats, display.prefill,
                                     say)
            try:
                # closed whatever happens: the loop then writes how the generation ended
                with display, contextlib.closing(pieces):
                    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C, or one during
                        display.stream(pieces)  # the prompt
            # the reader went away (`| head`): the statistics are written all the same
            except BrokenPipeError:
                save_stats(stats, stats_json)
                raise
            display.summary()
            save_stats(stats, stats_json)
            if o.debug:
                say(f"display rendering took {display.render_seconds:.3f}s")
            if stats.finish_reason == "interrupted":
                raise typer.Exit(interrupted.exit_code)


# -- chat
# --------------------------------------------------------------------------------------------------
@app.command(epilog="Examples:\n\n  spectool chat --pair demo-chat\n\n"
             "  spectool chat -m model.gguf --system \"You are terse.\"",
             help="Chat in the terminal, with the model's chat template and the conversation kept "
             "in the KV cache. Samples with llama.cpp's defaults (temperature "
             f"{LLAMA_CPP_TEMP:g}); --temp 0 for greedy. /help lists the commands.")
@takes(MODELS, DRAFTING, GENERATION, SAMPLING, GRAMMAR, HARDWARE, COMMON, temp=LLAMA_CPP_TEMP,
       max_tokens=512)
def chat(
    o: Options,
    system: Annotated[Optional[str], typer.Option("--system", help="System prompt.")] = None,
    color_drafts: ColorDrafts = False,
    quiet: Quiet = False,
) -> None:
    """Chat in the terminal (the help is the decorator's: it names llama.cpp's temperature from
    options.py)."""
    from spectool.cli.repl import repl

    # the corpus: every conversation's
    with cli_errors(o.debug), session(with_corpus_default(o, True)) as s:
        code = repl(s, system, color_drafts, quiet, say)
    if code:
        raise typer.Exit(code)


# -- serve
# --------------------------------------------------------------------------------------------------
@app.command(epilog="Examples:\n\n  spectool serve --pair demo-chat\n\n  spectool serve -m "
             "big.gguf -md small.gguf --host 0.0.0.0 --port 8080 --api-key SECRET")
@takes(MODELS, DRAFTING, GENERATION, SAMPLING, GRAMMAR, HARDWARE, SERVE, COMMON, ctx_size=0)
def serve(
    o: Options,
    host: Host = "127.0.0.1",
    port: Annotated[int,
                    typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8080,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar="SPECTOOL_API_KEY",
        help="Require 'Authorization: Bearer KEY' on every request.")] = None,
) -> None:
    """An OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, /health,
    /metrics) with speculative decoding. The generation options are the defaults of requests that do
    not set them (greedy unless --temp or a request's temperature says otherwise); the context is
    the model's trained one where memory holds it (-c 0), as agents' long prompts need."""
    with cli_errors(o.debug):
        # before the model loads: a missing server library is one line, not a wait and then a
        # failure
        try:
            import starlette  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError as e:
            raise UserError(f"spectool serve needs uvicorn and starlette ({e.name or e} is "
                            "missing): pip install uvicorn starlette") from None
        from spectool.server.app import check_api_key, serve as run_server
        from spectool.server.guard import Guard

        check_api_key(api_key)  # an empty key, or a bad origin, is refused before the model loads
        Guard.of(host, port, o.allowed_hosts, o.cors_origins)
        # off where others reach it (serve.md)
        with session(with_corpus_default(o, is_loopback(host))) as s:
            model_id = o.pair or Path(str(s.gen.target.path)).stem
            run_server(s, o, model_id, host, port, api_key, say=say)


# -- bench
# --------------------------------------------------------------------------------------------------
@app.command(epilog="Examples:\n\n  spectool bench --pair demo\n\n"
             "  spectool bench -m big.gguf -md small.gguf --prompts prompts.txt --plot speed.png")
@takes(MODELS, GENERATION, HARDWARE, COMMON, max_tokens=96)
def bench(
    o: Options,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts",
        help="Prompts: JSON lines, or text with prompts separated by lines of '---'.")] = None,
    draft_vocab: Annotated[int, typer.Option(
        "--draft-vocab", min=0,
        help="Also try the draft pruned to this many tokens (0 = not).")] = 65536,
    plot: Annotated[Optional[Path],
                    typer.Option("--plot", help="Write a PNG chart of the speedups.")] = None,
    as_json: AsJson = False,
    sampled: Annotated[bool, typer.Option(
        "--sampled/--greedy-only",
        help=f"Also measure sampling at temperature {LLAMA_CPP_TEMP:g} with llama.cpp's "
        "defaults, against llama-cpp-python's own plain sampling.")] = True,
    reset_costs: Annotated[bool, typer.Option(
        "--reset-costs",
        help="First remove the target's saved cost tables (what `run` learnt this machine "
        "charges): later runs measure afresh.")] = False,
) -> None:
    """Plain vs speculative decoding on this machine, side by side, with your model(s) and prompts:
    greedy, and sampled (llama.cpp's defaults) against llama-cpp-python's own sampler."""
    with cli_errors(o.debug):
        from rich.console import Console
        from rich.progress import Progress

        from spectool import bench as B

        texts = B.read_prompts(str(prompts)) if prompts else B.BUILTIN_PROMPTS
        if not texts:
            raise UserError(f"no prompts in {prompts}", code=2)
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("benchmarking")
            c = B.compare(o, texts, draft_vocab, sampled, hooks(), lambda description, advance,
                          total: progress.update(
                task, advance=advance, total=total, description=description),
                reset_costs=reset_costs)
        if plot:
            B.plot({"greedy": c.results, f"temperature {B.LLAMA_CPP_SAMPLING.temp:g}": c.sampled}
                   if c.sampled
                   else {c.model_name: c.results}, str(plot))
        print(json.dumps(c.to_json(), indent=2) if as_json else B.report(c, reset_costs))


# -- check
# --------------------------------------------------------------------------------------------------
@app.command(epilog="Examples:\n\n  spectool check big.gguf small.gguf\n\n  spectool check "
                    "model.gguf")
@takes("debug")
def check(
    o: Options,
    target: Annotated[str, typer.Argument(help="Target model (.gguf).")],
    draft: Annotated[Optional[str], typer.Argument(help="Draft model (.gguf).")] = None,
) -> None:
    """What TARGET (and DRAFT) are: vocabulary and MTP heads; with DRAFT, how it drafts for TARGET:
    token for token where llama.cpp's vocabulary rule says they share a vocabulary, else through
    text (each draft decoded and encoded again in the target's vocabulary); a DRAFT that is an
    EAGLE-3 or DFlash head: what it reads and whether the target has it."""
    with cli_errors(o.debug):
        from spectool.drafters import dflash, eagle3
        from spectool.models.compat import check_files, check_head

        head = (eagle3.head_facts(draft) or dflash.head_facts(draft)) if draft else None
        facts, problems = (check_head(target, head, o.debug) if head is not None
                           else check_files(target, draft, o.debug))
    for role, path, (v, heads) in zip(("target:", "draft: "), (target, draft or ""), facts):
        print(f"{role} {Path(path).name}: {v.n_tokens} tokens, type {v.type}, BOS {v.bos}, EOS "
              f"{v.eos}; "
              + (f"{heads} MTP head{'s' if heads > 1 else ''} (NextN "
                 "layers)" if heads else "no MTP heads"))
    if draft is None:
        return
    if head is not None:  # problems: what the head is, then whether it can draft for the target
        print(f"draft:  {Path(draft).name}: " + "\n".join(problems))
        return
    if not problems:
        print("compatible: the draft drafts for the target token for token (one vocabulary)")
        return
    print("another vocabulary: the draft drafts through text, each draft decoded and encoded again "
          "in the target's tokens (a tokenization of a few characters a drafted token, beside the "
          "draft model's own step; greedy and sampled output unchanged). The differences:")
    for p in problems:
        print(f"  - {p}")


# -- pull / models
# ---------------------------------------------------------------------------------------------
@app.command(epilog="Examples:\n\n  spectool pull qwen2.5-7b\n\n"
             "  spectool pull hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q8_0.gguf")
@takes("yes", "debug")
def pull(
    o: Options,
    name: Annotated[str, typer.Argument(help="A pair from models.toml, or "
                                             "hf:OWNER/REPO/FILE[@REVISION].")],
) -> None:
    """Download a pair (or one model) into the Hugging Face cache; files already there are not
    fetched again."""
    with cli_errors(o.debug):
        from spectool.models import hub

        hub.VERBOSE["on"] = o.debug
        for role, ref, path in hub.pull(name, o.yes, _confirm if sys.stdin.isatty() else None):
            print(f"{role}: {ref} -> {path}")


@app.command()
@takes("debug")
def models(o: Options, as_json: AsJson = False) -> None:
    """The curated pairs: sizes, memory needed, licences, and whether they are downloaded (from the
    local cache only)."""
    with cli_errors(o.debug):
        from spectool.models.hub import catalogue

        rows = catalogue()
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from spectool.cli.display import pairs_table

    pairs_table(rows)


# -- info and worker
# ---------------------------------------------------------------------------------------------
@app.command(epilog="Examples:\n\n  spectool info\n\n  spectool info --json --rpc "
                    "192.168.1.20:50052")
@takes("rpc", "debug")
def info(o: Options, as_json: AsJson = False) -> None:
    """What this installation can do: versions, CPU features, backends and devices, GPU offload and
    RPC, threads, and the folders spectool uses."""
    with cli_errors(o.debug):
        from spectool import cost_files
        from spectool.cli.info import installation_info
        from spectool.llama import devices

        devices.set_verbose(o.debug)
        data = installation_info(o.rpc)
        data["cost_tables"] = [cost_files.describe(t) for t in cost_files.tables()]
    if as_json:
        print(json.dumps(data, indent=2))
        return
    from spectool.cli.display import info_lines

    for line in info_lines(data):
        print(line)


@app.command(epilog="Examples:\n\n  spectool worker\n\n  spectool worker --host 0.0.0.0 --port "
             "50052 -t 8\n\nthen, on the machine that runs the models:  spectool run --rpc "
             "HOST:50052 ...")
@takes("threads", "debug")
def worker(
    o: Options,
    host: Host = "127.0.0.1",
    port: Annotated[int,
                    typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 50052,
) -> None:
    """Lend this machine's GPUs (else its CPU) to `spectool run --rpc` elsewhere: llama.cpp's RPC
    server."""
    with cli_errors(o.debug):
        from spectool.llama import devices

        devices.set_verbose(o.debug)
        devices.run_worker(host, port, o.threads, lambda line: print("spectool worker: "
                                                                     f"{line}", file=sys.stderr,
                                                                     flush=True))


def main() -> None:
    signal.signal(signal.SIGTERM, on_sigterm)
    # bytes that are not UTF-8 arrive as surrogates, and fail deep inside: say so here
    for arg in sys.argv[1:]:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            print(f"error: an argument is not valid UTF-8: {os.fsencode(arg)[:60]!r} (spectool "
                  "reads UTF-8 text)",
                  file=sys.stderr)
            sys.exit(2)
    app()


if __name__ == "__main__":
    main()
