"""The command line: parse options, load models, run the loop, hand its events to the display.

Heavy modules (llama_cpp, numpy, huggingface_hub) are imported inside commands so `spectool --help` is instant.
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

app = typer.Typer(
    name="spectool",
    help="Fast local LLM generation with speculative decoding over llama.cpp.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


from spectool.session import Options, Spec, UserError  # noqa: E402 (the session layer imports nothing heavy)


# -- shared option aliases ---------------------------------------------------------------------------------------
Model_ = Annotated[
    Optional[str], typer.Option("--model", "-m", help="Target model: a .gguf path, hf:OWNER/REPO/FILE[@REV] or a pair name.")
]
Draft_ = Annotated[Optional[str], typer.Option("--model-draft", "-md", "--spec-draft-model",
                                                help="Draft model: a .gguf path or hf:... reference.")]
Spec_ = Annotated[Spec, typer.Option("--spec", help="auto: hybrid with a draft model, lookup without one.")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Most tokens to generate.")]
TopK = Annotated[int, typer.Option("--top-k", min=0, help="Top-k sampling; 0 = off.")]
TopP = Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Top-p sampling in (0, 1]; 1 = off.")]
MinP = Annotated[float, typer.Option("--min-p", min=0.0, max=1.0, help="Min-p sampling; 0 = off.")]
RepeatPenalty = Annotated[float, typer.Option(
    "--repeat-penalty", min=0.0, help="Penalise tokens seen in the last --repeat-last-n tokens (llama.cpp's rule: "
    "logits above 0 divided by it, below 0 multiplied); 1 = off.")]
RepeatLastN = Annotated[int, typer.Option(
    "--repeat-last-n", min=-1, help="How many recent tokens the penalties look at; 0 = off, -1 = the whole context.")]
PresencePenalty = Annotated[float, typer.Option(
    "--presence-penalty", help="Subtract this from the logit of every token seen in the window; 0 = off.")]
FrequencyPenalty = Annotated[float, typer.Option(
    "--frequency-penalty", help="Subtract this times its count in the window from a token's logit; 0 = off.")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Random seed for sampling (reproducible runs).")]
DraftMax = Annotated[
    Optional[int], typer.Option("--draft-max", "--spec-draft-n-max", min=0, max=64,
                                help="Most draft tokens per step (default: the pair's, else 32).")
]
Pair_ = Annotated[Optional[str], typer.Option("--pair", "-p", help="A target/draft pair from models.toml.")]
DraftVocab = Annotated[int, typer.Option(
    "--draft-vocab", min=0, help="Prune the draft to this many tokens, its most likely ones (made once, cached): "
    "a faster draft when its vocabulary is large. 0 = off.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Download without asking.")]
DraftMin = Annotated[
    int, typer.Option("--draft-min", "--spec-draft-n-min", min=0, max=64,
                      help="Fewest draft tokens per step; = --draft-max: fixed length.")
]
DraftPMin = Annotated[
    float, typer.Option("--draft-p-min", "--spec-draft-p-min", min=0.0, max=1.0,
                        help="Stop drafting below this draft probability.")
]
Ctx = Annotated[int, typer.Option("--ctx-size", "-c", min=0, help="Context size in tokens (0 = the model's).")]
Threads = Annotated[Optional[int], typer.Option("--threads", "-t", min=1, help="CPU threads.")]


def _gpu_layers(value: str) -> str:
    from spectool.engine import parse_gpu_layers

    try:
        return str(parse_gpu_layers(value))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


Ngl = Annotated[str, typer.Option(
    "--gpu-layers", "-ngl", callback=_gpu_layers, metavar="N|auto|all",
    help="Target layers to offload to the GPU or RPC workers; auto = all of them when there is a device to "
    "offload to, none otherwise.")]
Ngld = Annotated[str, typer.Option(
    "--gpu-layers-draft", "-ngld", callback=_gpu_layers, metavar="N|auto|all",
    help="Draft layers to offload; auto = all of them on a local GPU (the draft stays off RPC workers unless "
    "there is no local GPU and a number is given).")]


def _rpc(value: str | None) -> str | None:
    from spectool.engine import RpcError, parse_endpoints

    try:
        return value and ",".join(f"{h}:{p}" for h, p in parse_endpoints(value))
    except RpcError as e:
        raise typer.BadParameter(str(e)) from None


Rpc = Annotated[Optional[str], typer.Option(
    "--rpc", metavar="HOST:PORT[,...]", callback=_rpc,
    help="Use the devices of these RPC workers (`spectool worker`) for the target's layers, as llama.cpp's --rpc "
    "does.")]
StatsJson = Annotated[Optional[Path], typer.Option("--stats-json", help="Write generation statistics here.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks and llama.cpp's log.")]
Stop = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop when this text appears (repeatable).")]
ColorDrafts = Annotated[
    bool, typer.Option("--color-drafts", help="Colour text from accepted drafts (green: lookup, cyan: draft model).")
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"spectool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Fast local LLM generation with speculative decoding over llama.cpp."""


# -- errors ------------------------------------------------------------------------------------------------------
def _error_table():
    from spectool.engine import DecodeError, DoesNotFit, ModelLoadError, RpcError
    from spectool.hub import HubError
    from spectool.registry import RegistryError

    return {
        UserError: "",
        HubError: "",
        RegistryError: "",
        RpcError: "",
        DoesNotFit: "",
        ModelLoadError: "check the path, or that the file is a complete GGUF model",
        DecodeError: "try a smaller --ctx-size or fewer --gpu-layers",
        UnicodeDecodeError: "spectool reads UTF-8 text",
        OSError: "",
    }


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so that cleanup (finally blocks, temporary files) runs."""


def _on_sigterm(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def cli_errors(debug: bool):
    """Every command's body: errors become one line (see _error_table), interrupts exit 130 / 143."""
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt as e:
        print("spectool: interrupted", file=sys.stderr)
        raise typer.Exit(143 if isinstance(e, Terminated) else 130) from None
    except BrokenPipeError:  # the reader went away (`| head`): stop at once and say nothing, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        raise typer.Exit(141) from None
    except Exception as e:  # noqa: BLE001 - mapped to one line by the error table
        _fail(e, debug)


def _fail(e: BaseException, debug: bool) -> None:
    if debug:
        raise e
    hint = next((h for t, h in _error_table().items() if isinstance(e, t)), None)
    if hint is None:
        hint = "run with --debug for the full traceback"
    msg = f"error: {e}" + (f" ({hint})" if hint else "")
    print(msg.replace("\n", " "), file=sys.stderr)
    raise typer.Exit(getattr(e, "code", 1) if isinstance(e, UserError) else 1)


# -- helpers -----------------------------------------------------------------------------------------------------
def read_prompt(prompt: str | None) -> str:
    """PROMPT joined after piped stdin, as `llm` does; an error only when both are empty."""
    parts = []
    if not sys.stdin.isatty():
        data = sys.stdin.buffer.read()
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


def hooks():
    """What the session layer asks of the user, answered on the terminal: download confirmations (only when
    stdin is one), progress bars and one-line messages on stderr."""
    from spectool.session import Hooks
    from spectool.ui import WaitBar

    return Hooks(ask=_confirm if sys.stdin.isatty() else None, bar=lambda label, unit: WaitBar(label, unit=unit),
                 say=lambda line: print(f"spectool: {line}", file=sys.stderr))


def _confirm(question: str) -> bool:
    return typer.confirm(question, default=True, err=True)


class SigintFlag:
    """Ctrl-C (or SIGTERM) sets a flag the loop checks between steps, so no cache is left half-updated and
    the text so far is kept; a second signal raises at once."""

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


# -- run ---------------------------------------------------------------------------------------------------------
@app.command(
    epilog="Examples:\n\n"
    "  spectool run -m model.gguf \"Write a haiku about autumn\"\n\n"
    "  cat notes.md | spectool run -m model.gguf \"Summarize:\"\n\n"
    "  spectool run -m big.gguf -md small.gguf --spec draft -n 200 \"Tell me a story\""
)
def run(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; piped stdin is read and joined with it.")] = None,
    model: Model_ = None,
    pair: Pair_ = None,
    model_draft: Draft_ = None,
    spec: Spec_ = Spec.auto,
    max_tokens: MaxTokens = 256,
    temp: Annotated[float, typer.Option(
        "--temp", min=0.0, help="Temperature; 0 (the default for run) = greedy, reproducible. The chain is "
        "llama.cpp's: penalties, top-k, top-p, min-p, then temperature.")] = 0.0,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    repeat_penalty: RepeatPenalty = 1.0,
    repeat_last_n: RepeatLastN = 64,
    presence_penalty: PresencePenalty = 0.0,
    frequency_penalty: FrequencyPenalty = 0.0,
    seed: Seed = None,
    draft_max: DraftMax = None,
    draft_min: DraftMin = 0,
    draft_p_min: DraftPMin = 0.0,
    draft_vocab: DraftVocab = 0,
    ctx_size: Ctx = 4096,
    threads: Threads = None,
    gpu_layers: Ngl = "auto",
    gpu_layers_draft: Ngld = "auto",
    rpc: Rpc = None,
    stop: Stop = None,
    truncate: Annotated[bool, typer.Option("--truncate", help="Keep the end of a prompt too long for the context.")] = False,
    color_drafts: ColorDrafts = False,
    stats_json: StatsJson = None,
    yes: Yes = False,
    quiet: Quiet = False,
    debug: Debug = False,
) -> None:
    """Generate text once: stream it to stdout, live statistics to stderr. Greedy unless --temp is given, so that
    pipes and code edits reproduce."""
    with cli_errors(debug):
        _run(Options.of(locals()), prompt, stop, truncate, color_drafts, stats_json, quiet)


def fit_prompt(tokens: list[int], n_ctx: int, max_tokens: int, truncate: bool, bos: int) -> list[int]:
    """The prompt must leave room for at least one new token; --truncate keeps its end (and the BOS)."""
    if len(tokens) < n_ctx:
        return tokens
    if not truncate:
        raise UserError(f"the prompt has {len(tokens)} tokens but the context holds {n_ctx} (-c/--ctx-size); "
                        "raise -c or pass --truncate to keep the end of the prompt")
    keep = n_ctx - min(max_tokens, n_ctx // 2)
    head = tokens[:1] if tokens and tokens[0] == bos else []
    out = head + tokens[len(tokens) - (keep - len(head)):]
    print(f"spectool: prompt truncated to its last {len(out)} of {len(tokens)} tokens (context {n_ctx})",
          file=sys.stderr)
    return out


def _run(o: Options, prompt: str | None, stop: list[str] | None, truncate: bool, color_drafts: bool,
         stats_json: Path | None, quiet: bool) -> None:
    from spectool.cache import write_json_atomic
    from spectool.session import open_session
    from spectool.speculative import generate_text
    from spectool.stats import Stats
    from spectool.ui import Display

    text = read_prompt(prompt)
    with open_session(o, hooks()) as s:
        for n in s.notices:
            print(f"spectool: {n}", file=sys.stderr)
        gen = s.gen
        stats = Stats(mode=s.mode, target=s.target_name, draft=s.draft_name, offload=s.offload)
        tokens = fit_prompt(gen.target.tokenize(text, add_special=True, parse_special=True), gen.target.n_ctx,
                            o.max_tokens, truncate, gen.target.vocab_info().bos)
        display = Display(stats, quiet=quiet, color_drafts=color_drafts)
        gen.on_prefill = display.prefill
        with SigintFlag() as interrupted, display:
            try:
                for piece, step in generate_text(gen, tokens, stop or (), stats, interrupted):
                    if step.notice:
                        display.notice(step.notice)
                    display.text(piece[: step.draft_chars], step.source)
                    display.text(piece[step.draft_chars :])
            except KeyboardInterrupt:  # a second Ctrl-C
                stats.finish_reason = "interrupted"
        if stats_json:
            write_json_atomic(stats_json, stats.to_json())
        display.summary()
        if o.debug:
            print(f"spectool: display rendering took {display.render_seconds:.3f}s", file=sys.stderr)
        if stats.finish_reason == "interrupted":
            raise typer.Exit(interrupted.exit_code)


# -- check -------------------------------------------------------------------------------------------------------
@app.command(epilog="Example:\n\n  spectool check big.gguf small.gguf")
def check(
    target: Annotated[str, typer.Argument(help="Target model (.gguf).")],
    draft: Annotated[str, typer.Argument(help="Draft model (.gguf).")],
    debug: Debug = False,
) -> None:
    """Can DRAFT draft for TARGET? Compares vocabularies by llama.cpp's rule; exit 0 if so, 1 if not."""
    with cli_errors(debug):
        from spectool import engine
        from spectool.compat import vocab_differences

        engine.set_verbose(debug)
        with engine.Model(target, n_ctx=64) as t, engine.Model(draft, n_ctx=64) as d:
            ti, di = t.vocab_info(), d.vocab_info()
            problems = vocab_differences(ti, di)
    print(f"target: {Path(target).name}: {ti.n_tokens} tokens, type {ti.type}, BOS {ti.bos}, EOS {ti.eos}")
    print(f"draft:  {Path(draft).name}: {di.n_tokens} tokens, type {di.type}, BOS {di.bos}, EOS {di.eos}")
    if not problems:
        print("compatible: the draft can draft for the target")
        return
    print("NOT compatible:")
    for p in problems:
        print(f"  - {p}")
    raise typer.Exit(1)


# -- pull / models ---------------------------------------------------------------------------------------------
def _refs_for(name: str):
    """[(role, ref)] for a pair name or a single model reference."""
    from spectool import registry

    if name.startswith("hf:") or name.endswith(".gguf"):
        return [("model", registry.parse_ref(name))]
    pair = registry.load().get(name)
    return [("target", pair.target)] + ([("draft", pair.draft)] if pair.draft is not None else [])


@app.command(epilog="Examples:\n\n  spectool pull qwen2.5-7b\n\n"
             "  spectool pull hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q8_0.gguf")
def pull(
    name: Annotated[str, typer.Argument(help="A pair from models.toml, or hf:OWNER/REPO/FILE[@REVISION].")],
    yes: Yes = False,
    debug: Debug = False,
) -> None:
    """Download a pair (or one model) into the Hugging Face cache; files already there are not fetched again."""
    with cli_errors(debug):
        from spectool import hub

        hub.VERBOSE["on"] = debug
        for role, ref in _refs_for(name):
            if ref.path is not None:
                raise UserError(f"{ref.path} is a local file: nothing to pull", code=2)
            path = hub.ensure(ref, yes=yes, ask=_confirm if sys.stdin.isatty() else None)
            print(f"{role}: {ref} -> {path}")


@app.command()
def models(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    debug: Debug = False,
) -> None:
    """The curated pairs: sizes, licences, and whether they are downloaded (from the local cache only)."""
    with cli_errors(debug):
        from spectool import hub, registry

        reg = registry.load()
        rows = []
        for p in reg.pairs.values():
            refs = [p.target] + ([p.draft] if p.draft is not None else [])
            states = [hub.status(r) for r in refs]
            kinds = {k for k, _ in states}
            state = "downloaded" if kinds == {"downloaded"} else ("missing" if kinds == {"missing"} else "partial")
            rows.append({
                "name": p.name, "default": p.name == reg.default, "target": str(p.target),
                "draft": str(p.draft) if p.draft else "lookup", "quantization": p.quantization,
                "size_gb": p.size_gb, "license": p.license, "draft_max": p.draft_max, "status": state,
                "disk_bytes": sum(n for _, n in states), "description": p.description, "source": p.source,
            })
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    caption = "* the default pair.  spectool pull NAME;  spectool run --pair NAME"
    if console.width < 120:  # too narrow for a table of file names: each pair is a block of short lines
        width = max(len(r["name"]) for r in rows) + 2
        for r in rows:
            name = r["name"] + (" *" if r["default"] else "")
            console.print(f"{name:<{width}} {r['size_gb']:>5.1f} GB  {r['status']:<10}  "
                          f"{r['disk_bytes'] / 1e9:.2f} GB on disk", style="bold", markup=False, highlight=False)
            for label, value in (("target", r["target"].split("/")[-1]), ("draft", r["draft"].split("/")[-1]),
                                 ("licence", r["license"])):
                console.print(f"  {label:<8}{value}", markup=False, highlight=False, soft_wrap=True)
        console.print(caption, style="dim")
        return
    t = Table(title="spectool pairs", caption=caption)
    for col in ("pair", "target / draft", "size", "licence", "status", "on disk"):
        t.add_column(col, no_wrap=col in ("pair", "status"))
    for r in rows:
        name = r["name"] + (" *" if r["default"] else "")
        files = [ref.split("/")[-1] for ref in (r["target"], r["draft"])]
        t.add_row(name, "\n".join(files), f"{r['size_gb']:.1f} GB", r["license"], r["status"],
                  f"{r['disk_bytes'] / 1e9:.2f} GB")
    console.print(t)


# -- info and worker ---------------------------------------------------------------------------------------------
@app.command(epilog="Examples:\n\n  spectool info\n\n  spectool info --json --rpc 192.168.1.20:50052")
def info(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    rpc: Rpc = None,
    debug: Debug = False,
) -> None:
    """What this installation can do: versions, CPU features, backends and devices, GPU offload and RPC, threads,
    and the folders spectool uses."""
    with cli_errors(debug):
        from huggingface_hub import constants

        from spectool import engine
        from spectool.cache import cache_dir
        from spectool.registry import user_file

        engine.set_verbose(debug)
        if rpc:
            engine.add_rpc_workers(engine.parse_endpoints(rpc))
        b, devices = engine.backend_info(), engine.devices()
        data = {"spectool": __version__, **engine.versions(), "system_info": b["system_info"],
                # gpu_offload: a local GPU to offload to (what -ngl auto uses); llama.cpp's own
                # llama_supports_gpu_offload() also says yes for a CPU build with RPC in it
                "gpu_offload": any(d.offloads and not d.remote for d in devices), "rpc": b["rpc"],
                "threads": os.cpu_count() or 1, "devices": [d.to_json() for d in devices],
                "paths": {"cache": str(cache_dir("")), "models_cache": constants.HF_HUB_CACHE,
                          "config": str(user_file())}}
    if as_json:
        print(json.dumps(data, indent=2))
        return
    mib = 1 << 20
    rows = [("spectool", data["spectool"]),
            ("llama.cpp", f"llama-cpp-python {data['llama_cpp_python']}, ggml {data['ggml']} ({data['ggml_commit']})"),
            ("CPU", data["system_info"]),
            ("GPU offload", "yes: -ngl auto offloads every layer" if data["gpu_offload"] else
             "no GPU device (a CPU-only build, or no driver): -ngl auto keeps the layers on the CPU"),
            ("RPC", "built in (spectool worker, --rpc)" if data["rpc"] else engine.REINSTALL_RPC),
            ("threads", f"{data['threads']} by default (-t)")]
    rows += [(f"device {d['name']}", f"{d['type']}, {d['backend']}: {d['description']}; "
              f"{d['memory_total'] // mib} MiB, {d['memory_free'] // mib} MiB free") for d in data["devices"]]
    rows += [(f"{k} folder", v) for k, v in data["paths"].items()]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


@app.command(epilog="Examples:\n\n  spectool worker\n\n  spectool worker --host 0.0.0.0 --port 50052 -t 8\n\n"
             "then, on the machine that runs the models:  spectool run --rpc HOST:50052 ...")
def worker(
    host: Annotated[str, typer.Option("--host", help="Address to listen on (127.0.0.1: this machine only).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 50052,
    threads: Threads = None,
    debug: Debug = False,
) -> None:
    """Lend this machine's GPUs (else its CPU) to `spectool run --rpc` elsewhere: llama.cpp's RPC server."""
    with cli_errors(debug):
        import socket
        import threading

        from spectool import engine

        engine.set_verbose(debug)
        if not engine.backend_info()["rpc"]:
            raise UserError(engine.REINSTALL_RPC)
        try:
            with socket.create_server((host, port)):
                pass
        except OSError as e:
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        if host not in ("127.0.0.1", "localhost"):
            print(f"WARNING: Host ('{host}') is != '127.0.0.1'\n         Never expose the RPC server to an open "
                  "network!\n         This is an experimental feature and is not secure!", file=sys.stderr)
        n = threads or os.cpu_count() or 1
        names = ", ".join(f"{d.name} ({d.description})" for d in engine.worker_devices())
        print(f"spectool worker: serving {names} with {n} threads on {host}:{port}; Ctrl-C stops",
              file=sys.stderr, flush=True)
        server = threading.Thread(target=engine.serve_rpc, args=(host, port, n), daemon=True)
        old = signal.signal(signal.SIGTERM, _on_sigterm)
        # Ctrl-C (SIGINT) stops it even when started from a script's background job, where SIGINT comes ignored and
        # Python then sets no handler of its own
        old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            server.start()
            while server.is_alive():
                server.join(0.2)
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the server thread cannot be joined, so leave now
            print("spectool worker: stopped", file=sys.stderr, flush=True)
            engine.exit_now(143 if isinstance(e, Terminated) else 130)
        finally:
            signal.signal(signal.SIGTERM, old)
            signal.signal(signal.SIGINT, old_int)
        raise UserError(f"llama.cpp's RPC server stopped: {engine.last_log_error() or 'see --debug'}")


# -- bench -------------------------------------------------------------------------------------------------------
@app.command(epilog="Examples:\n\n  spectool bench --pair demo\n\n"
             "  spectool bench -m big.gguf -md small.gguf --prompts prompts.txt --plot speed.png")
def bench(
    model: Model_ = None,
    pair: Pair_ = None,
    model_draft: Draft_ = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="Prompts: JSON lines, or text with prompts separated by lines of '---'.")] = None,
    max_tokens: MaxTokens = 96,
    draft_vocab: Annotated[int, typer.Option(
        "--draft-vocab", min=0, help="Also try the draft pruned to this many tokens (0 = not).")] = 65536,
    ctx_size: Ctx = 4096,
    threads: Threads = None,
    gpu_layers: Ngl = "auto",
    gpu_layers_draft: Ngld = "auto",
    rpc: Rpc = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG chart of the speedups.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    sampled: Annotated[bool, typer.Option(
        "--sampled/--greedy-only", help="Also measure sampling at temperature 0.8 with llama.cpp's defaults, "
        "against llama-cpp-python's own plain sampling.")] = True,
    yes: Yes = False,
    debug: Debug = False,
) -> None:
    """Plain vs speculative decoding on this machine, side by side, with your model(s) and prompts: greedy, and
    sampled (temperature 0.8) against llama-cpp-python's own sampler."""
    with cli_errors(debug):
        _bench(Options.of(locals()), prompts, draft_vocab, plot, as_json, sampled)


def _bench(o: Options, prompts: Path | None, draft_vocab: int, plot: Path | None, as_json: bool,
           with_sampled: bool) -> None:
    from rich.console import Console
    from rich.progress import Progress

    from spectool import bench as B
    from spectool import engine
    from spectool.session import load_models, resolve_models

    texts = B.read_prompts(str(prompts)) if prompts else B.BUILTIN_PROMPTS
    if not texts:
        raise UserError(f"no prompts in {prompts}", code=2)
    with contextlib.ExitStack() as stack:
        m = load_models(o, stack, resolve_models(o), want_draft=True, hooks=hooks())
        if m.draft_error is not None:
            raise m.draft_error
        target, draft, target_ref, draft_ref = m.target, m.draft, m.target_ref, m.draft_ref
        drafts = {0: (draft, None)}
        pruned_vocab = draft_vocab if draft is not None and 0 < draft_vocab < draft.n_vocab else 0
        if pruned_vocab:
            from spectool import prune

            path = prune.pruned_draft(draft.path, pruned_vocab, n_threads=o.threads)
            drafts[pruned_vocab] = (stack.enter_context(engine.Model(
                path, n_ctx=target.n_ctx, n_threads=o.threads, n_gpu_layers=o.gpu_layers_draft, local_only=True)),
                prune.read_ids(path))
        contenders = B.default_contenders(with_draft=draft is not None, pruned_vocab=pruned_vocab)
        adaptive = [c for c in contenders if not c.fixed] if with_sampled else []
        tokens = [target.tokenize(t) for t in texts]
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("benchmarking", total=len(tokens) * (len(contenders) + len(adaptive)))

            def done(name, i):
                progress.update(task, advance=1, description=f"{name}, prompt {i + 1}")

            results = B.run(target, drafts, tokens, contenders, o.max_tokens, on_done=done)
            sampled = []
            if adaptive:
                progress.update(task, description="llama-cpp-python, sampled")
                base = B.reference("llama-cpp-python plain", target.path, texts, o.max_tokens,
                                   B.LLAMA_CPP_SAMPLING, o.threads)
                sampled = B.run(target, drafts, tokens, adaptive, o.max_tokens, on_done=done,
                                sampling=B.LLAMA_CPP_SAMPLING, baseline=base)
    if plot:
        B.plot({"greedy": results, "temperature 0.8": sampled} if sampled else {target.path.name: results},
               str(plot))
    if as_json:
        print(json.dumps({"target": str(target_ref), "draft": str(draft_ref) if draft_ref else None,
                          "prompts": len(texts), "max_tokens": o.max_tokens,
                          "results": [r.to_json() for r in results], "sampled": [r.to_json() for r in sampled],
                          "recommendation": B.recommend(results, contenders)}, indent=2))
        return
    print(B.markdown_table(results, f"{target.path.name}, greedy: {len(texts)} prompts, {o.max_tokens} tokens "
                                    "each; speedups over plain decoding"))
    if sampled:
        print()
        print(B.markdown_table(sampled, "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05: speedups over "
                                        "llama-cpp-python's own plain sampling"))
    print()
    print(B.recommend(results, contenders))


# -- serve -------------------------------------------------------------------------------------------------------
@app.command(epilog="Examples:\n\n  spectool serve --pair demo\n\n"
             "  spectool serve -m big.gguf -md small.gguf --host 0.0.0.0 --port 8080 --api-key SECRET")
def serve(
    model: Model_ = None,
    pair: Pair_ = None,
    model_draft: Draft_ = None,
    spec: Spec_ = Spec.auto,
    max_tokens: MaxTokens = 256,
    temp: Annotated[float, typer.Option("--temp", min=0.0, help="Temperature of requests that give none.")] = 0.0,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    repeat_penalty: RepeatPenalty = 1.0,
    repeat_last_n: RepeatLastN = 64,
    presence_penalty: PresencePenalty = 0.0,
    frequency_penalty: FrequencyPenalty = 0.0,
    seed: Seed = None,
    draft_max: DraftMax = None,
    draft_min: DraftMin = 0,
    draft_p_min: DraftPMin = 0.0,
    draft_vocab: DraftVocab = 0,
    ctx_size: Ctx = 4096,
    threads: Threads = None,
    gpu_layers: Ngl = "auto",
    gpu_layers_draft: Ngld = "auto",
    rpc: Rpc = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (127.0.0.1: this machine only).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8080,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar="SPECTOOL_API_KEY", help="Require 'Authorization: Bearer KEY' on every request.")] = None,
    queue: Annotated[int, typer.Option("--queue", min=0, help="Requests that may wait for their turn; "
                                                              "one more gets a 503.")] = 8,
    yes: Yes = False,
    debug: Debug = False,
) -> None:
    """An OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics) with
    speculative decoding; the options above are the defaults of requests that do not set them."""
    with cli_errors(debug):
        from spectool.serve import serve as run_server
        from spectool.session import open_session

        o = Options.of(locals())
        with open_session(o, hooks()) as s:
            for n in s.notices:
                print(f"spectool: {n}", file=sys.stderr)
            model_id = o.pair or Path(str(s.gen.target.path)).stem
            run_server(s, o, model_id, host, port, api_key, queue, say=lambda line: print(f"spectool: {line}",
                                                                                           file=sys.stderr))


# -- chat --------------------------------------------------------------------------------------------------------
CHAT_HELP = """commands:
  /help          this help
  /stats         statistics of the last reply and of the session
  /reset         forget the conversation (keeps the system prompt)
  /system TEXT   set the system prompt and start over
  /exit          leave (Ctrl-D too); Ctrl-C stops a reply and keeps the session"""


@app.command(epilog="Example:\n\n  spectool chat -m model.gguf --system \"You are terse.\"")
def chat(
    model: Model_ = None,
    pair: Pair_ = None,
    model_draft: Draft_ = None,
    spec: Spec_ = Spec.auto,
    system: Annotated[Optional[str], typer.Option("--system", help="System prompt.")] = None,
    max_tokens: MaxTokens = 512,
    temp: Annotated[float, typer.Option(
        "--temp", min=0.0, help="Temperature; chat samples by default with llama.cpp's (and ollama's) settings: "
        "0.8, top-k 40, top-p 0.95, min-p 0.05. 0 = greedy.")] = 0.8,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    repeat_penalty: RepeatPenalty = 1.0,
    repeat_last_n: RepeatLastN = 64,
    presence_penalty: PresencePenalty = 0.0,
    frequency_penalty: FrequencyPenalty = 0.0,
    seed: Seed = None,
    draft_max: DraftMax = None,
    draft_min: DraftMin = 0,
    draft_p_min: DraftPMin = 0.0,
    draft_vocab: DraftVocab = 0,
    ctx_size: Ctx = 4096,
    threads: Threads = None,
    gpu_layers: Ngl = "auto",
    gpu_layers_draft: Ngld = "auto",
    rpc: Rpc = None,
    color_drafts: ColorDrafts = False,
    yes: Yes = False,
    quiet: Quiet = False,
    debug: Debug = False,
) -> None:
    """Chat in the terminal, with the model's chat template and the conversation kept in the KV cache. Samples
    with llama.cpp's defaults (--temp 0.8, --top-k 40, --top-p 0.95, --min-p 0.05); --temp 0 for greedy."""
    with cli_errors(debug):
        _chat(Options.of(locals()), system, color_drafts, quiet)


def _chat(o: Options, system: str | None, color_drafts: bool, quiet: bool) -> None:
    from spectool.chat import Chat
    from spectool.engine import EngineError
    from spectool.session import open_session
    from spectool.stats import Stats
    from spectool.ui import Display, WaitBar, offload_text, stats_table, summary_line

    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    with open_session(o, hooks()) as s:
        for n in s.notices:
            print(f"spectool: {n}", file=sys.stderr)
        gen, mode = s.gen, s.mode
        session = Chat(gen, system=system, mode=mode, offload=s.offload)
        if session.template is None:
            print("spectool: the model has no chat template; using a plain User:/Assistant: format",
                  file=sys.stderr)
        print(f"spectool chat: {gen.target.path.name} ({mode}, {offload_text(s.offload)}). /help for commands, "
              "/exit to leave.", file=sys.stderr)
        while True:
            try:
                line = input("> ")
            except EOFError:
                print(file=sys.stderr)
                return
            except KeyboardInterrupt:
                print(file=sys.stderr)
                continue
            if not line.strip():
                continue
            if line.startswith("/"):
                cmd, _, arg = line.strip().partition(" ")
                if cmd in ("/exit", "/quit"):
                    return
                elif cmd == "/help":
                    print(CHAT_HELP, file=sys.stderr)
                elif cmd == "/reset":
                    session.reset()
                    print("spectool: conversation cleared", file=sys.stderr)
                elif cmd == "/system":
                    session.set_system(arg.strip())
                    print("spectool: system prompt set; conversation cleared", file=sys.stderr)
                elif cmd == "/stats":
                    _chat_stats(session, stats_table)
                else:
                    print(f"spectool: unknown command {cmd} (/help lists them)", file=sys.stderr)
                continue
            display = Display(Stats(), quiet=True, color_drafts=color_drafts, live=False)
            bar = WaitBar("prompt")  # a long pasted message takes a while
            session.gen.on_prefill = bar.update
            with SigintFlag() as interrupted, display, bar:
                try:
                    for piece, step in session.send(line, interrupted):
                        if step.notice:
                            display.notice(step.notice)
                        display.text(piece[: step.draft_chars], step.source)
                        display.text(piece[step.draft_chars :])
                except KeyboardInterrupt:
                    session.turns[-1].finish_reason = "interrupted"
                except EngineError as e:
                    print(f"spectool: {e}", file=sys.stderr)
                    continue
            if interrupted.terminated:
                raise typer.Exit(143)
            if not quiet:
                print(summary_line(session.turns[-1]), file=sys.stderr)


def _chat_stats(session, stats_table) -> None:
    from rich.console import Console

    console = Console(stderr=True)
    if not session.turns:
        console.print("no replies yet")
        return
    last = session.turns[-1]
    console.print(f"last reply: prompt {last.n_prompt_tokens} tokens, {last.n_prefilled} of them prefilled")
    console.print(stats_table(last))
    n = sum(t.n_generated for t in session.turns)
    secs = sum(t.decode_seconds for t in session.turns)
    console.print(f"session: {len(session.turns)} replies, {n} tokens, {n / secs if secs else 0:.1f} tok/s, "
                  f"{len(session.gen.target.tokens)} tokens in the KV cache")


def main() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    app()


if __name__ == "__main__":
    main()
