"""The command line: parse options, load models, run the loop, hand its events to the display.

Heavy modules (llama_cpp, numpy, huggingface_hub) are imported inside commands so `spectool --help` is instant.
"""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
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


class Spec(str, Enum):
    auto = "auto"
    draft = "draft"
    lookup = "lookup"
    hybrid = "hybrid"
    none = "none"


class UserError(Exception):
    """Bad input from the user: one line on stderr, exit 1 (or `code`)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


# -- shared option aliases ---------------------------------------------------------------------------------------
Model_ = Annotated[Optional[str], typer.Option("--model", "-m", help="Target model: a local .gguf path.")]
Draft_ = Annotated[Optional[str], typer.Option("--model-draft", "-md", help="Draft model: a local .gguf path.")]
Spec_ = Annotated[Spec, typer.Option("--spec", help="auto: hybrid with a draft model, lookup without one.")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Most tokens to generate.")]
Temp = Annotated[float, typer.Option("--temp", min=0.0, help="Temperature; 0 = greedy.")]
TopK = Annotated[int, typer.Option("--top-k", min=0, help="Top-k sampling; 0 = off.")]
TopP = Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Top-p sampling in (0, 1]; 1 = off.")]
MinP = Annotated[float, typer.Option("--min-p", min=0.0, max=1.0, help="Min-p sampling; 0 = off.")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Random seed for sampling (reproducible runs).")]
DraftMax = Annotated[int, typer.Option("--draft-max", min=0, max=64, help="Most draft tokens per step.")]
DraftMin = Annotated[
    int, typer.Option("--draft-min", min=0, max=64, help="Fewest draft tokens per step; = --draft-max: fixed length.")
]
DraftPMin = Annotated[
    float, typer.Option("--draft-p-min", min=0.0, max=1.0, help="Stop drafting below this draft probability.")
]
Ctx = Annotated[int, typer.Option("--ctx-size", "-c", min=0, help="Context size in tokens (0 = the model's).")]
Threads = Annotated[Optional[int], typer.Option("--threads", "-t", min=1, help="CPU threads.")]
Ngl = Annotated[int, typer.Option("--gpu-layers", "-ngl", help="Target layers to offload to the GPU (-1 = all).")]
Ngld = Annotated[int, typer.Option("--gpu-layers-draft", "-ngld", help="Draft layers to offload to the GPU.")]
StatsJson = Annotated[Optional[Path], typer.Option("--stats-json", help="Write generation statistics here.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks and llama.cpp's log.")]
Stop = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop when this text appears (repeatable).")]


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
    from spectool.engine import DecodeError, ModelLoadError

    return {
        UserError: "",
        ModelLoadError: "check the path, or that the file is a complete GGUF model",
        DecodeError: "try a smaller --ctx-size or fewer --gpu-layers",
        UnicodeDecodeError: "spectool reads UTF-8 text",
        OSError: "",
    }


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


def write_json_atomic(path: Path, obj) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def build_drafter(spec: Spec, target, draft_model, p_min: float, notices: list[str]):
    """The drafter for a mode; falls back to prompt lookup when a draft model is missing (unless demanded)."""
    from spectool.drafters import DraftModel, Hybrid, PromptLookup

    if spec is Spec.none:
        return None, "none"
    if spec is Spec.auto:
        spec = Spec.hybrid if draft_model is not None else Spec.lookup
    if spec in (Spec.draft, Spec.hybrid) and draft_model is None:
        if spec is Spec.draft:
            raise UserError("--spec draft needs a draft model (-md MODEL.gguf)", code=2)
        notices.append("no draft model: using prompt lookup")
        spec = Spec.lookup
    if spec is Spec.lookup:
        return PromptLookup(), "lookup"
    dm = DraftModel(draft_model, p_min=p_min)
    return (dm, "draft") if spec is Spec.draft else (Hybrid(PromptLookup(), dm), "hybrid")


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
    model_draft: Draft_ = None,
    spec: Spec_ = Spec.auto,
    max_tokens: MaxTokens = 256,
    temp: Temp = 0.0,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    seed: Seed = None,
    draft_max: DraftMax = 8,
    draft_min: DraftMin = 0,
    draft_p_min: DraftPMin = 0.0,
    ctx_size: Ctx = 4096,
    threads: Threads = None,
    gpu_layers: Ngl = 0,
    gpu_layers_draft: Ngld = 0,
    stop: Stop = None,
    stats_json: StatsJson = None,
    quiet: Quiet = False,
    debug: Debug = False,
) -> None:
    """Generate text once: stream it to stdout, statistics to stderr."""
    try:
        _run(**locals())
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - mapped to one line by the error table
        _fail(e, debug)


def _run(
    prompt, model, model_draft, spec, max_tokens, temp, top_k, top_p, min_p, seed, draft_max, draft_min,
    draft_p_min, ctx_size, threads, gpu_layers, gpu_layers_draft, stop, stats_json, quiet, debug,
) -> None:
    if top_p <= 0.0:
        raise UserError("--top-p must be in (0, 1]", code=2)
    if draft_min > draft_max:
        raise UserError("--draft-min must not exceed --draft-max", code=2)
    text = read_prompt(prompt)
    if not model:
        raise UserError("no model given: pass -m MODEL.gguf", code=2)

    from spectool import engine
    from spectool.controller import Controller
    from spectool.speculative import Generation, generate_text
    from spectool.stats import Stats
    from spectool.verify import Sampling

    engine.set_verbose(debug)
    notices: list[str] = []
    with engine.Model(model, n_ctx=ctx_size, n_threads=threads, n_gpu_layers=gpu_layers) as target:
        draft_model = None
        if model_draft and spec is not Spec.none and spec is not Spec.lookup:
            try:
                draft_model = engine.Model(
                    model_draft, n_ctx=target.n_ctx, n_threads=threads, n_gpu_layers=gpu_layers_draft
                )
            except engine.EngineError as e:
                if spec is Spec.draft:
                    raise
                notices.append(f"draft model not loaded ({e}); using prompt lookup")
        try:
            drafter, mode = build_drafter(spec, target, draft_model, draft_p_min, notices)
            if not target.can_rollback and drafter is not None:
                notices.append(f"{target.architecture} cannot roll back its cache: plain decoding")
                drafter, mode = None, "none"
            for n in notices:
                print(f"spectool: {n}", file=sys.stderr)
            stats = Stats(mode=mode, target=str(model), draft=str(model_draft) if draft_model else None)
            g = Generation(
                target,
                drafter,
                Sampling(temp, top_k, top_p, min_p),
                Controller(k_max=draft_max, k_min=draft_min, adaptive=draft_min != draft_max),
                max_tokens=max_tokens,
                seed=seed,
            )
            tokens = target.tokenize(text, add_special=True, parse_special=True)
            out = sys.stdout
            code = 0
            wrote_newline = True
            try:
                for piece, step in generate_text(g, tokens, stop or (), stats):
                    if step.notice:
                        print(f"spectool: {step.notice}", file=sys.stderr)
                    if piece:
                        out.write(piece)
                        out.flush()
                        wrote_newline = piece.endswith("\n")
            except KeyboardInterrupt:
                stats.finish_reason = "interrupted"
                code = 130
            if not wrote_newline:
                out.write("\n")
            out.flush()
            if stats_json:
                write_json_atomic(stats_json, stats.to_json())
            if not quiet:
                print(summary_line(stats), file=sys.stderr)
            if code:
                raise typer.Exit(code)
        finally:
            if draft_model is not None:
                draft_model.close()


def summary_line(st) -> str:
    return (
        f"[{st.mode}] {st.n_generated} tokens in {st.decode_seconds:.2f}s = {st.tokens_per_second:.1f} tok/s; "
        f"drafted {st.n_drafted}, accepted {st.n_accepted} ({100 * st.acceptance_rate:.0f}%); "
        f"{st.mean_accepted_length:.2f} tokens/step; prompt {st.n_prompt_tokens} tokens in "
        f"{st.prompt_seconds:.2f}s; finish: {st.finish_reason}"
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
