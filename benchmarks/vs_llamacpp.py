"""spectool's prompt lookup against llama.cpp's own n-gram drafting (`llama-lookup`, and `llama-speculative-simple`
with `--spec-type ngram-simple | ngram-map-k | ngram-mod`), with plain decoding by both tools as the baseline, on
the same prompts in the same run.

    pip install -e ".[test,bench]"
    python benchmarks/vs_llamacpp.py         # builds llama.cpp's tools once (see llamacpp.py), then ~40 minutes

Each set runs its tuning list and three samples drawn afresh from the rest of its data set (common.unseen; the
seed is printed, --seed repeats a run), and the summary gives the unseen samples' mean and range beside the
tuning list's figures. Beside the speeds it replays spectool lookup's drafting over spectool's plain output at
batch costs measured once (replay.py): the controller's share of the oracle over the same drafts, and the bound
that share puts on lookup (its ratio to llama-lookup over the share).

F16 Gemma 3 270M, greedy, 8 prompts a sample, 96 new tokens, 2 threads, every layer on the GPU where llama.cpp sees one
(spectool's `-ngl auto`, the tools' `-ngl 99`; the report names the backend); `llama-lookup` drafts at most 8 tokens
(`--spec-draft-n-max 8`, as in llama.cpp's examples) from its context n-gram cache; the n-gram drafters of
`llama-speculative-simple` are sized for short contexts (llamacpp.NGRAM). The contenders run prompt by prompt,
interleaved, so slow drift of the machine hits all alike. Decode speed is tokens per second of decoding:
llama-completion's `eval time` (single-token decodes), spectool's own clock from the end of prompt processing to
its last token, and llama-lookup's and llama-speculative-simple's `decoded N tokens in T seconds` read the same way
as spectool's: the 96 tokens asked for, from the end of the prompt's first n-1 tokens to the 96th
(llamacpp.parse_lookup: llama-lookup decodes the last prompt token before its clock starts, counts the token that
gives, and runs its last step past -n). Writes benchmarks/results/vs_llamacpp.md.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from spectool.bench import Contender, Result
from spectool.cli.display import offload_text
from spectool.core.costs import Costs
from spectool.core.stats import Stats
from spectool.generate.loop import GenerationConfig, speculative_generate
from spectool.llama import engine
from spectool.options import CTX_SIZE
from spectool_lab import common, llamacpp, replay
from spectool_lab.common import machine, models, on_gpu

HERE = Path(__file__).resolve().parent

K_MAX = 32  # spectool lookup's --draft-max here, and its replay's


@dataclass
class Share:
    """The controller's share of its oracle on a sample: lookup's drafting replayed over spectool's plain output
    at batch costs measured once (replay.py), by the controller and by the oracle over the same drafts."""

    ours: float = 0.0  # replayed seconds
    oracle: float = 0.0

    def add(self, prompt: list[int], output: list[int], cost: list[float], costs: Costs) -> None:
        self.ours += replay.ours(prompt, output, cost, K_MAX, costs)
        self.oracle += replay.oracle(prompt, output, cost, K_MAX)

    @property
    def fraction(self) -> float:
        return self.oracle / self.ours if self.ours else 0.0


def decode(g: GenerationConfig, prompt: list[int], st: Stats) -> tuple[list[int], int, float]:
    """(tokens, how many, seconds): wall-clock decode time, as llama.cpp's tools count it (prompt processing,
    which for spectool includes indexing the prompt and measuring a fresh cost table, excluded)."""
    t0 = time.perf_counter()
    tokens = [t for step in speculative_generate(g, prompt, st) for t in step.tokens]
    return tokens, len(tokens), time.perf_counter() - t0 - st.prompt_seconds


def run_set(texts: list[str], model: Path, bins: dict, args) -> tuple[list[Result], Share]:
    ours = [Contender("spectool plain", "none"), Contender("spectool lookup", "lookup", K_MAX)]
    theirs = [Result("llama-completion"), Result(f"llama-lookup ({args.n_draft})"),
              *[Result(f"llama.cpp {kind}") for kind in llamacpp.NGRAM]]
    results = {c.name: Result(c.name) for c in ours}
    costs = {c.name: Costs() for c in ours}
    repack = not engine.avoid_amx()  # the same weights layout as spectool's (see engine.avoid_amx)
    gpu, share, shared = on_gpu(), Share(), Costs()
    with engine.Model(model, n_ctx=CTX_SIZE, n_threads=args.threads, n_gpu_layers="auto") as target:
        print(f"   spectool's backend: {offload_text({'target': target.offload()})}; llama.cpp's tools: "
              f"-ngl {99 if gpu else 0}", flush=True)
        plain_texts: list[str] = []
        cost: list[float] = []
        for i, text in enumerate(texts):
            prompt = target.tokenize(text)
            for c in ours:
                st = Stats(mode=c.mode)
                g = c.generation(target, {}, args.tokens, costs[c.name])
                results[c.name].add(st, *decode(g, prompt, st))
            cost = cost or replay.batch_costs(target, prompt, K_MAX + 1)
            share.add(prompt, results["spectool plain"].outputs[-1], cost, shared)
            plain_texts.append(target.detokenize(results["spectool plain"].outputs[-1]))
            # llama-lookup's clock leaves out its decode of the last prompt token (llamacpp.parse_lookup): priced as
            # one of llama-completion's single-token decodes on this prompt (on the earlier ones if that failed)
            one_decode = theirs[0].seconds / theirs[0].tokens if theirs[0].tokens else 0.0
            runs = [lambda: llamacpp.completion(bins["llama-completion"], model, text, args.tokens, args.threads,
                                                repack=repack, gpu=gpu),
                    lambda: llamacpp.lookup(bins["llama-lookup"], model, text, args.tokens, args.n_draft,
                                            args.threads, repack=repack, first_decode=one_decode, gpu=gpu)]
            runs += [lambda kind=kind: llamacpp.speculative_ngram(bins["llama-speculative-simple"], model, text,
                                                                  args.tokens, kind, args.threads, repack=repack,
                                                                  gpu=gpu) for kind in llamacpp.NGRAM]
            for r, run in zip(theirs, runs):
                try:
                    out = run()
                except RuntimeError as e:
                    r.failed += 1
                    print(f"  {r.contender} failed on prompt {i + 1}: {e}", flush=True)
                    continue
                r.prompts += 1
                r.generated += out.tokens
                r.tokens += out.tokens
                r.seconds += out.seconds
                if r is theirs[0] and out.tokens:
                    one_decode = out.seconds / out.tokens
                r.drafted += out.drafted
                r.accepted += out.accepted
                # the same text as spectool's plain decoding, as far as both went (llama-lookup can overshoot)
                n = min(len(out.text), len(plain_texts[-1]))
                r.identical += n > 0 and out.text[:n] == plain_texts[-1][:n]
            print(f"  prompt {i + 1}/{len(texts)}", end="\r", flush=True)
    rows = [theirs[0], results["spectool plain"], *theirs[1:], results["spectool lookup"]]
    for r in results.values():
        r.identical = sum(a == b for a, b in zip(r.outputs, results["spectool plain"].outputs))
    for r in rows:
        r.speedup = r.tokens_per_second / theirs[0].tokens_per_second if theirs[0].tokens_per_second else 0.0
    return rows, share


Run = tuple[list[Result], Share]  # one sample of one set: its rows (as run_set orders them) and the share


def table(groups: dict[tuple[str, str], Run]) -> str:
    """Every contender of every (set, sample)."""
    lines = ["| set | sample | contender | tok/s | vs llama-completion | drafted | accepted | same text as plain |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for (name, sample), (rows, _) in groups.items():
        for r in rows:
            drafted = f"{r.drafted}" if r.drafted else ""
            accepted = f"{r.accepted}" if r.drafted else ""
            lines.append(f"| {name} | {sample} | {r.contender} | {r.tokens_per_second:.1f} | {r.speedup:.2f}x | "
                         f"{drafted} | {accepted} | {r.identical}/{r.prompts} |")
    return "\n".join(lines)


def ratios(run: Run) -> tuple[float, float, str, float, float, float]:
    """spectool lookup / llama-lookup, / llama.cpp's fastest n-gram drafter (and its name), spectool plain /
    llama-completion, the controller's share of its oracle, and the oracle's bound over llama-lookup (the first
    ratio over the share: what the oracle's draft lengths would make, at the speed spectool lookup runs)."""
    rows, share = run
    tps = [r.tokens_per_second for r in rows]
    best = max(rows[3:-1], key=lambda r: r.tokens_per_second)
    vs_lookup = tps[-1] / tps[2] if tps[2] else 0.0
    bound = vs_lookup / share.fraction if share.fraction else 0.0
    return (vs_lookup, tps[-1] / best.tokens_per_second if best.tokens_per_second else 0.0, best.contender,
            tps[1] / tps[0] if tps[0] else 0.0, share.fraction, bound)


def spread(values: list[float], unit: str = "x") -> str:
    """The mean of the unseen samples' figures and their range: "1.12x (1.05-1.20)"."""
    mean = sum(values) / len(values)
    fmt = (lambda v: f"{v:.0%}") if unit == "%" else (lambda v: f"{v:.2f}")
    tail = unit if unit != "%" else ""
    return f"{fmt(mean)}{tail} ({fmt(min(values))}-{fmt(max(values))})" if len(values) > 1 else fmt(mean) + tail


def summary(groups: dict[tuple[str, str], Run]) -> str:
    """Per set: the tuning list beside the unseen samples (their mean and range), so that overfitting shows."""
    heads = ["spectool lookup / llama-lookup", "/ fastest llama.cpp n-gram drafter", "plain / llama-completion",
             "controller / its oracle", "oracle bound / llama-lookup"]
    lines = ["| set | prompts | " + " | ".join(heads) + " |", "|---|---|" + "---:|" * len(heads)]
    for name in dict.fromkeys(n for n, _ in groups):
        tuned = [ratios(run) for (n, s), run in groups.items() if n == name and s == "tuning"]
        drawn = [ratios(run) for (n, s), run in groups.items() if n == name and s != "tuning"]
        for label, rs in (("tuning list", tuned), (f"unseen ({len(drawn)} samples)", drawn)):
            if rs:
                cells = [spread([r[i] for r in rs], "%" if i == 4 else "x") for i in (0, 1, 3, 4, 5)]
                cells[1] += " (" + ", ".join(sorted({r[2].removeprefix("llama.cpp ") for r in rs})) + ")"
                lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-draft", type=int, default=8, help="llama-lookup's --spec-draft-n-max")
    ap.add_argument("--only", default="", help="only the sets whose name contains this text")
    ap.add_argument("--samples", type=int, default=3, help="unseen samples a set, beside its tuning list")
    ap.add_argument("--seed", type=int, default=None, help="the unseen samples' seed (default: a fresh one)")
    ap.add_argument("--no-tuning", action="store_true", help="leave out the tuning list")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    engine.set_verbose(False)
    bins = llamacpp.build()
    model = models()["F16"]
    seed = common.fresh_seed(args.seed)
    print(f"unseen samples drawn with --seed {seed}", flush=True)
    groups: dict[tuple[str, str], Run] = {}
    for name in common.SETS:
        if args.only not in name:
            continue
        for sample, texts in common.samples(name, args.prompts, seed, args.samples).items():
            if sample == "tuning" and args.no_tuning:
                continue
            print(f"== {name}, {sample}", flush=True)
            groups[name, sample] = run_set(texts, model, bins, args)
            print(table({(name, sample): groups[name, sample]}), flush=True)
    md = (f"Machine: {machine(args.threads)}; llama.cpp "
          f"{llamacpp.llama_cpp_version()} (llama-cpp-python's vendored sources) "
          f"{'GPU backend, every layer on the GPU' if on_gpu() else 'CPU backend'}. Gemma 3 270M F16, greedy, "
          f"{args.prompts} prompts a sample, {args.tokens} new tokens; unseen samples drawn from each set less its "
          f"tuning list with seed {seed}. Command: `python benchmarks/vs_llamacpp.py --seed {seed}`.\n\n"
          + summary(groups) + "\n\n" + table(groups) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vs_llamacpp.md").write_text(md)
    print("\n" + md)


if __name__ == "__main__":
    main()
