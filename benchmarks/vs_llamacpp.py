"""spectool's prompt lookup against llama.cpp's own n-gram drafting (`llama-lookup`, and `llama-speculative-simple`
with `--spec-type ngram-simple | ngram-map-k | ngram-mod`), with plain decoding by both tools as the baseline, on
prompts of many formats, on the real models, repeated, in one run (issue 57).

    pip install -e ".[test,bench,demo]"
    python benchmarks/vs_llamacpp.py         # builds llama.cpp's tools once (see llamacpp.py); about 2 hours

Prompts: unseen samples of each format family (spectool_lab.formats: Question/Answer over a pasted text, ### Instruction
/ ### Response, the model's chat template, a second turn that echoes the first, raw text, code with varied edit
requests), drawn afresh from items on no tuning list (the seed is printed; --seed repeats a run). The held-out
families (formats.HELD_OUT) have no tuning list at all, and the report shows them on their own. Chat families are
rendered with each model's own template (Gemma 3's instruct template for the PyPI Gemma, whose file has none).

Models (--models): F16 Gemma 3 270M and SmolLM2 135M Instruct by default, Q4_K_M Gemma too on request. Each prompt runs
every contender, interleaved prompt by prompt (their order turned by one at each prompt and repeat), and the whole set
of prompts runs --repeats times, spectool's cost tables fresh at each repeat (or, --tables saved, as a user's later runs
have them: see `warm`): a figure is the mean of the repeats, given with its range. Contenders: spectool plain and lookup
at its defaults (--draft-max 32, the adaptive controller), llama-completion, llama-lookup drafting at most 8 tokens
(--spec-draft-n-max 8, as llama.cpp's examples run it), and llama-speculative-simple's n-gram drafters at llama.cpp's
defaults and, by default beside them, sized for short contexts (llamacpp.NGRAM; --ngram). Greedy by default; --temp 0.8
samples with llama.cpp's default chain, spectool and every tool alike, each prompt seeded.

Decode speed is tokens per second of decoding: llama-completion's `eval time` (single-token decodes) with its share
of `sampling time` (runs up to 2026-12-04's, seed 131463, left it out) and of `unaccounted time`, the rest of its loop
(runs up to 2026-12-07's, seed 114516, left it out: 0.4-1.9% of its decode time here), spectool's own
clock from the end of prompt processing to its last token, and llama-lookup's and llama-speculative-simple's `decoded
N tokens in T seconds` read the same way as spectool's (llamacpp.parse_lookup; llama-lookup's clock leaves out one
decode, priced as llama-completion's per-token time on the same prompt in the same repeat). The report
(benchmarks/results/vs_llamacpp.md, or vs_llamacpp-temp0.8.md; the runs themselves in the .json beside it) gives per
model and family spectool lookup over the fastest llama.cpp drafter, over llama-lookup, plain over llama-completion,
the worst single prompt, and the spreads over repeats, then a PASS/FAIL line for each of issue 57's bars, as measured,
and what the machine makes of two of them: the prompts where the fastest drafter drafted nothing (plain decoding
against plain decoding), and the spreads of the contenders that draft nothing, beside each figure's spread over the
same repeat's llama-completion.
It is rewritten after every family, so a run cut short leaves what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

from spectool.bench import Contender
from spectool.cli.display import offload_text
from spectool.core.costs import Costs
from spectool.core.stats import Stats
from spectool.core.verify import Sampling
from spectool.llama import engine
from spectool.llama.parallel import ParallelModel
from spectool.options import DRAFT_MAX, Mode, llama_cpp_sampling
from spectool.session import tree_seqs
from spectool_lab import common, formats, llamacpp
from spectool_lab.common import decode, machine, on_gpu

HERE = Path(__file__).resolve().parent
COMPLETION, PLAIN, LOOKUP_CPP, LOOKUP = "llama-completion", "spectool plain", "llama-lookup", "spectool lookup"
TREES = "spectool lookup, trees"  # --trees N: lookup with draft trees (--draft-tree N), issue 59
OURS = (Contender(PLAIN, Mode.none), Contender(LOOKUP, Mode.lookup, DRAFT_MAX))


# --unaudited: lookup with the controller's audit against fixed policies off (core/audit.py), its own A/B
UNAUDITED = "spectool lookup, no audit"


def ours(args) -> tuple[Contender, ...]:
    """spectool's contenders: plain, lookup, with --trees lookup with draft trees, with --unaudited lookup without
    its audit."""
    return (OURS + ((Contender(TREES, Mode.lookup, DRAFT_MAX, tree=args.trees),) if args.trees else ())
            + ((Contender(UNAUDITED, Mode.lookup, DRAFT_MAX, audit=False),) if args.unaudited else ()))


def tables(args) -> dict[str, Costs]:
    """A fresh cost table for each of spectool's contenders."""
    return {c.name: Costs() for c in ours(args)}


WARM = 2  # --tables saved: the prompts of each family's tuning list a table is measured over first
BARS = {"family": 1.0, "prompt": 0.97, "mean": 1.15, "spread": 1.5, "plain": 0.97}  # issue 57's "Done when"


def ngram_drafters(which: str) -> dict[str, tuple[str, list[str]]]:
    """llama-speculative-simple's n-gram contenders: name -> (--spec-type, size flags), at llama.cpp's defaults
    and/or sized for short contexts (llamacpp.NGRAM)."""
    out: dict[str, tuple[str, list[str]]] = {}
    if which in ("defaults", "both"):
        out |= {kind: (kind, []) for kind in llamacpp.NGRAM}
    if which in ("short", "both"):
        out |= {f"{kind} (short)": (kind, flags) for kind, flags in llamacpp.NGRAM.items()}
    return out


@dataclass
class Record:
    """One contender's run of one prompt."""

    model: str
    family: str
    repeat: int
    prompt: int
    contender: str
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    same: bool | None = None  # the same text as spectool plain's (sampled: same seed), as far as both went
    failed: str = ""
    # the target's first token ended it (spectool plain made none before the end): one decode, the last prompt
    # token's, and nothing to time, so left out of the figures (RECOUNT says how older runs are read)
    at_once: bool = False


# runs before 2026-12-05 counted spectool's tokens without the ending end-of-generation token: read with it
# (llamacpp.counted), a run short of --tokens having ended on one (greedy, no stop strings)
RECOUNT = "eog"


@dataclass
class Bench:
    """What every prompt of one model runs with."""

    args: argparse.Namespace
    bins: dict
    model: str
    path: Path
    target: engine.Model
    sampling: Sampling
    ngram: dict
    plain: engine.Model  # what spectool plain decodes on (common.plain_beside: the target or a context beside it)
    costs: dict = field(default_factory=dict)
    one_decode: float = 0.0  # llama-completion's last seconds per token: llama-lookup's missing decode
    gpu: bool = field(default_factory=on_gpu)  # every layer of every contender on the GPU where there is one
    # flash attention for llama.cpp's tools: None, their default (-fa auto); with --llama-fa same, spectool's choice
    # (for llama-completion, spectool plain's)
    flash_attn: bool | None = None
    plain_flash_attn: bool | None = None

    def jobs(self, text: str, prompt: list[int], seed: int) -> dict[str, Callable[[], tuple]]:
        """Each contender's run of one prompt: name -> () -> (llamacpp.Run, spectool's tokens or None)."""
        a, b = self.args, self.bins
        kw = dict(threads=a.threads, gpu=self.gpu, temp=a.temp, seed=seed, flash_attn=self.flash_attn,
                  echo=self.target.detokenize(prompt))
        out: dict[str, Callable[[], tuple]] = {c.name: self.ours(c, prompt, seed) for c in ours(a)}
        out[COMPLETION] = lambda: (llamacpp.completion(b[COMPLETION], self.path, text, a.tokens,
                                                       **{**kw, "flash_attn": self.plain_flash_attn}), None)
        out[LOOKUP_CPP] = lambda: (llamacpp.lookup(b[LOOKUP_CPP], self.path, text, a.tokens, a.n_draft,
                                                   **kw), None)

        def ngram(kind: str, sizes: list[str]) -> Callable[[], tuple]:
            return lambda: (llamacpp.speculative_ngram(b["llama-speculative-simple"], self.path, text, a.tokens, kind,
                                                       sizes=sizes, **kw), None)

        out.update({name: ngram(kind, sizes) for name, (kind, sizes) in self.ngram.items()})
        return out

    def ours(self, c: Contender, prompt: list[int], seed: int) -> Callable[[], tuple]:
        def run() -> tuple:
            st = Stats(mode=c.mode)
            target = self.plain if c.mode is Mode.none else self.target
            g = c.generation(target, {}, self.args.tokens, self.costs[c.name], self.sampling, seed=seed)
            tokens, n, seconds = decode(g, prompt, st)
            return llamacpp.Run(self.target.detokenize(tokens), n, seconds, st.n_drafted, st.n_accepted), tokens
        return run


def warm(b: Bench, chat: formats.ChatFormat) -> None:
    """--tables saved: each spectool contender's cost table measured over WARM prompts of each family's tuning list
    (none of them measured; the held-out families have none) before the first repeat, and then kept, measuring on,
    as a user's table saved after earlier runs (spectool/cost_files.py) is."""
    b.costs = tables(b.args)
    for f in formats.FAMILIES:
        for i, p in enumerate(formats.tuning(f, WARM)):
            print(f"  {b.model}, warming the cost tables, {f} {i + 1}   ", end="\r", flush=True)
            prompt = b.target.tokenize(p.render(chat), parse_special=True)
            for c in ours(b.args):
                b.ours(c, prompt, i)()


def run_prompt(b: Bench, family: str, i: int, repeat: int, text: str) -> list[Record]:
    """Every contender on one prompt, in an order turned by one at each prompt and repeat."""
    prompt = b.target.tokenize(text, parse_special=True)  # as llama.cpp's tools tokenize it
    jobs = b.jobs(text, prompt, common.generation_seed(repeat, i))
    names = list(jobs)
    turn = (i + repeat) % len(names)
    out, texts = {}, {}
    for name in names[turn:] + names[:turn]:
        rec = out[name] = Record(b.model, family, repeat, i, name)
        try:
            run, tokens = jobs[name]()
        except RuntimeError as e:
            rec.failed = str(e)[:300]
            print(f"  {name} failed on {family} prompt {i + 1}: {rec.failed}", flush=True)
            continue
        rec.tokens, rec.seconds, rec.drafted, rec.accepted = run.tokens, run.seconds, run.drafted, run.accepted
        texts[name] = (run.text, tokens)
    if not out[COMPLETION].failed and out[COMPLETION].tokens and out[COMPLETION].seconds:
        b.one_decode = out[COMPLETION].seconds / out[COMPLETION].tokens
    out[LOOKUP_CPP].seconds += b.one_decode if not out[LOOKUP_CPP].failed else 0.0
    if PLAIN in texts:  # sampled too: every contender drew with the same seed
        plain_text, plain_tokens = texts[PLAIN]
        for rec in out.values():
            rec.at_once = not plain_tokens
        for name, (got, tokens) in texts.items():
            n = min(len(got), len(plain_text))
            out[name].same = tokens == plain_tokens if tokens is not None else n > 0 and got[:n] == plain_text[:n]
    return list(out.values())


# -- the figures -------------------------------------------------------------------------------------------
def tps(records: list[Record]) -> float:
    tokens, seconds = sum(r.tokens for r in records), sum(r.seconds for r in records)
    return tokens / seconds if seconds else 0.0


@dataclass
class Figure:
    """A contender on one model and family: tokens per second at each repeat (over its prompts)."""

    repeats: list[float]

    @property
    def mean(self) -> float:
        return sum(self.repeats) / len(self.repeats) if self.repeats else 0.0

    @property
    def spread(self) -> float:
        """The range over repeats, relative to the mean."""
        return (max(self.repeats) - min(self.repeats)) / self.mean if self.mean and len(self.repeats) > 1 else 0.0

    def text(self) -> str:
        lo, hi = (min(self.repeats), max(self.repeats)) if self.repeats else (0.0, 0.0)
        return f"{self.mean:.1f} ({lo:.1f}-{hi:.1f})" if len(self.repeats) > 1 else f"{self.mean:.1f}"


def figures(records: list[Record]) -> dict[str, Figure]:
    """Each contender's Figure over `records` (one model and family), failed runs left out."""
    ok = [r for r in records if not r.failed]
    repeats = sorted({r.repeat for r in ok})
    runs = {c: [[r for r in ok if r.contender == c and r.repeat == k] for k in repeats]
            for c in dict.fromkeys(r.contender for r in records)}
    return {c: Figure([tps(rs) for rs in by_repeat if rs]) for c, by_repeat in runs.items()}


def drafters(names) -> list[str]:
    """llama.cpp's n-gram drafters among the contenders."""
    return [n for n in names if n not in (COMPLETION, PLAIN, LOOKUP, TREES, UNAUDITED)]


@dataclass
class Row:
    """One model and family: the report's figures."""

    model: str
    family: str
    held_out: bool
    vs_fastest: float
    fastest: str
    vs_lookup: float
    plain: float
    worst: float  # the worst prompt: spectool lookup over the fastest drafter on that prompt (repeats pooled)
    worst_at: str
    ours: Figure
    theirs: Figure  # llama-lookup's


def row(model: str, family: str, records: list[Record], kinds: list[str]) -> Row:
    f = figures(records)
    fastest = max(drafters(f), key=lambda n: f[n].mean)
    ratio = (lambda a, b: a / b if b else 0.0)
    worst, worst_at = float("inf"), ""
    for i in sorted({r.prompt for r in records}):
        if (on := fastest_on([r for r in records if r.prompt == i])) is None:
            continue
        best, v = on
        if v < worst:
            worst, worst_at = v, f"prompt {i + 1}" + (f" ({kinds[i]})" if kinds[i] else "") + f", vs {best}"
    return Row(model, family, formats.FAMILIES[family].held_out, ratio(f[LOOKUP].mean, f[fastest].mean), fastest,
               ratio(f[LOOKUP].mean, f[LOOKUP_CPP].mean), ratio(f[PLAIN].mean, f[COMPLETION].mean), worst, worst_at,
               f[LOOKUP], f[LOOKUP_CPP])


def fastest_on(prompt: list[Record]) -> tuple[str, float] | None:
    """On one prompt's records (its repeats pooled): the fastest llama.cpp drafter, and spectool lookup over it; None
    where spectool lookup or every drafter has no run left (sampled, each run that ended at its first token is left
    out: report), so nothing compares."""
    ok = [r for r in prompt if not r.failed]
    names = dict.fromkeys(r.contender for r in ok)
    if LOOKUP not in names or not drafters(names):
        return None
    best = max(drafters(names), key=lambda n: tps([r for r in ok if r.contender == n]))
    theirs = tps([r for r in ok if r.contender == best])
    return best, tps([r for r in ok if r.contender == LOOKUP]) / theirs if theirs else 0.0


def figured(records: list[Record]) -> list[tuple[str, str]]:
    """The models and families with a figure for each contender a row compares (a sampled run that ended at its
    first token has none: report)."""
    groups = dict.fromkeys((r.model, r.family) for r in records)
    needed = {PLAIN, LOOKUP, COMPLETION, LOOKUP_CPP}
    return [g for g in groups if (names := {r.contender for r in records if (r.model, r.family) == g
                                            and not r.failed}) >= needed and drafters(names)]


def rows(records: list[Record], chosen: dict[str, list[formats.Prompt]]) -> list[Row]:
    return [row(m, f, [r for r in records if (r.model, r.family) == (m, f)], [p.kind for p in chosen[f]])
            for m, f in figured(records)]


# -- the report --------------------------------------------------------------------------------------------
def verdict(ok: bool | None) -> str:
    return "n/a " if ok is None else "PASS" if ok else "FAIL"


def bars(rs: list[Row]) -> list[str]:
    """A PASS/FAIL line for each of issue 57's bars, from what was measured."""
    name = (lambda r: f"{r.model}, {r.family}")
    low = min(rs, key=lambda r: r.vs_fastest)
    held = [r.vs_fastest for r in rs if r.held_out]
    held_text = f"; held-out families' lowest {min(held):.2f}x" if held else ""
    worst = min(rs, key=lambda r: r.worst)
    by_model = {m: [r.vs_fastest for r in rs if r.model == m] for m in dict.fromkeys(r.model for r in rs)}
    means = {m: sum(v) / len(v) for m, v in by_model.items()}
    ours = sum(r.ours.spread for r in rs) / len(rs)
    theirs = sum(r.theirs.spread for r in rs) / len(rs)
    repeated = all(len(r.ours.repeats) > 1 and len(r.theirs.repeats) > 1 for r in rs)
    plain = min(rs, key=lambda r: r.plain)
    return [
        f"- {verdict(low.vs_fastest >= BARS['family'])} spectool lookup >= {BARS['family']:.2f}x the fastest "
        f"llama.cpp n-gram drafter on every family: lowest {low.vs_fastest:.2f}x ({name(low)}, vs {low.fastest})"
        f"{held_text}",
        f"- {verdict(worst.worst >= BARS['prompt'])} never below {BARS['prompt']:.2f}x on any one prompt (the "
        f"fastest drafter on that prompt, its repeats pooled): lowest {worst.worst:.2f}x ({name(worst)}, "
        f"{worst.worst_at})",
        f"- {verdict(min(means.values()) >= BARS['mean'])} at least {BARS['mean']:.2f}x the fastest on average over "
        "the families: " + ", ".join(f"{m} {v:.2f}x" for m, v in means.items()),
        f"- {verdict(ours <= BARS['spread'] * theirs if repeated else None)} spectool lookup's spread over repeats "
        f"no wider than {BARS['spread']:g}x llama-lookup's: {ours:.1%} against {theirs:.1%} (range over mean, "
        "averaged over models and families)" + ("" if repeated else ": one repeat, nothing to spread"),
        f"- {verdict(plain.plain >= BARS['plain'])} spectool plain within {1 - BARS['plain']:.0%} of "
        f"llama-completion: lowest {plain.plain:.2f}x ({name(plain)})",
    ]


def floor(records: list[Record]) -> str:
    """What one prompt's figure can resolve in this run: spectool plain against llama-completion, two contenders
    that draft nothing, prompt by prompt (repeats pooled), against the per-prompt bar."""
    ratios = []
    for key in dict.fromkeys((r.model, r.family, r.prompt) for r in records):
        mine = [r for r in records if (r.model, r.family, r.prompt) == key and not r.failed]
        ours, theirs = (tps([r for r in mine if r.contender == c]) for c in (PLAIN, COMPLETION))
        if ours and theirs:
            ratios.append(ours / theirs)
    if not ratios:
        return ""
    return (f"The per-prompt floor: spectool plain, which drafts nothing, made below {BARS['prompt']:.2f}x "
            f"llama-completion on {sum(v < BARS['prompt'] for v in ratios)} of {len(ratios)} prompts "
            f"({min(ratios):.2f}-{max(ratios):.2f}x): what a prompt's figure moves between two plain decoders here."
            + undrafted(records))


def undrafted(records: list[Record]) -> str:
    """Of the prompts below the per-prompt bar, those whose fastest drafter drafted nothing there (it decoded as
    llama-completion does, so the bar measures plain decoding against plain decoding), and what spectool plain made
    against that drafter on them; and (greedy) those where spectool lookup's text left plain decoding's in some
    repeat, at a near-tie of batched rows (docs/exactness.md): there it drafted over another text than the others."""
    below, plain, other_text = 0, [], 0
    for key in dict.fromkeys((r.model, r.family, r.prompt) for r in records):
        mine = [r for r in records if (r.model, r.family, r.prompt) == key and not r.failed]
        if (on := fastest_on(mine)) is None or on[1] >= BARS["prompt"]:
            continue
        best = on[0]
        below += 1
        other_text += any(r.same is False for r in mine if r.contender == LOOKUP)
        theirs = [r for r in mine if r.contender == best]
        ours = tps([r for r in mine if r.contender == PLAIN])  # (none left, sampled: nothing to compare)
        if not sum(r.drafted for r in theirs) and tps(theirs) and ours:
            plain.append(ours / tps(theirs))
    said = ""
    if plain:
        said += (f" On {len(plain)} of the {below} prompts where spectool lookup made below {BARS['prompt']:.2f}x "
                 f"the fastest drafter, that drafter drafted nothing (it decoded one token a step, as "
                 f"llama-completion does), and spectool plain, which drafts nothing either, made "
                 f"{min(plain):.2f}-{max(plain):.2f}x of it there (below {BARS['prompt']:.2f}x on "
                 f"{sum(v < BARS['prompt'] for v in plain)}).")
    if other_text:
        said += (f" On {other_text} of the {below}, spectool lookup's text left plain decoding's in some repeat, at "
                 "a near-tie of batched rows (docs/exactness.md): it drafted over another text than the others.")
    return said


def drift(records: list[Record]) -> str:
    """How much of the spread over repeats the machine makes: the spreads of the contenders that draft nothing (no
    cost table steers them), and each repeat's figure over the same repeat's llama-completion (the machine's plain
    decoding in that repeat; the contenders run interleaved prompt by prompt), averaged over models and families."""
    spreads: dict[str, list[float]] = {}
    for key in figured(records):
        ok = [r for r in records if (r.model, r.family) == key and not r.failed]
        by = {(c, k): tps([r for r in ok if (r.contender, r.repeat) == (c, k)]) for c in (PLAIN, COMPLETION, LOOKUP,
              LOOKUP_CPP) for k in {r.repeat for r in ok}}
        for name in (PLAIN, COMPLETION, LOOKUP, LOOKUP_CPP):
            both = [(v, by[COMPLETION, k]) for (c, k), v in by.items() if c == name and v and by[COMPLETION, k]]
            if len(both) > 1:
                spreads.setdefault(name, []).append(Figure([a for a, _ in both]).spread)
                spreads.setdefault(name + " /", []).append(Figure([a / b for a, b in both]).spread)
    if len(spreads) < 8:
        return ""
    m = {k: sum(v) / len(v) for k, v in spreads.items()}
    mine, theirs = m[LOOKUP + " /"], m[LOOKUP_CPP + " /"]
    return (f"The machine's part of the spread: the contenders that draft nothing, and so have no cost table to "
            f"steer them, spread {m[PLAIN]:.1%} (spectool plain) and {m[COMPLETION]:.1%} (llama-completion) over "
            f"repeats, llama-lookup {m[LOOKUP_CPP]:.1%}. With each repeat's figure taken over the same repeat's "
            "llama-completion (the machine's plain decoding then, interleaved prompt by prompt), spectool lookup's "
            f"spread is {mine:.1%} against llama-lookup's {theirs:.1%}"
            + (f": {mine / theirs:.2f}x." if theirs else "."))


def summary(rs: list[Row]) -> str:
    lines = ["| model | family | spectool lookup / fastest llama.cpp drafter | / llama-lookup | plain / "
             "llama-completion | worst prompt | spectool lookup tok/s | llama-lookup tok/s | spread over repeats: "
             "spectool / llama-lookup |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.model} | {r.family} | {r.vs_fastest:.2f}x ({r.fastest}) | {r.vs_lookup:.2f}x | {r.plain:.2f}x "
              f"| {r.worst:.2f}x ({r.worst_at}) | {r.ours.text()} | {r.theirs.text()} | {r.ours.spread:.1%} / "
              f"{r.theirs.spread:.1%} |" for r in rs]
    return "\n".join(lines)


def contenders_table(records: list[Record]) -> str:
    lines = ["| model | family | contender | tok/s (range over repeats) | vs llama-completion | drafted | accepted | "
             "same text as plain | failed |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for m, fam in dict.fromkeys((r.model, r.family) for r in records):
        group = [r for r in records if (r.model, r.family) == (m, fam)]
        f = figures(group)
        for c, fig in f.items():
            runs = [r for r in group if r.contender == c]
            ok = [r for r in runs if not r.failed]
            same = [r.same for r in ok if r.same is not None]
            base, drafts = f[COMPLETION].mean, c not in (COMPLETION, PLAIN)
            lines.append(f"| {m} | {fam} | {c} | {fig.text()} | {fig.mean / base if base else 0:.2f}x | "
                         f"{sum(r.drafted for r in ok) if drafts else ''} | "
                         f"{sum(r.accepted for r in ok) if drafts else ''} | "
                         f"{f'{sum(same)}/{len(same)}' if same else '-'} | {len(runs) - len(ok) or ''} |")
    return "\n".join(lines)


def variant_table(records: list[Record], variant: str, ours: str, theirs: str) -> str:
    """spectool lookup (`ours`: its label) against a `variant` of it (`theirs`) and against the fastest llama.cpp
    drafter, per model and family (means over repeats): issue 59's trees against --draft-tree 0, or the audit off."""
    lines = [f"| model | family | lookup, {ours} tok/s | lookup, {theirs} tok/s | {theirs} / {ours} | "
             f"fastest drafter | {theirs} / fastest | spread over repeats: {ours} / {theirs} |",
             "|---|---|---:|---:|---:|---|---:|---:|"]
    for m, fam in figured(records):
        f = figures([r for r in records if (r.model, r.family) == (m, fam)])
        fastest = max(drafters(f), key=lambda n: f[n].mean)
        if variant not in f:
            continue
        lines.append(f"| {m} | {fam} | {f[LOOKUP].text()} | {f[variant].text()} | "
                     f"{f[variant].mean / f[LOOKUP].mean if f[LOOKUP].mean else 0:.3f}x | {fastest} | "
                     f"{f[variant].mean / f[fastest].mean if f[fastest].mean else 0:.3f}x | "
                     f"{100 * f[LOOKUP].spread:.1f}% / {100 * f[variant].spread:.1f}% |")
    return "\n".join(lines)


def prompts_table(records: list[Record], chosen: dict[str, list[formats.Prompt]]) -> str:
    """Each prompt: spectool lookup against the fastest drafter on it (repeats pooled)."""
    lines = ["| model | family | prompt | kind | item | spectool lookup tok/s | fastest llama.cpp drafter on it | "
             "ratio |", "|---|---|---:|---|---|---:|---|---:|"]
    for m, fam, i in dict.fromkeys((r.model, r.family, r.prompt) for r in records):
        mine = [r for r in records if (r.model, r.family, r.prompt) == (m, fam, i) and not r.failed]
        if (on := fastest_on(mine)) is None:
            continue
        best, ratio = on
        ours, theirs = (tps([r for r in mine if r.contender == c]) for c in (LOOKUP, best))
        p = chosen[fam][i]
        lines.append(f"| {m} | {fam} | {i + 1} | {p.kind} | {p.key} | {ours:.1f} | {best} {theirs:.1f} | "
                     f"{ratio:.2f}x |")
    return "\n".join(lines)


def command(args, seed: int) -> str:
    """The command that repeats this run."""
    opts = [f"--seed {seed}", f"--models {','.join(args.models)}", f"--families {','.join(args.families)}",
            f"--repeats {args.repeats}", f"--prompts {args.prompts}", f"--tokens {args.tokens}",
            f"--temp {args.temp:g}", f"--ngram {args.ngram}", f"--threads {args.threads}"]
    opts += [f"--trees {args.trees}"] if getattr(args, "trees", 0) else []
    opts += ["--unaudited"] if getattr(args, "unaudited", False) else []
    opts += ["--llama-fa same"] if getattr(args, "llama_fa", "default") == "same" else []
    opts += ["--tables saved"] if saved(args) else []
    return "python benchmarks/vs_llamacpp.py " + " ".join(opts + (["--tuning"] if args.tuning else []))


def saved(args) -> bool:
    """--tables saved (runs stored before it was an option had fresh tables)."""
    return getattr(args, "tables", "fresh") == "saved"


def header(args, seed: int, backends: dict[str, str], seconds: float) -> str:
    s = llama_cpp_sampling()
    how = ("greedy" if args.temp <= 0 else f"sampled at temperature {args.temp:g} with llama.cpp's default chain "
           f"(top-k {s.top_k}, top-p {s.top_p:g}, min-p {s.min_p:g}), each prompt seeded alike in every contender")
    drawn = "their tuning lists" if args.tuning else f"unseen samples drawn with seed {seed}"
    held = [f for f in args.families if formats.FAMILIES[f].held_out]
    small = args.repeats < 3 or args.prompts < 8 or set(formats.FAMILIES) - set(args.families) \
        or not {"gemma-f16", "smollm2"} <= set(args.models)
    return "\n".join([
        "# spectool's lookup against llama.cpp's n-gram drafters, prompt format by prompt format", "",
        f"Machine: {args.machine or machine(args.threads)}; llama.cpp {llamacpp.llama_cpp_version()} "
        f"(llama-cpp-python's vendored sources), "
        f"{'GPU backend, every layer on the GPU' if on_gpu() else 'CPU backend'}. Models: "
        + "; ".join(f"{common.REAL_MODELS[m]} ({b})" for m, b in backends.items()) + f". {how.capitalize()}; "
        f"{args.prompts} prompts a family ({drawn}), {args.repeats} repeat{'s' if args.repeats > 1 else ''}, "
        f"{args.tokens} new tokens; spectool's cost tables "
        + ("saved (measured over the tuning lists first, then kept across repeats)" if saved(args) else
           "fresh at each repeat") + f"; {seconds / 60:.0f} minutes, the machine's load average {args.load:.2f} at the "
        f"start and {args.load_end if args.load_end is not None else os.getloadavg()[0]:.2f} at the end (a quiet "
        "machine's stays well under its cores). "
        f"Command: `{command(args, seed)}`.", "",
        f"llama.cpp's n-gram drafters: llama-lookup (--spec-draft-n-max {args.n_draft}), and "
        "llama-speculative-simple's " + ", ".join(ngram_drafters(args.ngram)) + " (plain names at llama.cpp's "
        "defaults; \"(short)\": sized for short contexts as llamacpp.NGRAM says). Families: "
        + "; ".join(f"`{f}`: {formats.FAMILIES[f].title}" for f in args.families) + ". Held out (no prompt of "
        f"their formats on any tuning list): {', '.join(held) or 'none in this run'}.",
        *(["", f"Reported again from the stored runs, {'; '.join(args.recounted)}."] if args.recounted else []),
        *(["", "This run is smaller than issue 57's (3 repeats, 8 prompts, every family, F16 Gemma and SmolLM2): "
           "its lines say what it measured, not the issue's verdict."] if small else []),
    ])


def report(args, seed: int, backends: dict, seconds: float, records: list[Record],
           chosen: dict[str, list[formats.Prompt]]) -> str:
    if args.temp > 0:  # each contender samples its own text: a run that ended at its first token has nothing timed
        for r in records:
            r.at_once = r.at_once or (r.tokens <= 1 and not r.failed)
    runs = sum(r.at_once for r in records)
    at_once = sorted({(r.model, r.family, r.prompt + 1) for r in records if r.at_once})
    records = [r for r in records if not r.at_once]
    rs = rows(records, chosen)
    parts = [header(args, seed, backends, seconds), "", "## Issue 57's bars", "", *bars(rs), "", floor(records), "",
             drift(records)]
    unfigured = [f"{m} {f}" for m, f in dict.fromkeys((r.model, r.family) for r in records)
                 if (m, f) not in figured(records)]
    if unfigured:
        parts += ["", "No figure (a contender has no run left): " + ", ".join(unfigured) + "."]
    if at_once:
        parts += ["", f"Left out: {runs} runs whose first token ended the generation (nothing decoded but the "
                  f"prompt's last token), of {len(at_once)} prompts: "
                  + ", ".join(f"{m} {f} {i}" for m, f, i in at_once) + "."]
    for title, held in (("Formats on the tuning list (unseen items)", False),
                        ("Held-out formats (on no tuning list)", True)):
        if any(r.held_out == held for r in rs):
            parts += ["", f"## {title}", "", summary([r for r in rs if r.held_out == held])]
    if any(r.contender == TREES for r in records):
        parts += ["", "## Draft trees (--trees)", "", variant_table(records, TREES, "chains", "trees")]
    if any(r.contender == UNAUDITED for r in records):
        parts += ["", "## The audit (--unaudited)", "", variant_table(records, UNAUDITED, "audited", "unaudited")]
    parts += ["", "## Every contender", "", contenders_table(records), "", "## Every prompt", "",
              prompts_table(records, chosen)]
    return "\n".join(parts) + "\n"


def write(args, seed: int, backends: dict, seconds: float, records: list[Record],
          chosen: dict[str, list[formats.Prompt]]) -> str:
    """The report (markdown) and the runs (JSON), written again as the run goes."""
    stem = "vs_llamacpp" + (f"-temp{args.temp:g}" if args.temp > 0 else "") + ("-saved" if saved(args) else "")
    md = report(args, seed, backends, seconds, records, chosen)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.md").write_text(md)
    end = args.load_end if args.load_end is not None else os.getloadavg()[0]
    runs = {"seed": seed, "command": command(args, seed), "machine": args.machine or machine(args.threads),
            "counting": RECOUNT, "reported": args.recounted, "backends": backends, "seconds": seconds,
            "loads": [args.load, end],
            "prompts": {f: [{"key": p.key, "kind": p.kind} for p in ps] for f, ps in chosen.items()},
            "records": [asdict(r) for r in records]}
    (args.out / f"{stem}.json").write_text(json.dumps(runs, indent=1) + "\n")
    return md


def options(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gemma-f16,smollm2",
                    help=f"comma-separated, of {', '.join(common.REAL_MODELS)} (default: gemma-f16,smollm2)")
    ap.add_argument("--families", default=",".join(formats.FAMILIES),
                    help=f"comma-separated, of {', '.join(formats.FAMILIES)} (default: all)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every prompt (default: 3)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts a family (default: 8)")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens a prompt (default: 96)")
    ap.add_argument("--temp", type=float, default=0.0, help="0: greedy (default); above: sampled, seeded")
    ap.add_argument("--ngram", choices=("defaults", "short", "both"), default="both",
                    help="llama-speculative-simple's n-gram drafters at llama.cpp's defaults, sized for short "
                         "contexts, or both (default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trees", type=int, default=0, metavar="N",
                    help="also spectool lookup with draft trees of up to N siblings (--draft-tree N), its target, as "
                         "every spectool contender's, loaded with a sequence for each leaf (default: 0, none)")
    ap.add_argument("--unaudited", action="store_true",
                    help="also spectool lookup with its audit against fixed policies off (core/audit.py; greedy: "
                         "sampled runs have none)")
    ap.add_argument("--llama-fa", choices=("default", "same"), default="default",
                    help="llama.cpp's tools' flash attention: their default, -fa auto (default), or the same kernel "
                    "as spectool's (spectool/attention.py), so that the ratios measure drafting alone")
    ap.add_argument("--tables", choices=("fresh", "saved"), default="fresh",
                    help="spectool's cost tables: fresh at each repeat, as on a new machine (default), or saved: "
                    "measured over the tuning lists first and kept across repeats, as SPECTOOL_CACHE/costs/ keeps "
                    "a user's between runs")
    ap.add_argument("--n-draft", type=int, default=8, help="llama-lookup's --spec-draft-n-max (default: 8)")
    ap.add_argument("--seed", type=int, default=None, help="the unseen samples' seed (default: a fresh one)")
    ap.add_argument("--tuning", action="store_true", help="the tuning lists instead (held-out families have none)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--report-from", type=Path, default=None, metavar="JSON",
                    help="write the report again from a run's stored runs (its .json), under the current counting")
    args = ap.parse_args(argv)
    args.models, args.families = args.models.split(","), args.families.split(",")
    args.recounted = []  # --report-from: when and how the stored runs were read again
    args.machine = None  # --report-from: the machine that ran them
    args.load, args.load_end = os.getloadavg()[0], None  # the 1-minute load average as the run starts
    for given, known in ((args.models, common.REAL_MODELS), (args.families, formats.FAMILIES)):
        if set(given) - set(known):
            ap.error(f"unknown: {', '.join(sorted(set(given) - set(known)))} (known: {', '.join(known)})")
    return args


def report_again(path: Path, out: Path) -> str:
    """The report of a stored run (`--report-from`), its runs read under the current counting (RECOUNT)."""
    runs = json.loads(path.read_text())
    args = options(shlex.split(runs["command"])[2:])
    args.out, (args.load, args.load_end) = out, runs.get("loads", (float("nan"), float("nan")))
    today = f"on {time.strftime('%Y-%m-%d')}"
    args.machine, args.recounted = runs.get("machine"), [*runs.get("reported", ())]
    args.recounted += [] if any(r.startswith(today) for r in args.recounted) else [today]
    names = {f.name for f in fields(Record)}
    records = [Record(**{k: v for k, v in r.items() if k in names}) for r in runs["records"]]
    if runs.get("counting") != RECOUNT:
        ours = [r for r in records if r.contender in (PLAIN, LOOKUP) and not r.failed]
        for r in ours:
            r.tokens = llamacpp.counted(r.tokens, r.tokens < args.tokens)
        args.recounted[-1] = today + (", spectool's tokens recounted with the ending end-of-generation token "
                               "(llamacpp.counted) and prompts that ended at once left out")
        empty = {(r.model, r.family, r.repeat, r.prompt) for r in ours if r.contender == PLAIN and r.tokens <= 1}
        for r in records:
            r.at_once = (r.model, r.family, r.repeat, r.prompt) in empty
    chosen = {f: [formats.Prompt(f, p["key"], p["kind"]) for p in ps] for f, ps in runs["prompts"].items()}
    backends = runs.get("backends") or {m: "backend not recorded" for m in args.models}
    return write(args, runs["seed"], backends, runs.get("seconds", 0.0), records, chosen)


def load(path: Path, args) -> engine.Model:
    """The target every spectool contender decodes on, with the attention kernel `spectool run` chooses
    (spectool/attention.py): with --trees, a sequence for each leaf of a tree in one KV buffer (as `spectool run
    --draft-tree N` loads it)."""
    if not args.trees:
        return common.load(path, args.threads)
    return common.load(path, args.threads, ParallelModel, n_seq_max=tree_seqs(args.trees), kv_unified=True,
                       ctx_seqs=1)


def attention_text(target: engine.Model, plain: engine.Model, tools: bool | None) -> str:
    """Which attention kernel spectool ran on (drafting, and plain where it differs), and llama.cpp's tools."""
    said = {True: "on", False: "off", None: "llama.cpp's default"}
    ours = said[target.flash_attn] + (f", spectool plain {said[plain.flash_attn]}"
                                      if plain.flash_attn != target.flash_attn else "")
    return f"flash attention {ours} (llama.cpp's tools: {'-fa auto' if tools is None else ours})"


def main() -> None:
    args = options()
    if args.report_from:
        print(report_again(args.report_from, args.out))
        return
    engine.set_verbose(False)
    bins = llamacpp.build()
    seed, start = common.fresh_seed(args.seed), time.time()
    print(f"unseen samples drawn with --seed {seed}", flush=True)
    chosen = {f: formats.chosen(f, args.prompts, seed, args.tuning) for f in args.families}
    chosen = {f: ps for f, ps in chosen.items() if ps}  # --tuning: the held-out families have none
    sampling = Sampling() if args.temp <= 0 else replace(llama_cpp_sampling(), temp=args.temp)
    records: list[Record] = []
    backends: dict[str, str] = {}
    for name in args.models:
        path = common.real_model(name)
        with load(path, args) as target, contextlib.ExitStack() as stack:
            chat = formats.ChatFormat.of(target)
            plain = common.plain_beside(stack, target, args.threads)
            same = args.llama_fa == "same"
            b = Bench(args, bins, name, path, target, sampling, ngram_drafters(args.ngram), plain,
                      flash_attn=target.flash_attn if same else None,
                      plain_flash_attn=plain.flash_attn if same else None)
            backends[name] = (f"{offload_text({'target': target.offload()})}, chat template: {chat.name}, "
                              f"{attention_text(target, plain, b.flash_attn)}")
            texts = {f: [p.render(chat) for p in ps] for f, ps in chosen.items()}
            if saved(args):
                warm(b, chat)
            for r in range(args.repeats):
                if not saved(args):
                    b.costs = tables(args)  # fresh at each repeat, as on a new machine
                for f, ts in texts.items():
                    for i, text in enumerate(ts):
                        print(f"  {name}, repeat {r + 1}/{args.repeats}, {f} {i + 1}/{len(ts)}   ", end="\r",
                              flush=True)
                        records += run_prompt(b, f, i, r, text)
                    write(args, seed, backends, time.time() - start, records, chosen)
    print("\n" + write(args, seed, backends, time.time() - start, records, chosen))


if __name__ == "__main__":
    main()
