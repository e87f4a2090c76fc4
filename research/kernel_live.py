"""Which attention kernel spectool should decode on, live: spectool plain and spectool lookup each on a context with
llama.cpp's flash attention and on one without (two contexts on one load of the weights, Model.beside), and
llama-completion with it (llama.cpp's default), interleaved in a shuffled order at each prompt.

    python research/kernel_live.py [--models gemma-f16,smollm2] [--prompts 3] [--repeats 3] [--seed N] \
        [--families qa,chat,code,second-turn]

spectool/attention.py chooses the kernel from a probe of a few decodes after 512 tokens of context; this measures
what the choice is for: tokens per second of whole generations (96 tokens, greedy, prompt processing left out and
the tokens counted as benchmarks/vs_llamacpp.py counts them), unseen prompts of each family, a fresh cost table
per kernel at each repeat. Prints, per family, each contender's mean over llama-completion's, then over all
prompts each contender's tokens per second, and what the probe measured and chose for the model.
"""

from __future__ import annotations

import argparse
import random
import statistics

from spectool_lab import common, formats, llamacpp

from spectool import attention
from spectool.bench import Contender
from spectool.core.costs import Costs
from spectool.core.stats import Stats
from spectool.core.verify import Sampling
from spectool.llama import engine
from spectool.options import CTX_SIZE, DRAFT_MAX, Mode

COMPLETION = "llama-completion, flash on"
OURS = {"plain": Contender("plain", Mode.none), "lookup": Contender("lookup", Mode.lookup, DRAFT_MAX)}


def ours(m: engine.Model, c: Contender, prompt: list[int], costs: Costs, tokens: int) -> float:
    """Tokens per second of spectool's contender `c` decoding `prompt` on `m`, as the benchmark counts them."""
    _, n, seconds = common.decode(c.generation(m, {}, tokens, costs, Sampling(), seed=0), prompt, Stats(mode=c.mode))
    return n / seconds


def one_model(name: str, args, seed: int, binary) -> None:
    path = common.real_model(name)
    rates: dict[tuple[str, str], list[float]] = {}
    with engine.Model(path, n_ctx=CTX_SIZE, n_threads=args.threads, n_gpu_layers=0,
                      flash_attn=True) as on, on.beside(flash_attn=False) as off:
        chat = formats.ChatFormat.of(on)
        texts = [(f, p.render(chat)) for f in args.families for p in formats.chosen(f, args.prompts, seed)]
        for r in range(args.repeats):
            costs = {(c, fa): Costs() for c in OURS for fa in ("on", "off")}  # fresh, as on a new machine
            for i, (family, text) in enumerate(texts):
                prompt = on.tokenize(text, parse_special=True)
                jobs = {f"spectool {c}, flash {fa}": (lambda c=c, fa=fa, m=m: ours(
                            m, OURS[c], prompt, costs[c, fa], args.tokens))
                        for c in OURS for fa, m in (("on", on), ("off", off))}
                jobs[COMPLETION] = lambda text=text: (lambda run: run.tokens / run.seconds)(
                    llamacpp.completion(binary, path, text, args.tokens, threads=args.threads, flash_attn=True))
                names = list(jobs)
                random.Random(seed + 1000 * r + i).shuffle(names)
                for contender in names:
                    rates.setdefault((family, contender), []).append(jobs[contender]())
                print(f"  {name}, repeat {r + 1}/{args.repeats}, prompt {i + 1}/{len(texts)}   ", end="\r", flush=True)
    report(name, args, rates, attention.kernel_seconds(path, args.threads))


def report(name: str, args, rates: dict[tuple[str, str], list[float]], probe: attention.Seconds) -> None:
    contenders = sorted({c for _, c in rates})
    print(f"\n{name}: over {COMPLETION}, the mean of {args.prompts} prompts x {args.repeats} repeats")
    print("| family | " + " | ".join(contenders) + " |\n|---|" + "---:|" * len(contenders))
    for f in args.families:
        base = statistics.mean(rates[f, COMPLETION])
        print(f"| {f} | " + " | ".join(f"{statistics.mean(rates[f, c]) / base:.3f}" for c in contenders) + " |")
    print("tok/s over every prompt: " + ", ".join(
        f"{c} {statistics.mean(v for (_, c2), vs in rates.items() if c2 == c for v in vs):.1f}" for c in contenders))
    ms = {fa: {b: round(s * 1e3, 1) for b, s in by.items()} for fa, by in probe.items()}
    print(f"probe (ms a decode of 1 and of 8 tokens, flash on: {ms[True]}, off: {ms[False]}): chooses flash "
          f"{'on' if attention.faster(probe) else 'off'} to verify drafts, "
          f"{'on' if attention.faster(probe, plain=True) else 'off'} for a token a step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    formats.family_options(ap, "qa,chat,code,second-turn")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.set_defaults(prompts=3)
    args = ap.parse_args()
    engine.set_verbose(False)
    binary = llamacpp.build()["llama-completion"]
    seed = common.fresh_seed(args.seed)
    print(f"unseen samples drawn with --seed {seed}", flush=True)
    args.models, args.families = args.models.split(","), args.families.split(",")
    for name in args.models:
        one_model(name, args, seed, binary)


if __name__ == "__main__":
    main()
