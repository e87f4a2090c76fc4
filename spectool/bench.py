"""Plain vs speculative, side by side, on one machine: the engine of `spectool bench` and
benchmarks/.

Every contender decodes the same prompts with the same token budget and sampling settings (greedy,
or llama.cpp's sampling defaults); decode speed excludes prompt processing and is timed the way a
user sees a stream: from the first token out to the last, like llama-cpp-python's own generation
(`reference`), which is timed the same way; each speedup is against a baseline measured in the same
run, on the same prompts.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from spectool.core.costs import Costs
from spectool.core.controller import Controller
from spectool.options import CTX_SIZE, DRAFT_MAX, Mode, UserError, llama_cpp_sampling
from spectool.models.registry import PAIR_DRAFT_MAX
from spectool.drafters.builder import drafter_for
from spectool.generate.loop import GenerationConfig, speculative_generate
from spectool.core.stats import Rates, Stats
from spectool.core.verify import Sampling

if TYPE_CHECKING:
    import numpy as np

    from spectool.llama.engine import Model

LLAMA_CPP_SAMPLING = llama_cpp_sampling()  # llama.cpp's default sampling (options.py)

BUILTIN_PROMPTS = [
    "def bubble_sort(items):\n    n = len(items)\n    for i in range(n):\n        for j in "
    "range(n - i - 1):\n            if items[j] > items[j + 1]:\n                items[j], "
    "items[j + 1] = items[j + 1], items[j]\n    return items\n\n# The same function with the "
    "parameter renamed to values:\n",
    "The Great Wall of China is a series of fortifications built across the historical northern "
    "borders of ancient Chinese states. Several walls were built from as early as the 7th century "
    "BC.\n\nSummary:",
    "Question: Why is the sky blue?\nAnswer:",
    "Once upon a time, in a small village by the sea,",
]


@dataclass
class Contender:
    name: str
    mode: Mode
    k_max: int = 0  # most drafts per step (0 with mode none)
    fixed: bool = False
    draft_vocab: int = 0  # > 0: the draft pruned to this many tokens (see prune.py)
    tree: int = 0  # > 0: draft trees of up to this many siblings a step (--draft-tree)
    audit: bool = True  # the controller's picks held up against fixed policies (core/audit.py)

    def generation(self, target, drafts: dict, max_tokens: int, costs: Costs | None = None,
                   sampling: Sampling = Sampling(), seed: int | None = None,
                   through_text: bool = False) -> GenerationConfig:
        """`drafts` maps a draft vocabulary size (0: the full draft) to (Model, kept ids or None);
        `costs` is the table of measured batch costs to start from and add to; `through_text`:
        the draft's vocabulary is another, so it drafts through text (drafters/text.py)."""
        model, ids = drafts.get(self.draft_vocab, (None, None))
        drafter, _ = drafter_for(Mode(self.mode), model, ids=ids, n_target=target.n_vocab,
                                 text_of=target if through_text and model is not None else None,
                                 tree=self.tree > 0)
        ctl = Controller(k_max=self.k_max, k_min=self.k_max if self.fixed else 0,
                         adaptive=not self.fixed, audit=self.audit,
                         costs=costs if costs is not None else Costs())
        return GenerationConfig(target, drafter, sampling, ctl, max_tokens=max_tokens, seed=seed,
                                draft_tree=self.tree)

    @property
    def flags(self) -> str:
        """The `spectool run` options that reproduce this contender."""
        if self.mode == Mode.none:
            return "--spec none"
        k = (
            f"--draft-min {self.k_max} --draft-max {self.k_max}"
            if self.fixed
            else f"--draft-max {self.k_max}"
        )
        return (f"--spec {Mode(self.mode).value} {k}"
                + (f" --draft-vocab {self.draft_vocab}" if self.draft_vocab else "")
                + (f" --draft-tree {self.tree}" if self.tree else ""))


# the siblings a step's draft tree may hold in the bench's tree rows: the bench's target is loaded
# with a sequence for each leaf (every contender decodes on it)
TREE = 8


def default_contenders(with_draft: bool, pruned_vocab: int = 0,
                       pair_draft_max: int = PAIR_DRAFT_MAX) -> list[Contender]:
    """spectool's modes as `spectool run` runs them (lookup up to DRAFT_MAX, the draft model up to
    the pair's draft_max, hybrid twice that), lookup with draft trees (--draft-tree TREE), and fixed
    draft lengths beside them."""
    L, D, H = Mode.lookup, Mode.draft, Mode.hybrid
    out = [Contender("plain", Mode.none), Contender("lookup", L, DRAFT_MAX),
           Contender("lookup, trees", L, DRAFT_MAX, tree=TREE)]
    out += [Contender(f"lookup k={k}", L, k, True) for k in (4, 8)]
    if with_draft:
        out += [Contender("draft", D, pair_draft_max), Contender("hybrid", H, 2 * pair_draft_max)]
        out += [Contender(f"draft k={k}", D, k, True) for k in (2, 4)]
    if with_draft and pruned_vocab:
        out += [Contender(f"draft, {pruned_vocab} "
                          "tokens", D, pair_draft_max, draft_vocab=pruned_vocab),
                Contender(f"hybrid, {pruned_vocab} "
                          "tokens", H, 2 * pair_draft_max, draft_vocab=pruned_vocab)]
    return out


@dataclass
class Result(Rates):
    contender: str
    prompts: int = 0
    generated: int = 0  # every token generated
    tokens: int = 0  # the tokens timed in `seconds` (those after the first, see the module)
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    identical: int = 0  # prompts whose text equals plain decoding's
    failed: int = 0  # prompts on which the contender crashed (external contenders)
    speedup: float = 0.0
    outputs: list[list[int]] = field(default_factory=list, repr=False)

    def counters(self) -> tuple[int, int, int, int, int, float]:
        """Speed is on the stream's clock (see the module)."""
        return self.drafted, self.accepted, self.generated, self.steps, self.tokens, self.seconds

    def add(self, st: Stats, tokens: list[int], timed_tokens: int, seconds: float) -> None:
        """One prompt's generation: `timed_tokens` came out in `seconds` (the stream's clock, see
        the module)."""
        self.prompts += 1
        self.generated += st.n_generated
        self.tokens += timed_tokens
        self.seconds += seconds
        self.drafted += st.n_drafted
        self.accepted += st.n_accepted
        self.steps += st.n_steps
        self.outputs.append(tokens)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("outputs")
        d |= {"tokens_per_second": round(self.tokens_per_second, 3),
              "acceptance": round(self.acceptance_rate, 4),
              "mean_accepted_length": round(self.mean_accepted_length, 4)}
        return d


def speedups(results: Sequence[Result], baseline: str = "plain", greedy: bool = True) -> None:
    """Fill `speedup` (tokens/s over the baseline's, same run) and, greedy, `identical` (outputs
    equal to plain decoding's, prompt by prompt; sampled outputs are not compared: -1)."""
    base = next(r for r in results if r.contender == baseline)
    plain = next((r for r in results if r.contender == "plain"), base)
    for r in results:
        r.speedup = r.tokens_per_second / base.tokens_per_second if base.tokens_per_second else 0.0
        if r.outputs or not greedy:
            r.identical = sum(a == b for a, b in zip(r.outputs, plain.outputs)) if greedy else -1


def timed_generation(g: GenerationConfig, prompt: Sequence[int],
                     st: Stats) -> tuple[list[int], int, float]:
    """(tokens, tokens after the first step, seconds from the first step's tokens to the last's)."""
    tokens, t_first, n_first = [], None, 0
    for step in speculative_generate(g, prompt, st):
        if t_first is None:
            t_first, n_first = time.perf_counter(), len(step.tokens)
        tokens += step.tokens
    return tokens, len(tokens) - n_first, (time.perf_counter() - t_first) if t_first else 0.0


def run(target, drafts: dict, prompts: Sequence[list[int]], contenders: Sequence[Contender],
        max_tokens: int,
        on_done: Callable[[str, int], None] = lambda name, i: None, sampling: Sampling = Sampling(),
        baseline: tuple[Result, Iterator] | None = None,
        through_text: bool = False) -> list[Result]:
    """Decode every prompt with every contender (interleaved prompt by prompt, so slow drift of the
    machine hits all alike), prompt i sampled with seed i; `through_text`: the drafts' vocabulary
    is not the target's (Contender.generation). Each contender keeps its table of
    measured batch costs from one prompt to the next, as `spectool run` does between runs (see
    controller.Costs). Speedups are over `baseline` when given (see `reference`: it runs its prompt
    i before the contenders run theirs), else over plain decoding."""
    results = {c.name: Result(c.name) for c in contenders}
    costs = {c.name: Costs() for c in contenders}
    for i, prompt in enumerate(prompts):
        if baseline is not None:
            next(baseline[1], None)
        for c in contenders:
            st = Stats(mode=c.mode)
            g = c.generation(target, drafts, max_tokens, costs[c.name], sampling, seed=i,
                             through_text=through_text)
            results[c.name].add(st, *timed_generation(g, prompt, st))
            on_done(c.name, i)
    out = ([baseline[0]] if baseline is not None else []) + list(results.values())
    speedups(out, out[0].contender, sampling.greedy)
    return out


def reference(name: str, path, texts: Sequence[str], max_tokens: int, sampling: Sampling,
              threads: int | None,
              expected: Sequence[str] = (), say: Callable[[str], None] = lambda line: None,
              **options) -> tuple[Result, Iterator[None]]:
    """llama-cpp-python's own generation as a contender (see reference_completions): its Result, and
    an iterator that runs one prompt a step and adds it to the Result (`run` interleaves it with its
    contenders). A prompt it crashes on counts as failed, and `say` hears why; `identical` counts
    the outputs equal to `expected` (plain decoding's texts)."""
    r = Result(name)

    def steps():
        outs = reference_completions(path, texts, max_tokens, sampling, n_threads=threads,
                                     **options)
        for i, out in enumerate(outs):
            if isinstance(out, Exception):
                r.failed += 1
                say(f"{name} failed: {type(out).__name__}: {str(out)[:100]}")
            else:
                r.prompts += 1
                r.generated += out[1] + 1
                r.tokens += out[1]
                r.seconds += out[2]
                r.identical += i < len(expected) and out[0] == expected[i]
            yield

    return r, steps()


def markdown_table(results: Sequence[Result], title: str = "") -> str:
    lines = [f"**{title}**", ""] if title else []
    lines += [
        "| contender | tok/s | speedup | acceptance | tokens/step | identical to plain |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        acc = f"{100 * r.acceptance_rate:.0f}%" if r.drafted else "-"
        steps = f"{r.mean_accepted_length:.2f}" if r.steps else "-"
        same = "-" if r.identical < 0 else f"{r.identical}/{r.prompts + r.failed}"
        same += f" ({r.failed} crashed)" if r.failed else ""
        lines.append(f"| {r.contender} | {r.tokens_per_second:.1f} | {r.speedup:.2f}x | {acc} | "
                     f"{steps} | {same} |")
    return "\n".join(lines)


def recommend(results: Sequence[Result], contenders: Sequence[Contender]) -> str:
    best = max(results, key=lambda r: r.tokens_per_second)
    flags = next(c.flags for c in contenders if c.name == best.contender)
    if best.contender == "plain":
        return "plain decoding won on these prompts: drafts did not pay (spectool run --spec none)"
    return (f"fastest: {best.contender}, {best.speedup:.2f}x plain ({best.tokens_per_second:.1f} "
            f"tok/s): spectool run {flags}")


def report(c: Comparison, reset_costs: bool = False) -> str:
    """What `spectool bench` prints: the greedy and sampled tables, the recommendation and the cost
    tables."""
    s = LLAMA_CPP_SAMPLING
    parts = [markdown_table(c.results, f"{c.model_name}, greedy: {c.prompts} prompts, "
                                       f"{c.max_tokens} tokens each; speedups over plain decoding")]
    if c.sampled:
        parts += ["",
                  markdown_table(c.sampled, f"temperature {s.temp:g}, top-k {s.top_k}, top-p "
                                                f"{s.top_p:g}, min-p {s.min_p:g}: speedups over "
                                                "llama-cpp-python's own plain sampling")]
    parts += ["", recommend(c.results, c.contenders), ""]
    if reset_costs:
        parts.append(f"removed {c.costs_removed} saved cost "
                     f"table{'' if c.costs_removed == 1 else 's'}")
    parts += [f"cost table: {line}" for line in
              c.cost_tables or ["none saved yet: the first `spectool run` measures this machine's "
                                "costs"]]
    return "\n".join(parts)


def plot(groups: dict[str, Sequence[Result]], path: str) -> None:
    """A bar chart of speedups over plain decoding: one group of bars per prompt set, a colour per
    contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.contender for rs in groups.values() for r in rs))
    colours = {n: plt.get_cmap("tab10")(k % 10) for k, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(2.6 * len(groups) + 2, 4.2))
    width, ticks, seen = 0.8 / max(len(rs) for rs in groups.values()), [], set()
    for i, rs in enumerate(groups.values()):
        for j, r in enumerate(rs):
            x = i + (j - (len(rs) - 1) / 2) * width
            ax.bar(x, r.speedup, width * 0.95, color=colours[r.contender],
                   label=None if r.contender in seen else r.contender)
            ax.text(x, r.speedup + 0.02, f"{r.speedup:.2f}", ha="center", va="bottom", fontsize=7)
            seen.add(r.contender)
        ticks.append(i)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(ticks)
    ax.set_xticklabels(list(groups), fontsize=8)
    ax.set_ylabel("speedup over plain decoding (same run)")
    top = max(r.speedup for rs in groups.values() for r in rs)
    ax.set_ylim(0, top * 1.12 + 0.05)
    ax.legend(fontsize=7, ncol=min(4, len(names)), loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_prompts(path: str) -> list[str]:
    """A prompts file: JSON lines (a string, or an object with "prompt") or text with prompts
    separated by lines of three dashes."""
    from pathlib import Path

    text = Path(path).read_text(encoding="utf-8")
    if path.endswith((".jsonl", ".json")):
        import json

        out = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                obj = json.loads(line)
                out.append(obj if isinstance(obj, str) else obj["prompt"])
        return out
    return [p.strip("\n") for p in text.split("\n---\n") if p.strip()]


def reference_completions(path, texts: Sequence[str], max_tokens: int, sampling: Sampling, *,
                          seed: int = 0,
                          n_threads: int | None = None, n_ctx: int = CTX_SIZE, draft_model=None,
                          n_gpu_layers: int = 0):
    """llama-cpp-python's own high-level generation (`Llama.create_completion`, its sampler chain in
    C++), the baseline benchmarks compare against. Yields (text, tokens after the first, seconds
    from the first streamed token to the last) per prompt, or the exception a prompt raised. The
    model is loaded with the same buffer types as `Model` (see avoid_amx)."""
    import os

    from spectool.llama.native import reference_llama

    n_threads = n_threads or max(1, os.cpu_count() or 1)
    llm = reference_llama(path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                          seed=seed,
                          verbose=False, draft_model=draft_model, n_gpu_layers=n_gpu_layers)
    try:
        for i, text in enumerate(texts):
            llm.reset()
            pieces, t_first, n = [], None, 0
            try:
                for chunk in llm.create_completion(text, max_tokens=max_tokens,
                                                   temperature=sampling.temp,
                                                   top_k=sampling.top_k, top_p=sampling.top_p,
                                                   min_p=sampling.min_p, repeat_penalty=1.0,
                                                   seed=seed + i,
                                                   stream=True):
                    t_first = t_first or time.perf_counter()
                    pieces.append(chunk["choices"][0]["text"])
                    # the last chunk only says why
                    n += chunk["choices"][0]["finish_reason"] is None
            # llama-cpp-python's lookup does crash on some long prompts
            except Exception as e:  # noqa: BLE001
                yield e
                continue
            yield ("".join(pieces), max(0, n - 1), (time.perf_counter() - t_first) if t_first
                   else 0.0)
    finally:
        llm.close() if hasattr(llm, "close") else None


@dataclass
class Comparison:
    target: str
    draft: str | None
    model_name: str
    prompts: int
    max_tokens: int
    contenders: list[Contender]
    results: list[Result]
    sampled: list[Result]
    # the saved cost tables of the target (cost_files.describe), which `run` starts from
    cost_tables: list[str]
    costs_removed: int = 0  # tables removed first (--reset-costs)

    def to_json(self) -> dict:
        return {"target": self.target, "draft": self.draft, "prompts": self.prompts,
                "max_tokens": self.max_tokens,
                "results": [r.to_json() for r in self.results],
                "sampled": [r.to_json() for r in self.sampled],
                "recommendation": recommend(self.results, self.contenders),
                "cost_tables": self.cost_tables,
                "cost_tables_removed": self.costs_removed}


def _no_head(refs):
    """`refs`, unless -md names a head (EAGLE-3, DFlash): bench does not measure heads yet
    (`spectool run --spec eagle3 --stats-json` does)."""
    from spectool.drafters.builder import HEADS
    from spectool.session import head_file

    found = head_file(refs.draft)
    if found is not None:
        raise UserError(f"{refs.draft}: {HEADS[found[0]]}; bench does not measure heads yet",
                        code=2)
    return refs


def compare(o, texts: Sequence[str], draft_vocab: int, with_sampled: bool, hooks, progress=None,
            reset_costs: bool = False) -> Comparison:
    """`spectool bench`: the models of options `o` loaded through the session layer (its draft
    pruning too), every default contender on every prompt, greedy, then (with_sampled) the adaptive
    ones sampled with llama.cpp's defaults against llama-cpp-python's own sampling.
    `progress(description, advance, total)` hears each prompt. Each contender learns costs of its
    own from nothing; `reset_costs` removes the target's saved cost tables (those `spectool run`
    starts from) first."""
    import contextlib

    from spectool import cost_files
    from spectool.session import load_models, pruned_draft, resolve_models

    progress = progress or (lambda description, advance, total: None)
    refs = _no_head(resolve_models(o))
    with contextlib.ExitStack() as stack:  # (a target for the tree rows' trees, every contender's)
        m = load_models(replace(o, draft_tree=TREE), stack, refs, want_draft=True, hooks=hooks)
        if m.draft_error is not None:
            raise m.draft_error
        if m.through_text:  # its vocabulary is not the target's: nothing to prune
            hooks.say(m.draft_notice)
        target, draft, text = m.target, m.draft, m.through_text
        removed = cost_files.reset(target.path) if reset_costs else 0
        drafts: dict[int, tuple[Model | None, np.ndarray | None]] = {0: (draft, None)}
        pruned_vocab = (draft_vocab if draft is not None and not text
                        and 0 < draft_vocab < draft.n_vocab else 0)
        if pruned_vocab and draft is not None:
            pruned, ids, _ = pruned_draft(stack, draft, pruned_vocab, o, hooks, keep_original=True)
            drafts[pruned_vocab] = (pruned, ids)
        contenders = default_contenders(draft is not None, pruned_vocab, refs.draft_max)
        adaptive = [c for c in contenders if not c.fixed] if with_sampled else []
        tokens = [target.tokenize(t) for t in texts]
        total = len(tokens) * (len(contenders) + len(adaptive))
        progress("benchmarking", 0, total)
        done = lambda name, i: progress(f"{name}, prompt {i + 1}", 1, total)  # noqa: E731
        results = run(target, drafts, tokens, contenders, o.max_tokens, on_done=done,
                      through_text=text)
        sampled = []
        if adaptive:
            progress("llama-cpp-python, sampled", 0, total)
            base = reference("llama-cpp-python plain", target.path, texts, o.max_tokens,
                             LLAMA_CPP_SAMPLING, o.threads,
                             say=hooks.say)
            sampled = run(target, drafts, tokens, adaptive, o.max_tokens, on_done=done,
                          sampling=LLAMA_CPP_SAMPLING, baseline=base, through_text=text)
        return Comparison(str(m.target_ref), str(m.draft_ref) if m.draft_ref else None,
                          target.path.name, len(texts),
                          o.max_tokens, contenders, results, sampled,
                          [cost_files.describe(t) for t in cost_files.tables(target.path)], removed)
