"""Chat: the model's chat template (rendered in jinja2's sandbox), multi-turn history kept in the KV cache, the
REPL with its slash commands.

The conversation is kept as tokens too: a new turn appends only the tokens of the text the template adds after
the last reply (end-of-turn markers, the new user message, the generation prompt), so the target prefills just
those, and prompt lookup searches the earlier turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

from spectool.llama.engine import EngineError
from spectool.core.speculative import Generation, Step, generate_text
from spectool.core.stats import Stats

if TYPE_CHECKING:
    from spectool.session import Session

# without a chat template the conversation is "User: ... / Assistant: ..." lines: a reply ends where the model
# starts the next turn, of either side (a base model, asked something, tends to write both)
FALLBACK_STOP = ["\nUser:", "\nAssistant:"]


class TemplateError(EngineError):
    """The model's chat template failed to render (or reached for something the sandbox forbids)."""


def render(template: str | None, messages: list[dict], *, add_generation_prompt: bool, bos: str = "",
           eos: str = "", tools: list[dict] | None = None) -> str:
    """The conversation as the model expects it, with the function `tools` a request offers (the template's
    `tools`). Templates from GGUF files are untrusted: they run in jinja2's ImmutableSandboxedEnvironment. Without a
    template, a plain "User:/Assistant:" format."""
    if template is None:
        out = []
        for m in messages:
            if m["role"] == "system":
                out.append(m["content"] + "\n\n")
            else:
                out.append(f"{'User' if m['role'] == 'user' else 'Assistant'}: {m['content']}\n")
        if add_generation_prompt:
            out.append("Assistant:")
        return "".join(out)

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(f"the chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = tojson
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos, tools=tools
        )
    except jinja2.exceptions.SecurityError as e:
        raise TemplateError(f"the model's chat template tried something unsafe and was stopped: {e}") from None
    except jinja2.exceptions.TemplateError as e:
        raise TemplateError(f"the model's chat template failed: {e}") from None


def tojson(value, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False):
    """The `tojson` templates are written for (transformers'): plain json.dumps, not jinja2's HTML-escaping one,
    which would write a tool's '<' as \\u003c."""
    import json

    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def special_texts(model) -> tuple[str, str]:
    """The BOS and EOS tokens' text (templates write them)."""
    info = model.vocab_info()
    bos = info.texts[info.bos].decode("utf-8", "replace") if 0 <= info.bos < info.n_tokens else ""
    eos = info.texts[info.eos].decode("utf-8", "replace") if 0 <= info.eos < info.n_tokens else ""
    return bos, eos


def tokenize_rendered(model, text: str, bos: str) -> list[int]:
    """A rendered conversation as tokens, with a BOS in front unless the template wrote one."""
    return model.tokenize(text, add_special=not (bos and text.startswith(bos)), parse_special=True)


def prompt_tokens(model, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """A whole conversation, rendered with the model's chat template (and `tools`) and a generation prompt, as
    tokens."""
    bos, eos = special_texts(model)
    return tokenize_rendered(model, render(model.chat_template(), messages, add_generation_prompt=True, bos=bos,
                                           eos=eos, tools=tools), bos)


@dataclass
class Chat:
    gen: Generation
    system: str | None = None
    mode: str = "none"
    messages: list[dict] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the conversation so far, as the target saw it
    anchor: str = ""  # the rendered conversation up to the end of the last reply ("" = unknown)
    turns: list[Stats] = field(default_factory=list)
    offload: dict | None = None  # where the weights went (session.Session.offload), for /stats

    def __post_init__(self):
        m = self.gen.target
        self.template = m.chat_template()
        self.bos, self.eos = special_texts(m)
        self.stop = list(FALLBACK_STOP) if self.template is None else []
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.tokens, self.anchor = [], ""

    def set_system(self, text: str) -> None:
        self.system = text or None
        self.reset()

    def _prompt(self, user: str) -> tuple[list[int], str]:
        msgs = self.messages + [{"role": "user", "content": user}]
        text = render(self.template, msgs, add_generation_prompt=True, bos=self.bos, eos=self.eos)
        m = self.gen.target
        if self.anchor and text.startswith(self.anchor):  # only what the template added since the last reply
            return self.tokens + m.tokenize(text[len(self.anchor):], add_special=False, parse_special=True), text
        return tokenize_rendered(m, text, self.bos), text

    def _fit(self, user: str) -> tuple[list[int], str, int]:
        """The prompt for `user` after dropping the oldest turns, as ollama does (never the system prompt), until
        it leaves room for a reply: (tokens, rendered text, turns dropped). An error only when the new message
        alone (with the system prompt) cannot fit."""
        n_ctx = self.gen.target.n_ctx
        room = min(self.gen.max_tokens, n_ctx // 4)
        first = 1 if self.messages and self.messages[0]["role"] == "system" else 0
        dropped = 0
        while True:
            prompt, rendered = self._prompt(user)
            if len(prompt) + room <= n_ctx or (len(self.messages) <= first and len(prompt) < n_ctx):
                return prompt, rendered, dropped
            if len(self.messages) <= first:
                raise EngineError(f"the message has {len(prompt)} tokens with the chat template but the context "
                                  f"holds {n_ctx}: shorten it, or raise -c/--ctx-size")
            end = first + 1  # the oldest turn: a user message and what answered it
            while end < len(self.messages) and self.messages[end]["role"] != "user":
                end += 1
            del self.messages[first:end]
            self.tokens, self.anchor = [], ""  # re-rendered: the KV cache keeps the common prefix (Model.sync)
            dropped += 1

    def send(self, user: str, interrupted: Callable[[], bool] = lambda: False) -> Iterator[tuple[str, Step]]:
        """Stream the reply to `user`. The turn is kept, also when interrupted, with the text produced. When the
        conversation outgrows the context, its oldest turns are dropped, and the first step says so."""
        prompt, rendered, dropped = self._fit(user)
        notice = (f"the conversation outgrew the context ({self.gen.target.n_ctx} tokens): dropped the "
                  f"{dropped} oldest turn{'s' if dropped > 1 else ''}") if dropped else None
        stats = Stats(mode=self.mode, target=str(self.gen.target.path), offload=self.offload)
        self.turns.append(stats)
        reply: list[str] = []
        generated: list[int] = []
        try:
            for text, step in generate_text(self.gen, prompt, self.stop, stats, interrupted):
                reply.append(text)
                generated += step.tokens
                if notice:
                    step.notice, notice = "; ".join(filter(None, (notice, step.notice))), None
                yield text, step
        finally:
            out = "".join(reply)
            self.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": out}]
            if self.gen.target.detokenize(generated) == out:  # tokens and text agree: extend next turn
                self.tokens, self.anchor = prompt + generated, rendered + out
            else:  # cut by a stop string: re-tokenize next turn (the KV cache prefix is still reused)
                self.tokens, self.anchor = [], ""


HELP = """commands:
  /help          this help
  /stats         statistics of the last reply and of the session
  /reset         forget the conversation (keeps the system prompt)
  /system TEXT   set the system prompt and start over
  /exit          leave (Ctrl-D too); Ctrl-C stops a reply and keeps the session"""


def repl(s: Session, system: str | None, color_drafts: bool, quiet: bool, say: Callable[[str], None]) -> int:
    """`spectool chat` over a loaded Session: read a line, stream the reply to stdout, the summary and
    messages to stderr (`say`). Returns the exit code (0; 143 after SIGTERM)."""
    import sys

    from spectool.signals import SigintFlag, Terminated
    from spectool.ui import Display, WaitBar, offload_text, summary_line

    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    chat = Chat(s.gen, system=system, mode=s.mode, offload=s.offload)
    if chat.template is None:
        say("the model has no chat template; using a plain User:/Assistant: format")
    print(f"spectool chat: {s.gen.target.path.name} ({s.mode}, {offload_text(s.offload)}). /help for commands, "
          "/exit to leave.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt as e:  # Ctrl-C at the prompt: a fresh line; SIGTERM: leave, as during a reply
            print(file=sys.stderr)
            if isinstance(e, Terminated):
                return 143
            continue
        if not line.strip():
            continue
        if line.startswith("/"):
            cmd, _, arg = line.strip().partition(" ")
            if cmd in ("/exit", "/quit"):
                return 0
            elif cmd == "/help":
                print(HELP, file=sys.stderr)
            elif cmd == "/reset":
                chat.reset()
                say("conversation cleared")
            elif cmd == "/system":
                chat.set_system(arg.strip())
                say("system prompt set; conversation cleared")
            elif cmd == "/stats":
                _stats(chat)
            else:
                say(f"unknown command {cmd} (/help lists them)")
            continue
        display = Display(Stats(), quiet=True, color_drafts=color_drafts, live=False)
        bar = WaitBar("prompt")  # a long pasted message takes a while
        chat.gen.on_prefill = bar.update
        with SigintFlag() as interrupted, display, bar:
            try:
                display.stream(chat.send(line, interrupted))
            except KeyboardInterrupt:
                chat.turns[-1].finish_reason = "interrupted"
            except EngineError as e:
                say(str(e))
                continue
        if interrupted.terminated:
            return 143
        if not quiet:
            print(summary_line(chat.turns[-1]), file=sys.stderr)


def _stats(chat: Chat) -> None:
    from rich.console import Console

    from spectool.ui import stats_table

    console = Console(stderr=True)
    if not chat.turns:
        console.print("no replies yet")
        return
    last = chat.turns[-1]
    console.print(f"last reply: prompt {last.n_prompt_tokens} tokens, {last.n_prefilled} of them prefilled")
    console.print(stats_table(last))
    n = sum(t.n_generated for t in chat.turns)
    secs = sum(t.decode_seconds for t in chat.turns)
    console.print(f"session: {len(chat.turns)} replies, {n} tokens, {n / secs if secs else 0:.1f} tok/s, "
                  f"{len(chat.gen.target.tokens)} tokens in the KV cache")
