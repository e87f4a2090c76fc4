"""Chat templates: a conversation rendered as the model expects it, with the template from its GGUF
metadata (jinja2's sandbox: templates are untrusted), or a plain "User:/Assistant:" format where it
has none; and as tokens. What the command line's chat and the server share."""

from __future__ import annotations

from spectool.llama.engine import EngineError

# without a chat template the conversation is "User: ... / Assistant: ..." lines: a reply ends where
# the model starts the next turn, of either side (a base model, asked something, tends to write
# both)
FALLBACK_STOP = ["\nUser:", "\nAssistant:"]


class TemplateError(EngineError):
    """The model's chat template failed to render (or reached for something the sandbox forbids)."""


def render(template: str | None, messages: list[dict], *, add_generation_prompt: bool,
           bos: str = "",
           eos: str = "", tools: list[dict] | None = None) -> str:
    """The conversation as the model expects it, with the function `tools` a request offers (the
    template's `tools`). Templates from GGUF files are untrusted: they run in jinja2's
    ImmutableSandboxedEnvironment. Without a template, a plain "User:/Assistant:" format."""
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
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos,
            eos_token=eos, tools=tools
        )
    except jinja2.exceptions.SecurityError as e:
        raise TemplateError("the model's chat template tried something unsafe and was stopped: "
                            f"{e}") from None
    except jinja2.exceptions.TemplateError as e:
        raise TemplateError(f"the model's chat template failed: {e}") from None


def tojson(value, ensure_ascii: bool = False, indent: int | None = None, separators=None,
           sort_keys: bool = False):
    """The `tojson` templates are written for (transformers'): plain json.dumps, not jinja2's
    HTML-escaping one, which would write a tool's '<' as \\u003c."""
    import json

    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


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
    """A whole conversation, rendered with the model's chat template (and `tools`) and a generation
    prompt, as tokens."""
    bos, eos = special_texts(model)
    return tokenize_rendered(model,
                             render(model.chat_template(), messages, add_generation_prompt=True,
                                    bos=bos,
                                           eos=eos, tools=tools), bos)
