"""Draft trees live (issue 59): spectool with draft trees (--draft-tree N) against the same with chains only
(--draft-tree 0), decoded for real on one target, interleaved prompt by prompt, repeated.

    python research/tree_live.py [--families code,qa,instruction,json] [--trees 8] [--repeats 3] [--seed N] [--temp T]
                                 [--spec lookup|draft|hybrid]

For each real model (--models) and format family (spectool_lab.formats, the prompts benchmarks/vs_llamacpp.py
measures; unseen samples, seeded and printed; "json": benchmarks/structured.py's extraction prompts, each under its
JSON schema, the grammar's forced tokens drafted too), every prompt runs both contenders, their order turned at
each prompt and repeat, each with its own fresh cost table at each repeat (as vs_llamacpp.py runs them). Both
decode on the same target, loaded with a sequence for each leaf of a tree in one KV buffer; --spec draft or hybrid
drafts with the Q4_K_M of the same model (its runner-ups the siblings). It prints tokens per second of decoding
(prompt processing excluded) per family, mean and range over repeats, trees over chains, the trees' counters (steps
that verified a tree, siblings verified, paths that took one), and whether the greedy texts are the same (where
not, the target's logit gap between the two tokens where they part, after a plain prefill: a near-tie's is
small). --temp T samples with llama.cpp's default chain at T, each prompt seeded alike in both (the texts then
differ: a tree's step draws otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import replace

from spectool_lab import common, formats
from spectool_lab.extraction import extraction_prompts

from spectool.bench import Contender
from spectool.core.costs import Costs
from spectool.core.grammar import Grammar
from spectool.core.stats import Stats
from spectool.drafters.builder import for_generation
from spectool.generate.loop import speculative_generate
from spectool.llama import engine
from spectool.llama.parallel import ParallelModel
from spectool.core.verify import Sampling
from spectool.models.registry import PAIR_DRAFT_MAX
from spectool.options import CTX_SIZE, DRAFT_MAX, Mode, llama_cpp_sampling
from spectool.session import tree_seqs
from spectool.templates import prompt_tokens


def decode(c: Contender, target, drafts: dict, prompt: list[int], tokens: int, costs: Costs, sampling: Sampling,
           seed: int, grammar: Grammar | None = None) -> tuple[list[int], float, Stats]:
    st = Stats()
    g = c.generation(target, drafts, tokens, costs, sampling, seed)
    if grammar is not None:  # (the grammar's forced tokens drafted too, as by default)
        g = replace(g, grammar=grammar, drafter=for_generation(g.drafter, grammar=True))
    t0 = time.perf_counter()
    out = [t for step in speculative_generate(g, prompt, st) for t in step.tokens]
    return out, time.perf_counter() - t0 - st.prompt_seconds, st


def cases(family: str, target, n: int, seed: int) -> list[tuple[list[int], Grammar | None]]:
    """Each prompt of a family and its grammar: "json", the extraction prompts under their JSON schemas
    (benchmarks/structured.py's, one user message in the chat template); else formats' unseen samples, free."""
    if family == "json":
        return [(prompt_tokens(target, [{"role": "user", "content": ex.message}]), Grammar.json_schema(ex.schema))
                for ex in extraction_prompts(n)]
    chat = formats.ChatFormat.of(target)
    return [(target.tokenize(p.render(chat), parse_special=True), None) for p in formats.chosen(family, n, seed)]


def gap(target, prompt: list[int], a: list[int], b: list[int]) -> float:
    """The target's logit gap, after a plain prefill, between the two tokens where greedy texts `a` and `b` first
    differ (docs/exactness.md bounds a near-tie's); nan where one is the other's start (one ended there)."""
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if j is None:
        return float("nan")
    target.reset()
    target.eval([*prompt, *a[:j]])
    row = target.logits(-1)
    return abs(float(row[a[j]]) - float(row[b[j]]))


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
    ap.add_argument("--spec", default="lookup", choices=["lookup", "draft", "hybrid"],
                    help="draft and hybrid: Gemma's Q4_K_M drafts (its runner-ups beside its chain): "
                    "--models gemma-f16")
    args = ap.parse_args()
    sampling = Sampling() if args.temp <= 0 else replace(llama_cpp_sampling(), temp=args.temp)
    seed = common.fresh_seed(args.seed)
    engine.set_verbose(False)
    mode, k_max = Mode(args.spec), DRAFT_MAX if args.spec == "lookup" else PAIR_DRAFT_MAX
    contenders = [Contender("chains", mode, k_max), Contender("trees", mode, k_max, tree=args.trees)]
    print(f"--spec {args.spec}, seed {seed}, temperature {args.temp:g}; tokens/s of decoding, mean (range over "
          f"{args.repeats} repeats)\n")
    print("| model | family | chains | trees | trees / chains | tree steps | siblings | taken | same text |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        with contextlib.ExitStack() as stack:
            target = stack.enter_context(ParallelModel(common.real_model(name), n_ctx=CTX_SIZE, n_threads=2,
                                                       n_seq_max=tree_seqs(args.trees), kv_unified=True, ctx_seqs=1))
            drafts = common.open_drafts(stack, common.real_model("gemma-q4"), contenders, 2) if args.spec != "lookup" \
                else {}
            for fam in args.families.split(","):
                texts = cases(fam, target, args.prompts, seed)
                speed = {c.name: [] for c in contenders}
                tree, same, gaps = [0, 0, 0], 0, []
                for r in range(args.repeats):
                    costs = {c.name: Costs() for c in contenders}
                    done = {c.name: [0, 0.0] for c in contenders}
                    for i, (prompt, grammar) in enumerate(texts):
                        outs = {}
                        for c in contenders[(i + r) % 2:] + contenders[: (i + r) % 2]:
                            out, seconds, st = decode(c, target, drafts, prompt, args.tokens, costs[c.name], sampling,
                                                      1000 * r + i, grammar)
                            outs[c.name] = out
                            done[c.name][0] += len(out)
                            done[c.name][1] += seconds
                            if c.tree:
                                tree = [a + b for a, b in zip(tree, (st.tree_steps, st.tree_branches, st.tree_taken))]
                        same += outs["chains"] == outs["trees"]
                        if sampling.greedy and outs["chains"] != outs["trees"]:
                            gaps.append(gap(target, prompt, outs["chains"], outs["trees"]))
                    for c in contenders:
                        speed[c.name].append(done[c.name][0] / done[c.name][1])
                mean = {n: sum(v) / len(v) for n, v in speed.items()}
                text = {n: f"{mean[n]:.1f} ({min(v):.1f}-{max(v):.1f})" for n, v in speed.items()}
                print(f"| {name} | {fam} | {text['chains']} | {text['trees']} | {mean['trees'] / mean['chains']:.3f}x "
                      f"| {tree[0]} | {tree[1]} | {tree[2]} | {same}/{len(texts) * args.repeats} |"
                      + (f" (logit gaps where the texts part: {', '.join(f'{g:.4f}' for g in gaps)})" if gaps else ""),
                      flush=True)


if __name__ == "__main__":
    main()
