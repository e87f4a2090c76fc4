"""The command line: the Typer app and its commands, one-line errors, the chat REPL, the live
display, signals and `info`. Nothing else in spectool imports it."""

from spectool.cli.commands import app, main

__all__ = ["app", "main"]
