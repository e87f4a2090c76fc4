"""`spectool chat`'s REPL: read a line, stream the reply to stdout, its summary and messages to
stderr; the slash commands."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable

from spectool.cli.chat import Chat
from spectool.cli.display import Display, WaitBar, offload_text, stats_table, summary_line
from spectool.cli.signals import SigintFlag, Terminated
from spectool.core.stats import Stats
from spectool.llama.engine import EngineError
from spectool.session import Session

HELP = """commands:
  /help          this help
  /stats         statistics of the last reply and of the session
  /reset         forget the conversation (keeps the system prompt)
  /system TEXT   set the system prompt and start over
  /exit          leave (Ctrl-D too); Ctrl-C stops a reply and keeps the session"""

LEAVE = object()  # what a command answers to end the session


def repl(s: Session, system: str | None, color_drafts: bool, quiet: bool,
         say: Callable[[str], None]) -> int:
    """`spectool chat` over a loaded Session. Returns the exit code (0; 143 after SIGTERM)."""
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    chat = Chat(s.gen, system=system, mode=s.mode, offload=s.offload)
    if chat.template is None:
        say("the model has no chat template; using a plain User:/Assistant: format")
    print(f"spectool chat: {s.gen.target.path.name} ({s.mode}, {offload_text(s.offload)}). /help "
          "for commands, /exit to leave.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        # Ctrl-C at the prompt: a fresh line; SIGTERM: leave, as during a reply
        except KeyboardInterrupt as e:
            print(file=sys.stderr)
            if isinstance(e, Terminated):
                return 143
            continue
        if not line.strip():
            continue
        if line.startswith("/"):
            if command(chat, line, say) is LEAVE:
                return 0
            continue
        code = reply(chat, line, color_drafts, quiet, say)
        if code:
            return code


def command(chat: Chat, line: str, say: Callable[[str], None]):
    """A slash command; LEAVE for /exit."""
    cmd, _, arg = line.strip().partition(" ")
    if cmd in ("/exit", "/quit"):
        return LEAVE
    if cmd == "/help":
        print(HELP, file=sys.stderr)
    elif cmd == "/reset":
        chat.reset()
        say("conversation cleared")
    elif cmd == "/system":
        chat.set_system(arg.strip())
        say("system prompt set; conversation cleared")
    elif cmd == "/stats":
        show_stats(chat)
    else:
        say(f"unknown command {cmd} (/help lists them)")
    return None


def reply(chat: Chat, line: str, color_drafts: bool, quiet: bool,
          say: Callable[[str], None]) -> int:
    """The reply to one message, streamed; a Ctrl-C stops it and keeps the session. The exit code
    where the session ends (143 after SIGTERM), else 0."""
    display = Display(Stats(), quiet=True, color_drafts=color_drafts, live=False)
    bar = WaitBar("prompt")  # a long pasted message takes a while
    with SigintFlag() as interrupted, display, bar:
        # closed whatever happens: the loop then writes how the reply ended
        try:
            with contextlib.closing(chat.send(line, interrupted, bar.update)) as pieces:
                display.stream(pieces)
        except KeyboardInterrupt:
            pass
        except EngineError as e:
            say(str(e))
            return 0
    if interrupted.terminated:
        return 143
    if not quiet:
        print(summary_line(chat.turns[-1]), file=sys.stderr)
    return 0


def show_stats(chat: Chat) -> None:
    """/stats: the last reply's statistics and the session's."""
    from rich.console import Console

    console = Console(stderr=True)
    if not chat.turns:
        console.print("no replies yet")
        return
    last = chat.turns[-1]
    console.print(f"last reply: prompt {last.n_prompt_tokens} tokens, {last.n_prefilled} of them "
                  "prefilled")
    console.print(stats_table(last))
    n = sum(t.n_generated for t in chat.turns)
    secs = sum(t.decode_seconds for t in chat.turns)
    console.print(f"session: {len(chat.turns)} replies, {n} tokens, {n / secs if secs else 0:.1f} "
                  f"tok/s, {len(chat.gen.target.tokens)} tokens in the KV cache")
