"""A chat's conversation (`Chat`): multi-turn history kept in the KV cache (repl.py is `spectool
chat` over it).

The conversation is kept as tokens too: a new turn appends only the tokens of the text the template
adds after the last reply (end-of-turn markers, the new user message, the generation prompt), so the
target prefills just those, and prompt lookup searches the earlier turns.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Generator

from spectool.llama.engine import EngineError
from spectool.generate.loop import GenerationConfig, Step, generate_text
from spectool.core.stats import Stats
from spectool.templates import FALLBACK_STOP, render, special_texts, tokenize_rendered


@dataclass
class Chat:
    gen: GenerationConfig
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
        # only what the template added since the last reply
        if self.anchor and text.startswith(self.anchor):
            return self.tokens + m.tokenize(text[len(self.anchor):], add_special=False,
                                            parse_special=True), text
        return tokenize_rendered(m, text, self.bos), text

    def _fit(self, user: str) -> tuple[list[int], str, int]:
        """The prompt for `user` after dropping the oldest turns, as ollama does (never the system
        prompt), until it leaves room for a reply: (tokens, rendered text, turns dropped). An error
        only when the new message alone (with the system prompt) cannot fit: then the conversation
        is kept as it was, every turn and its tokens."""
        n_ctx = self.gen.target.n_ctx
        room = min(self.gen.max_tokens, n_ctx // 4)
        first = 1 if self.messages and self.messages[0]["role"] == "system" else 0
        dropped, kept = 0, (self.messages[:], self.tokens, self.anchor)
        while True:
            prompt, rendered = self._prompt(user)
            if len(prompt) + room <= n_ctx or (len(self.messages) <= first and len(prompt) < n_ctx):
                return prompt, rendered, dropped
            if len(self.messages) <= first:
                self.messages, self.tokens, self.anchor = kept
                raise EngineError(f"the message has {len(prompt)} tokens with the chat template "
                                  f"but the context holds {n_ctx}: shorten it, or raise "
                                  "-c/--ctx-size")
            end = first + 1  # the oldest turn: a user message and what answered it
            while end < len(self.messages) and self.messages[end]["role"] != "user":
                end += 1
            del self.messages[first:end]
            # re-rendered: the KV cache keeps the common prefix (Model.sync)
            self.tokens, self.anchor = [], ""
            dropped += 1

    def send(self, user: str, interrupted: Callable[[], bool] = lambda: False,
             on_prefill: Callable[[int, int], None] | None = None
             ) -> Generator[tuple[str, Step], None, None]:
        """Stream the reply to `user` (`on_prefill` hears the prompt's progress). The turn is kept,
        also when interrupted, with the text produced. When the conversation outgrows the context,
        its oldest turns are dropped, and the first step says so."""
        prompt, rendered, dropped = self._fit(user)
        notice = (f"the conversation outgrew the context ({self.gen.target.n_ctx} tokens): dropped "
                  f"the {dropped} oldest turn{'s' if dropped > 1 else ''}") if dropped else None
        stats = Stats(mode=self.mode, target=str(self.gen.target.path), offload=self.offload)
        self.turns.append(stats)
        reply: list[str] = []
        generated: list[int] = []
        try:
            with contextlib.closing(generate_text(self.gen, prompt, self.stop, stats, interrupted,
                                                  on_prefill)) as pieces:
                for text, step in pieces:
                    reply.append(text)
                    generated += step.tokens
                    if notice:
                        step.notice, notice = "; ".join(filter(None, (notice, step.notice))), None
                    yield text, step
        finally:
            out = "".join(reply)
            self.messages += [{"role": "user", "content": user},
                              {"role": "assistant", "content": out}]
            # tokens and text agree: extend next turn
            if self.gen.target.detokenize(generated) == out:
                self.tokens, self.anchor = prompt + generated, rendered + out
            # cut by a stop string: re-tokenize next turn (the KV cache prefix is still reused)
            else:
                self.tokens, self.anchor = [], ""
