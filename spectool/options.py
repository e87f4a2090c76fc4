"""Every option that decides which models run and how they generate, declared once: its flags, help,
bounds, default, and the request field of `spectool serve` that sets it per request. Commands say
which groups they take (`takes`), as llama.cpp's common/arg.cpp lists the tools that get each
option; `--help` reads the default from here. Nothing heavy is imported: `spectool --help` stays
instant.
"""

from __future__ import annotations

import inspect
import math
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

from spectool.core.controller import DRAFT_MAX  # noqa: F401 - the front ends' name for it
from spectool.core.evidence import Mode  # noqa: F401 - --spec's values (drafters/builder.py)

# llama.cpp's temperature (common/common.h: temp 0.80): chat's default and the benchmarks' sampled
# runs. `run` and `serve` default to 0 (greedy) so that pipes, code edits and API calls reproduce.
LLAMA_CPP_TEMP = 0.8
CTX_SIZE = 4096  # -c's default: the context the benchmarks and the pairs' memory figures assume too


class UserError(Exception):
    """Bad input from the user: one line on stderr, exit 1 (or `code`)."""

    def __init__(self, message: str, code: int = 1, option: str | None = None):
        super().__init__(message)
        self.code = code
        self.option = option  # the Options field at fault, if one is


# the groups: a command takes whole groups (and single options by name)
MODELS, DRAFTING, GENERATION, SAMPLING, GRAMMAR, HARDWARE, COMMON = (
    "models", "drafting", "generation", "sampling", "grammar", "hardware", "common")
SERVE = "serve"  # `spectool serve`'s limits on what clients send
LOOKUP_CACHE = "lookup cache"  # `spectool run`'s corpus file
PREDICTION = "prediction"  # `spectool run`'s predicted output

CORPUS_TOKENS = 100_000  # --lookup-corpus-size's default: at most about 90 MB (docs/serve.md)


@dataclass(frozen=True)
class Decl:
    """How one option is spelt on the command line and in a request."""

    flags: tuple[str, ...]
    help: str
    group: str
    min: float | None = None
    max: float | None = None
    metavar: str | None = None
    # the command line's check and normal form (typer callback)
    parse: Callable[[Any], Any] | None = None
    request: str | None = None  # the JSON field of a serve request that sets it

    def check(self, name: str, value):
        """`value` within the bounds, else a UserError naming the option by its first flag (`serve`
        names the request field instead)."""
        if (self.min is not None and value < self.min) or (self.max is not None
                                                           and value > self.max):
            hi = "inf" if self.max is None else f"{self.max:g}"
            raise UserError(f"{self.flags[0]} must be within [{self.min:g}, "
                            f"{hi}]", code=2, option=name)
        return value


def opt(default, *flags: str, help: str, group: str, **decl) -> Any:
    return field(default=default, metadata={"decl": Decl(flags, help, group, **decl)})


def _gpu_layers(value: str) -> str:
    import typer

    from spectool.llama.devices import parse_gpu_layers

    try:
        return str(parse_gpu_layers(value))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def _threads(value: int | None) -> int | None:
    import os
    import sys

    cores = os.cpu_count() or 1
    # llama.cpp takes any number, and crawls (docs/performance.md)
    if value is not None and value > cores:
        print(f"spectool: warning: -t {value} is more threads than this machine's {cores} CPU "
              "cores; llama.cpp slows down when threads outnumber the cores", file=sys.stderr)
    return value


def _flash_attn(value: str) -> str:
    import typer

    if value not in ("auto", "on", "off"):
        raise typer.BadParameter(f"{value!r} is not one of auto, on, off")
    return value


def _rpc(value: str | None) -> str | None:
    if not value:
        return value
    import typer

    from spectool.llama.devices import RpcError, parse_endpoints

    try:
        return ",".join(f"{h}:{p}" for h, p in parse_endpoints(value))
    except RpcError as e:
        raise typer.BadParameter(str(e)) from None


@dataclass
class Options:
    """Which models run and how they generate (llama.cpp's option names), one field per option."""

    # -- models
    model: Optional[str] = opt(None, "--model", "-m", group=MODELS,
                               help="Target model: a .gguf path, hf:OWNER/REPO/FILE[@REV] or a "
                                    "pair name.")
    pair: Optional[str] = opt(None, "--pair", group=MODELS,
                              help="A target/draft pair from models.toml (`spectool models`); "
                              "neither --pair nor -m: the default pair.")
    model_draft: Optional[str] = opt(None, "--model-draft", "-md", "--spec-draft-model",
                                     group=MODELS,
                                     help="Draft model: a .gguf path or hf:... reference.")
    # -- drafting
    spec: Mode = opt(Mode.auto, "--spec", group=DRAFTING,
                     help="How to draft. auto: hybrid with a draft model; an EAGLE-3 or DFlash "
                     "head when -md is one; without -md, the target's MTP heads when it has them, "
                     "else prompt lookup. mtp: the target's own MTP (NextN) heads. eagle3: the "
                     "EAGLE-3 head -md names. dflash: the DFlash head -md names (a block a draft).")
    draft_max: Optional[int] = opt(None, "--draft-max", "--spec-draft-n-max", group=DRAFTING, min=0,
                                   max=64,
                                   help="Most draft tokens per step (default: the pair's, else "
                                        f"{DRAFT_MAX}).")
    draft_min: int = opt(0, "--draft-min", "--spec-draft-n-min", group=DRAFTING, min=0, max=64,
                         help="Fewest draft tokens per step; = --draft-max: a fixed length.")
    draft_p_min: float = opt(0.0, "--draft-p-min", "--spec-draft-p-min", group=DRAFTING, min=0.0,
                             max=1.0,
                             help="Stop drafting below this draft probability.")
    draft_tree: int = opt(0, "--draft-tree", group=DRAFTING, min=0, max=64,
                          help="Draft trees: up to this many other tokens (lookup's other "
                          "followers, a prediction's, a draft model's runner-ups) verified "
                          "beside the draft in one decode, "
                          "where the controller prices them above the chain alone (under a "
                          "grammar, those it takes; no logprobs or penalties). 0 = chains only.")
    draft_vocab: int = opt(0, "--draft-vocab", group=DRAFTING, min=0,
                           help="Prune the draft to this many tokens, its most likely ones (made "
                           "once, cached): a faster draft when its vocabulary is large. 0 = off.")
    lookup_corpus: Optional[bool] = opt(None, "--lookup-corpus/--no-lookup-corpus", group=DRAFTING,
                                        help="Prompt lookup drafts from the text of earlier "
                                        "requests too (one corpus per process, bounded). Default: "
                                        "on for chat and for serve on a loopback --host, off for "
                                        "serve beyond it (a response's speed tells whether its "
                                        "text was seen before: docs/serve.md); run: on with "
                                        "--lookup-cache.")
    lookup_corpus_size: int = opt(CORPUS_TOKENS, "--lookup-corpus-size", group=DRAFTING, min=1,
                                  metavar="TOKENS",
                                  help="Most tokens the corpus of earlier requests keeps; the "
                                       "oldest go first.")
    lookup_cache: Optional[str] = opt(None, "--lookup-cache", group=LOOKUP_CACHE, metavar="FILE",
                                      help="Read the lookup corpus from FILE and write it back, "
                                      "updated, when generation ends (as llama-lookup's -lcd); "
                                      "written whole, never half.")
    prediction: Optional[str] = opt(None, "--prediction", group=PREDICTION, metavar="FILE",
                                    help="The output is expected to be mostly this file's text "
                                    "(the file an edit rewrites): drafted first, the output "
                                    "unchanged (OpenAI's Predicted Outputs).")
    # -- generation
    max_tokens: int = opt(256, "--max-tokens", "-n", "--n-predict", group=GENERATION, min=1,
                          request="max_tokens",
                          help="Most tokens to generate.")
    # -- sampling: llama.cpp's chain (penalties, top-k, top-p, min-p, temperature) and its defaults,
    # but greedy
    temp: float = opt(0.0, "--temp", group=SAMPLING, min=0.0, request="temperature",
                      help="Temperature; 0 = greedy (reproducible). The chain is llama.cpp's: "
                      "penalties, top-k, top-p, min-p, then temperature.")
    top_k: int = opt(40, "--top-k", group=SAMPLING, min=0, request="top_k",
                     help="Top-k sampling; 0 = off.")
    top_p: float = opt(0.95, "--top-p", group=SAMPLING, min=0.0, max=1.0, request="top_p",
                       help="Top-p sampling in (0, 1]; 1 = off.")
    min_p: float = opt(0.05, "--min-p", group=SAMPLING, min=0.0, max=1.0, request="min_p",
                       help="Min-p sampling; 0 = off.")
    repeat_penalty: float = opt(1.0, "--repeat-penalty", group=SAMPLING, min=0.0,
                                request="repeat_penalty",
                                help="Penalise tokens seen in the last --repeat-last-n tokens "
                                "(llama.cpp's rule: logits above 0 divided by it, below 0 "
                                "multiplied); 1 = off.")
    repeat_last_n: int = opt(64, "--repeat-last-n", group=SAMPLING, min=-1, request="repeat_last_n",
                             help="How many recent tokens the penalties look at; 0 = off, -1 = "
                                  "the whole context.")
    presence_penalty: float = opt(0.0, "--presence-penalty", group=SAMPLING, min=-2.0, max=2.0,
                                  request="presence_penalty",
                                  help="Subtract this from the logit of every token seen in the "
                                       "window; 0 = off.")
    frequency_penalty: float = opt(0.0, "--frequency-penalty", group=SAMPLING, min=-2.0, max=2.0,
                                   request="frequency_penalty",
                                   help="Subtract this times its count in the window from a "
                                        "token's logit; 0 = off.")
    seed: Optional[int] = opt(None, "--seed", group=SAMPLING, min=0, request="seed",
                              help="Random seed for sampling: the same seed, the same text.")
    # -- grammar: what the output must be (llama.cpp's flags); at most one of them (grammar_spec)
    grammar: Optional[str] = opt(None, "--grammar", group=GRAMMAR, metavar="GBNF",
                                 help="Constrain the output to this GBNF grammar (llama.cpp's "
                                      "grammar format).")
    grammar_file: Optional[str] = opt(None, "--grammar-file", group=GRAMMAR, metavar="FILE",
                                      help="Constrain the output to the GBNF grammar in this file.")
    json_schema: Optional[str] = opt(None, "--json-schema", "-j", group=GRAMMAR, metavar="SCHEMA",
                                     help="Constrain the output to JSON valid against this JSON "
                                     "schema; '{}' for any JSON value, '{\"type\": "
                                     "\"object\"}' for any object.")
    json_schema_file: Optional[str] = opt(None, "--json-schema-file", "-jf", group=GRAMMAR,
                                          metavar="FILE",
                                          help="Constrain the output to JSON valid against the "
                                          "JSON schema in this file.")
    # -- hardware
    ctx_size: int = opt(CTX_SIZE, "--ctx-size", "-c", group=HARDWARE, min=0,
                        help="Context size in tokens (0 = the model's trained context, less where "
                        "memory would not hold its KV cache).")
    threads: Optional[int] = opt(None, "--threads", "-t", group=HARDWARE, min=1, parse=_threads,
                                  help="CPU threads.")
    flash_attn: str = opt("auto", "--flash-attn", "-fa", group=HARDWARE, metavar="auto|on|off",
                          parse=_flash_attn,
                          help="llama.cpp's flash attention for the target; auto = on a GPU as "
                          "llama.cpp decides, on a CPU whichever kernel this machine runs "
                          "faster for what the model decodes (measured once per model).")
    gpu_layers: str = opt("auto", "--gpu-layers", "-ngl", group=HARDWARE, metavar="N|auto|all",
                          parse=_gpu_layers,
                          help="Target layers to offload to the GPU or RPC workers; auto = all of "
                          "them when there is a device to offload to (an error when they do not "
                          "fit), none otherwise.")
    gpu_layers_draft: str = opt("auto", "--gpu-layers-draft", "-ngld", group=HARDWARE,
                                metavar="N|auto|all",
                                parse=_gpu_layers,
                                help="Draft layers to offload; auto = all of them on a local GPU "
                                "(the draft stays off RPC workers unless there is no local GPU "
                                "and a number is given).")
    rpc: Optional[str] = opt(None, "--rpc", group=HARDWARE, metavar="HOST:PORT[,...]", parse=_rpc,
                             help="Use the devices of these RPC workers (`spectool worker`) for "
                             "the target's layers, as llama.cpp's --rpc does. The weights travel "
                             "over the network on every load.")
    # -- serve
    max_body_bytes: int = opt(0, "--max-body-bytes", group=SERVE, min=0,
                              help="Largest request body in bytes; a larger one gets a 413. 0 = "
                              "64 bytes per token of context.")
    body_timeout: int = opt(30, "--body-timeout", group=SERVE, min=1,
                            help="Seconds a client has to send its whole request body; then a 408 "
                            "and the connection closes.")
    parallel: int = opt(1, "--parallel", "-np", group=SERVE, min=1, max=64,
                        help="Requests generated at once, decoded together in one batch, as "
                        "llama-server's -np: each holds -c / N tokens of context (-c 0: the "
                        "trained context each, memory allowing). Above 1, drafts come from prompt "
                        "lookup only.")
    kv_unified: bool = opt(False, "--kv-unified", "-kvu", group=SERVE,
                           help="With --parallel: one KV buffer for every sequence, as "
                           "llama-server's -kvu: each may hold up to -c tokens, all together -c. "
                           "Decodes of several sequences cost less on a CPU.")
    queue: int = opt(8, "--queue", group=SERVE, min=0,
                     help="Requests that may wait for their turn; one more gets a "
                     "503.")
    keepalive: float = opt(5.0, "--keepalive", group=SERVE, min=0.0, metavar="SECONDS",
                           help="Seconds a stream may stay silent (a long prompt prefilled, a "
                           "tool call held until whole) before a keep-alive is sent: a Messages "
                           "ping, an SSE comment elsewhere. 0 = none.")
    allowed_hosts: Optional[str] = opt(None, "--allowed-hosts", group=SERVE,
                                       metavar="NAME[,NAME...]",
                                       help="Host names requests may reach the server by, besides "
                                       "localhost, loopback addresses and --host ('.example.com': "
                                       "it and its subdomains; '*': any); any other Host header "
                                       "gets a 403 (against DNS rebinding).")
    cors_origins: Optional[str] = opt(None, "--cors-origins", group=SERVE,
                                      metavar="ORIGIN[,ORIGIN...]",
                                      help="Web pages' origins (https://app.example) that may "
                                      "call the server, besides its own pages ('*': any); a "
                                      "request from another origin gets a 403.")
    no_webui: bool = opt(False, "--no-webui", group=SERVE,
                         help="Serve no chat page at / (a 404 there); the APIs are unchanged.")
    # -- common
    yes: bool = opt(False, "--yes", "-y", group=COMMON, help="Download without asking.")
    debug: bool = opt(False, "--debug", group=COMMON, help="Show tracebacks and llama.cpp's log.")

    def sampling(self):
        """verify.Sampling from these options (the one top-p check)."""
        from spectool.core.verify import Sampling

        if self.top_p <= 0.0:
            raise UserError("--top-p must be in (0, 1]", code=2, option="top_p")
        return Sampling(temp=self.temp, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                        repeat_penalty=self.repeat_penalty, repeat_last_n=self.repeat_last_n,
                        presence_penalty=self.presence_penalty,
                        frequency_penalty=self.frequency_penalty)

    def grammar_spec(self):
        """The core.grammar.Grammar that --grammar, --grammar-file, -j or -jf ask for (None: none),
        checked without a model; a bad one, two of them, or an unreadable file is a UserError naming
        the flag."""
        given = [n for n in GRAMMAR_OPTIONS if getattr(self, n) is not None]
        if not given:
            return None
        flags = {n: Options.declared()[n][0].flags[0] for n in GRAMMAR_OPTIONS}
        if len(given) > 1:
            raise UserError("give at most one of "
                            f"{', '.join(flags[n] for n in given)}", code=2, option=given[1])
        name = given[0]
        text, where = getattr(self, name), flags[name]
        if name.endswith("_file"):
            text, where = read_text(Path(text), flags[name], name), f"{flags[name]} {text}"
        from spectool.core.grammar import Grammar, GrammarError

        try:
            return Grammar.gbnf(text) if name.startswith("grammar") else Grammar.json_schema(text)
        except GrammarError as e:
            raise UserError(f"{where}: {e}", code=2, option=name) from None

    def grammar_flag(self) -> str:
        """The flag that asks for the grammar, and its file where it names one."""
        name = next(n for n in GRAMMAR_OPTIONS if getattr(self, n) is not None)
        flag = Options.declared()[name][0].flags[0]
        return f"{flag} {getattr(self, name)}" if name.endswith("_file") else flag

    @classmethod
    def declared(cls) -> dict[str, tuple[Decl, Any, Any]]:
        """name -> (declaration, type, default) of every option."""
        hints = typing.get_type_hints(cls)
        return {f.name: (f.metadata["decl"], hints[f.name], f.default) for f in fields(cls)}


GRAMMAR_OPTIONS = ("grammar", "grammar_file", "json_schema", "json_schema_file")


def is_loopback(host: str) -> bool:
    """Whether an address to listen on reaches only this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def with_corpus_default(o: Options, on: bool) -> Options:
    """`o` with --lookup-corpus decided: as given, else `on` (a command's default: chat's, serve's
    by its --host), and on wherever --lookup-cache names a file. --no-lookup-corpus with
    --lookup-cache is a contradiction."""
    if o.lookup_cache is not None:
        if o.lookup_corpus is False:
            raise UserError("--lookup-cache needs the corpus: leave out --no-lookup-corpus", code=2)
        return replace(o, lookup_corpus=True)
    return o if o.lookup_corpus is not None else replace(o, lookup_corpus=on)


# the most bytes an input file (--prediction, --grammar-file, -jf) or stdin is read for: what is no
# regular file (/dev/zero, a FIFO) may never end
INPUT_BYTES = 64 << 20


def read_bounded(f, what: str) -> bytes:
    """At most INPUT_BYTES of the binary file `f`, else a UserError naming `what` and the bound."""
    data = f.read(INPUT_BYTES + 1)
    if len(data) > INPUT_BYTES:
        raise UserError(f"{what}: over {INPUT_BYTES >> 20} MiB; spectool reads at most that "
                        "much", code=2)
    return data


def read_text(path: Path, flag: str, option: str) -> str:
    """A file's text as UTF-8 (at most INPUT_BYTES), else a UserError naming the flag and the path
    as given (missing, a directory, unreadable, too long, not UTF-8)."""
    try:
        with open(path, "rb") as f:
            return read_bounded(f, f"{flag} {path}").decode("utf-8")
    except UserError as e:
        raise UserError(str(e), code=2, option=option) from None
    except IsADirectoryError:
        raise UserError(f"{flag} {path}: is a directory", code=2, option=option) from None
    except FileNotFoundError:
        raise UserError(f"{flag} {path}: no such file", code=2, option=option) from None
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot read it "
                        f"({e.strerror})", code=2, option=option) from None
    except UnicodeDecodeError as e:
        raise UserError(f"{flag} {path}: not UTF-8 text (byte "
                        f"{e.start})", code=2, option=option) from None


def llama_cpp_sampling():
    """llama.cpp's default sampling: LLAMA_CPP_TEMP and the declared top-k, top-p and min-p."""
    return replace(Options(), temp=LLAMA_CPP_TEMP).sampling()


def _typer_param(name: str, decl: Decl, kind, default) -> inspect.Parameter:
    import typer

    info = typer.Option(*decl.flags, help=decl.help, min=decl.min, max=decl.max,
                        metavar=decl.metavar,
                        callback=decl.parse, rich_help_panel=None if decl.group == COMMON
                        else decl.group.title())
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, info])


def takes(*names: str, **defaults):
    """Decorate a command `fn(o: Options, ...own options)`: the command line gets the options of the
    named groups (or single options), with `defaults` in place of the declared ones; the command
    receives them as `o`."""

    def wrap(fn):
        chosen = {n: d for n, d in Options.declared().items() if n in names or d[0].group in names}
        unknown = set(defaults) - set(chosen)
        if unknown:
            raise TypeError(f"{fn.__name__}: defaults for options it does not take: "
                            f"{sorted(unknown)}")
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for p in list(inspect.signature(fn, eval_str=True).parameters.values())[1:]]
        params = [_typer_param(n, decl, kind, defaults.get(n, default))
                  for n, (decl, kind, default) in chosen.items() if decl.group != COMMON] + own + \
                 [_typer_param(n, decl, kind, default)
                  for n, (decl, kind, default) in chosen.items() if decl.group == COMMON]

        def command(**kwargs):
            o = Options(**{n: kwargs.pop(n) for n in chosen})
            return fn(o, **kwargs)

        command.__name__ = fn.__name__
        command.__doc__ = fn.__doc__
        command.__module__ = fn.__module__
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {}
        return command

    return wrap


def request_options(base: Options, body: dict) -> Options:
    """`base` with the fields a serve request sets (each declaration's `request` name), checked
    against the same bounds as the command line; a bad value raises UserError naming the option (see
    in_request)."""
    changes = {}
    for name, (decl, kind, _) in Options.declared().items():
        if decl.request is None or body.get(decl.request) is None:
            continue
        value, want = body[decl.request], int if kind in (int, Optional[int]) else float
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not math.isfinite(value)) or (
                want is int and value != int(value)):
            raise UserError(f"{decl.flags[0]} must be "
                            f"{'an integer' if want is int else 'a number'}", code=2,
                            option=name)
        changes[name] = decl.check(name, want(value))
    return replace(base, **changes)


def in_request(e: UserError) -> tuple[str, str]:
    """(the request field, the message in its terms) of an error about an option a request set."""
    decl = Options.declared()[e.option or ""][0]
    return decl.request or "", str(e).replace(decl.flags[0], f"'{decl.request}'")
