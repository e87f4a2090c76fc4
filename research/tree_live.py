"""Draft trees live (issue 59): spectool lookup with draft trees (--draft-tree N) against the same with chains only
(--draft-tree 0), decoded for real on one target, interleaved prompt by prompt, repeated.

    python research/tree_live.py [--families code,qa,instruction] [--trees 8] [--repeats 3] [--seed N] [--temp T]

For each real model (--models) and format family (spectool_lab.formats, the prompts benchmarks/vs_llamacpp.py
measures; unseen samples, seeded and printed), every prompt runs both contenders, their order turned at each prompt
and repeat, each with its own fresh cost table at each repeat (as vs_llamacpp.py runs them). Both decode on the same
target, loaded with a sequence for each leaf of a tree in one KV buffer. It prints tokens per second of decoding
(prompt processing excluded) per family, mean and range over repeats, trees over chains, the trees' counters (steps
that verified a tree, siblings verified, paths that took one), and whether the greedy texts are the same. --temp T
samples with llama.cpp's default chain at T, each prompt seeded alike in both (the texts then differ: a tree's step
draws otherwise).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from spectool_lab import common, formats

from spectool.bench import Contender
from spectool.core.costs import Costs
from spectool.core.stats import Stats
from spectool.generate.loop import speculative_generate
from spectool.llama import engine
from spectool.llama.parallel import ParallelModel
from spectool.core.verify import Sampling
from spectool.options import CTX_SIZE, DRAFT_MAX, Mode, llama_cpp_sampling
from spectool.session import tree_seqs


def decode(c: Contender, target, prompt: list[int], tokens: int, costs: Costs, sampling: Sampling,
           seed: int) -> tuple[list[int], float, Stats]:
    st = Stats()
    g = c.generation(target, {}, tokens, costs, sampling, seed)
    t0 = time.perf_counter()
    out = [t for step in speculative_generate(g, prompt, st) for t in step.tokens]
    return out, time.perf_counter() - t0 - st.prompt_seconds, st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gemma-f16")
    ap.add_argument("--families", default="code,qa,instruction")
    ap.add_argument("--trees", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--temp", type=float, default=0.0)
    args = ap.parse_args()
    sampling = Sampling() if args.temp <= 0 else replace(llama_cpp_sampling(), temp=args.temp)
    seed = common.fresh_seed(args.seed)
    engine.set_verbose(False)
    contenders = [Contender("chains", Mode.lookup, DRAFT_MAX), Contender("trees", Mode.lookup, DRAFT_MAX,
                                                                          tree=args.trees)]
    print(f"seed {seed}, temperature {args.temp:g}; tokens/s of decoding, mean (range over {args.repeats} repeats)\n")
    print("| model | family | chains | trees | trees / chains | tree steps | siblings | taken | same text |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        with ParallelModel(common.real_model(name), n_ctx=CTX_SIZE, n_threads=2, n_seq_max=tree_seqs(args.trees),
                           kv_unified=True, ctx_seqs=1) as target:
            chat = formats.ChatFormat.of(target)
            for fam in args.families.split(","):
                texts = [p.render(chat) for p in formats.chosen(fam, args.prompts, seed)]
                speed = {c.name: [] for c in contenders}
                tree, same = [0, 0, 0], 0
                for r in range(args.repeats):
                    costs = {c.name: Costs() for c in contenders}
                    done = {c.name: [0, 0.0] for c in contenders}
                    for i, text in enumerate(texts):
                        prompt = target.tokenize(text, parse_special=True)
                        outs = {}
                        for c in contenders[(i + r) % 2:] + contenders[: (i + r) % 2]:
                            out, seconds, st = decode(c, target, prompt, args.tokens, costs[c.name], sampling,
                                                      1000 * r + i)
                            outs[c.name] = out
                            done[c.name][0] += len(out)
                            done[c.name][1] += seconds
                            if c.tree:
                                tree = [a + b for a, b in zip(tree, (st.tree_steps, st.tree_branches, st.tree_taken))]
                        same += outs["chains"] == outs["trees"]
                    for c in contenders:
                        speed[c.name].append(done[c.name][0] / done[c.name][1])
                mean = {n: sum(v) / len(v) for n, v in speed.items()}
                text = {n: f"{mean[n]:.1f} ({min(v):.1f}-{max(v):.1f})" for n, v in speed.items()}
                print(f"| {name} | {fam} | {text['chains']} | {text['trees']} | {mean['trees'] / mean['chains']:.3f}x "
                      f"| {tree[0]} | {tree[1]} | {tree[2]} | {same}/{len(texts) * args.repeats} |", flush=True)


if __name__ == "__main__":
    main()
