"""How the command line ends on an error: one line on stderr (with a hint where one helps) and an
exit code, never a traceback unless --debug; Ctrl-C exits 130, SIGTERM 143, a closed pipe 141."""

from __future__ import annotations

import contextlib
import os
import sys

import typer

from spectool.options import UserError
from spectool.cli.signals import Terminated


def error_hints() -> dict[type[BaseException], str]:
    """The errors a command may end with, each with its hint ("" for none), the first match wins;
    any other error's hint is to run with --debug."""
    from spectool.drafters.builder import PolicyError
    from spectool.llama.engine import DecodeError, DoesNotFit, ModelLoadError
    from spectool.llama.devices import RpcError
    from spectool.models.hub import HubError
    from spectool.models.registry import RegistryError

    return {
        UserError: "", PolicyError: "", HubError: "", RegistryError: "", RpcError: "",
        DoesNotFit: "",
        ModelLoadError: "check the path, or that the file is a complete GGUF model",
        DecodeError: "try a smaller --ctx-size or fewer --gpu-layers",
        UnicodeDecodeError: "spectool reads UTF-8 text",
        OSError: "",
    }


@contextlib.contextmanager
def cli_errors(debug: bool):
    """Every command's body: errors become one line (see error_hints), interrupts exit 130 / 143."""
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt as e:
        print("spectool: interrupted", file=sys.stderr)
        raise typer.Exit(143 if isinstance(e, Terminated) else 130) from None
    # the reader went away (`| head`): stop at once and say nothing, as cat does
    except BrokenPipeError:
        # nothing left to flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(141) from None
    except Exception as e:  # noqa: BLE001 - mapped to one line by the error table
        if debug:
            raise
        hint = next((h for t, h in error_hints().items() if isinstance(e, t)),
                    "run with --debug for the full traceback")
        print(f"error: {e}{f' ({hint})' if hint else ''}".replace("\n", " "), file=sys.stderr)
        from spectool.drafters.builder import PolicyError
        from spectool.models.registry import RegistryError

        coded = (UserError, RegistryError, PolicyError)  # each with the exit code it ends with
        raise typer.Exit(e.code if isinstance(e, coded) else 1) from None
