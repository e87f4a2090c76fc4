"""How far drafts as trees could go past chains (issue 59 item 6): the oracle over trees against the oracle over
chains, from the same sources, replayed over the target's own greedy output at this machine's measured batch costs.

    python research/tree_bound.py [--prompts 8] [--tokens 96] [--samples 1] [--seed N] [--load run.json]

It decodes each prompt of each set plainly once (the tuning list and unseen samples, seeded and printed) and
measures what a decode of R rows costs, R = 1..k_max+1, as lookup_bound.py does (spectool_lab.replay.batch_costs),
the least of --rounds measurements (a shared machine's load only slows a decode). --load replays lookup_bound.py
--save's outputs (greedy: the same on any load) and its costs, or costs measured anew (--remeasure), or a cost
table given as cost_line prints it (--cost). A step's price is the cost of its rows: a
chain of k drafted tokens is k + 1 rows, a tree of R nodes is R + 1 rows (the last committed token, then every
node at its depth, in one decode).

Sources of branches. Prompt lookup (spectool's PromptLookup: its NGramIndex of every 1..12-gram of the prompt and
the text so far, each with its followers and how often each followed). At a node (the history, then the drafted
path down to it) the candidates are the followers of the longest n-gram ending that text, ranked by how often
each followed it (ties: the last seen first): the top one is what lookup drafts today, the next ones are its
alternatives. llama.cpp keeps less: ngram-map-k keeps up to 4 m-grams per key n-gram with their counts (so
the same alternatives, at most 4); ngram-mod keeps one follower per hashed n-gram (none). `--shorter` adds
the next-shorter n-gram's followers after the longest's (a second source, as a tree could use).

- chain oracle: at each output position, lookup's top candidates drafted as a chain, its length chosen knowing
  the future (spectool_lab.replay.oracle: the shortest path `cheapest` over the output, k <= k_max).
- tree bound (W, N): at each position any tree of at most N nodes whose every node is one of the top-W
  candidates of its parent. Knowing the output, the best such tree is the path that matches it: a node off that
  path only adds a row. So its reach is the longest prefix of the output that stays inside the top-W candidates
  at every depth (at most N deep), at the price of its rows; a chain (up to k_max) stays allowed. Shortest path
  over the output as `cheapest` takes it. At W = 1 it is the chain oracle, and it is never slower. No tree from
  these sources, however shaped or sized, can be cheaper (on a table whose price never falls as rows grow): it
  cannot draft what no source offers.
- tree, fixed shape (W, N): what a tree shaped WITHOUT knowing the output keeps of that bound. The nodes are
  added best first by the product along the path of each candidate's share of its n-gram's followers,
  count / (total + 1) (one unseen follower: a match seen once is not certain); the oracle only chooses how many
  of them (R <= N), or a chain, knowing the output. Its gap to the bound is what paying for siblings costs. A
  tree of R nodes may reach less than R deep, so a measured table's dips (11 rows cheaper than 10) can pay for a
  node more: its ratio is to W = 1 under the same rule (a chain that may be padded: 0.3% below the chain oracle
  in the 2026-12-04 run), not to the chain oracle. (The bound at W = 1 is the chain oracle exactly.)

The realistic figures beside them: spectool's controller over lookup's chains today (spectool_lab.replay.ours)
and llama-lookup's drafting (lookup_bound.llama_lookup, 8 tokens a step). Replayed costs leave out Python time and
machine noise: compare ratios between rows replayed on the same costs.
"""

from __future__ import annotations

import argparse
import heapq
import json
from pathlib import Path

from lookup_bound import llama_lookup
from spectool_lab import common
from spectool_lab.replay import accepted, batch_costs, cheapest, cost_line, ours, plain_output

from spectool.core.costs import Costs
from spectool.drafters.lookup import NGramIndex, PromptLookup, ranked

WIDTHS, BUDGETS = (1, 2, 3, 4), (8, 16, 32)
ROOM, FLAT = 1.10, 1.03  # the threshold for trees to pay, and "less than 3%"


def candidates(index: NGramIndex, context, w: int, shorter: bool = False) -> list[tuple[int, float]]:
    """The top-w candidates after `context` (its last n_max tokens suffice), each with its share of the followers,
    count / (total + 1): the longest n-gram's followers, then (`shorter`) the next-shorter n-gram's others."""
    seq = "".join(map(chr, context[-index.n_max:]))
    n, f = index.longest(seq, index.n_max)
    groups = [ranked(f)]
    if shorter and n > index.n_min:
        groups.append(ranked(index.longest(seq[-(n - 1):], n - 1)[1]))
    out: dict[int, float] = {}
    for group in groups:
        total = sum(c for _, c in group) + 1
        for t, c in group:
            if len(out) < w and t not in out:
                out[t] = c / total
    return list(out.items())


def path_reach(index: NGramIndex, h: list[int], y: list[int], j: int, w: int, depth: int,
               shorter: bool = False) -> int:
    """How deep the output y from position j (after history h = prompt + y[:j]) stays inside the top-w candidates
    at every depth, at most `depth`: the accepted path of the best tree the oracle could draft. (h: its last
    n_max tokens suffice, as for every look-up here.)"""
    d = 0
    while d < depth and j + d < len(y) and any(t == y[j + d] for t, _ in
                                                candidates(index, h + y[j:j + d], w, shorter)):
        d += 1
    return d


def shaped_reach(index: NGramIndex, h: list[int], y: list[int], j: int, w: int, budget: int,
                 shorter: bool = False) -> list[int]:
    """The tree of up to `budget` nodes built best first by path share (see the docstring), without knowing y:
    out[R] is the accepted depth of its first R nodes (out[0] = 0)."""
    heap = [(-s, 1, i, -1, t) for i, (t, s) in enumerate(candidates(index, h, w, shorter))]
    heapq.heapify(heap)
    paths: list[tuple[int, ...]] = []  # each node's path from the root
    on: list[bool] = []  # whether it lies on the output's path
    out, tie = [0], len(heap)
    while heap and len(paths) < budget:
        score, depth, _, parent, t = heapq.heappop(heap)
        path = (paths[parent] if parent >= 0 else ()) + (t,)
        hit = (parent < 0 or on[parent]) and j + depth - 1 < len(y) and y[j + depth - 1] == t
        paths.append(path)
        on.append(hit)
        out.append(max(out[-1], depth if hit else 0))
        for c, s in candidates(index, h + list(path), w, shorter):
            tie += 1
            heapq.heappush(heap, (score * s, depth + 1, tie, len(paths) - 1, c))
    return out


def cheapest_rows(reach_by_rows: list[list[int]], cost) -> float:
    """`cheapest` where each position offers drafts of R = 0, 1, ... nodes (R + 1 rows) that advance by
    reach_by_rows[j][R] accepted tokens: the oracle picks the size at each step knowing the whole output."""
    n = len(reach_by_rows)
    best = [0.0] * (n + 1)
    for j in range(n - 1, -1, -1):
        best[j] = min(cost[r + 1] + best[min(n, j + a + 1)] for r, a in enumerate(reach_by_rows[j]))
    return best[0]


def with_chain(tree: list[int], chain: int, budget: int) -> list[int]:
    """A position's reach by rows when it may draft a tree's first R <= budget nodes (tree[R]) or a chain of R
    tokens that reaches `chain`."""
    return [max(tree[r] if r <= budget and r < len(tree) else 0, min(r, chain))
            for r in range(max(budget, chain) + 1)]


def bounds(p: list[int], y: list[int], cost, k_max: int, shorter: bool = False) -> dict:
    """Seconds over output y of prompt p: the chain oracle; per (W, N) the tree bound and the fixed-shape tree."""
    lookup = PromptLookup()
    chain, path, shaped = [], {w: [] for w in WIDTHS}, {w: [] for w in WIDTHS}
    for j in range(len(y)):
        chain.append(accepted(lookup.lookup(p + y[:j], k_max)[0], y, j))  # oracle's drafts; lookup indexes them
        h = (p + y[:j])[-lookup.index.n_max:]  # all a look-up reads of the history
        for w in WIDTHS:
            path[w].append(path_reach(lookup.index, h, y, j, w, max(BUDGETS), shorter))
            shaped[w].append(shaped_reach(lookup.index, h, y, j, w, max(BUDGETS), shorter))
    out = {"chain": cheapest(chain, cost)}
    for w in WIDTHS:
        for n in BUDGETS:
            out[("bound", w, n)] = cheapest([max(c, min(n, r)) for c, r in zip(chain, path[w])], cost)
            out[("shaped", w, n)] = cheapest_rows([with_chain(t, c, n) for c, t in zip(chain, shaped[w])], cost)
    return out


def least_costs(target, prompt, sizes: int, rounds: int) -> list[float]:
    """batch_costs measured `rounds` times, the least of each size: on a machine others keep busy their load only
    ever slows a decode, so the least is the nearest to a quiet machine's price."""
    runs = [batch_costs(target, prompt, sizes) for _ in range(rounds)]
    return [min(c) for c in zip(*runs)]


def measure(args, seed: int, saved: dict | None = None) -> tuple[list[float], dict]:
    """The target's greedy outputs of every set's samples (or `saved`'s, lookup_bound.py --save's), and the batch
    costs (least_costs, after the first set's first prompt)."""
    from spectool.llama import engine
    from spectool.options import CTX_SIZE

    engine.set_verbose(False)
    sizes = max(args.k_max, max(BUDGETS)) + 1
    with engine.Model(common.models()["F16"], n_ctx=CTX_SIZE, n_threads=args.threads) as target:
        if saved is None:
            saved = {}
            for name in common.SETS:
                for sample, texts in common.samples(name, args.prompts, seed, args.samples).items():
                    data = [(p, plain_output(target, p, args.tokens)) for p in map(target.tokenize, texts)]
                    saved[f"{name} / {sample}"] = data
        return least_costs(target, next(iter(saved.values()))[0][0], sizes, args.rounds), saved


def parsed(line: str) -> list[float]:
    """A cost table from cost_line's text ("batch cost (ms): 1:19.6 2:28.7 ..."), in seconds."""
    pairs = [part.split(":") for part in line.split("):")[-1].split()]
    cost = [0.0] * (max(int(b) for b, _ in pairs) + 1)
    for b, ms in pairs:
        cost[int(b)] = float(ms) / 1000
    return cost


def tables(cost, saved: dict, k_max: int, shorter: bool) -> list[str]:
    rate = lambda s: n / s  # noqa: E731 - tokens a second over the sample
    head = ("| set / sample | llama-lookup | controller | chain oracle | tree bound W4 N32 | tree / chain"
            " | tree / llama-lookup | room |\n|---|---:|---:|---:|---:|---:|---:|---|")
    grid = " | ".join(f"W{w} N{b}" for w in WIDTHS[1:] for b in BUDGETS)
    rule = "|---|" + "---:|" * (len(WIDTHS) - 1) * len(BUDGETS)
    bound_rows, shaped_rows = [f"| set / sample | {grid} |", rule], [f"| set / sample | {grid} |", rule]
    lines = [head]
    for label, data in saved.items():
        n, shared = sum(len(y) for _, y in data), Costs()
        each = [bounds(p, y, cost, k_max, shorter) for p, y in data]
        total = {key: sum(e[key] for e in each) for key in each[0]}
        theirs = sum(llama_lookup(p, y, cost) for p, y in data)
        ctl = sum(ours(p, y, cost, k_max, shared) for p, y in data)
        top, chain = total[("bound", WIDTHS[-1], BUDGETS[-1])], total["chain"]
        gain = chain / top
        room = "room for 1.10x" if gain >= ROOM else "< 3%" if gain < FLAT else "3-10%"
        lines.append(f"| {label} | {rate(theirs):.1f} | {rate(ctl):.1f} | {rate(chain):.1f} | {rate(top):.1f}"
                     f" | {chain / top:.3f}x | {theirs / top:.2f}x | {room} |")
        for kind, rows in (("bound", bound_rows), ("shaped", shaped_rows)):
            rows.append(f"| {label} | " + " | ".join(f"{total[(kind, 1, b)] / total[(kind, w, b)]:.3f}"
                                                      for w in WIDTHS[1:] for b in BUDGETS) + " |")
    return (lines + ["", "tree bound / chain oracle, by width W and node budget N:", ""] + bound_rows
            + ["", "tree of a fixed shape (best first by share), its size by the oracle, over its own W = 1:", ""]
            + shaped_rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=1, help="unseen samples a set, beside its tuning list")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--shorter", action="store_true", help="the next-shorter n-gram's followers as a second source")
    ap.add_argument("--rounds", type=int, default=3, help="batch costs measured this often, the least of each kept")
    ap.add_argument("--load", type=Path, help="replay lookup_bound.py --save's outputs (and its costs, unless"
                    " --remeasure or --cost)")
    ap.add_argument("--remeasure", action="store_true", help="with --load: measure the batch costs anew")
    ap.add_argument("--cost", help="replay at this cost table instead, as cost_line prints it")
    ap.add_argument("--save", type=Path, help="write the outputs and costs replayed here (JSON)")
    args = ap.parse_args()
    if args.load:
        run = json.loads(args.load.read_text())
        seed, cost, saved = run["seed"], run["cost"], run["data"]
        if args.remeasure:
            cost = measure(args, seed, saved)[0]
    else:
        seed = common.fresh_seed(args.seed)
        cost, saved = measure(args, seed)
    cost = parsed(args.cost) if args.cost else cost
    if len(cost) < max(args.k_max, max(BUDGETS)) + 2:
        raise SystemExit(f"the cost table stops at {len(cost) - 1} rows")
    print(f"{common.machine(args.threads)}; unseen samples drawn with --seed {seed}"
          f"{'; sources: lookup + the next-shorter n-gram' if args.shorter else '; source: lookup'}")
    print("\n(tokens/s replayed; tree / chain and the grids: the seconds at W = 1 (the chain oracle; the fixed"
          " shape's own W = 1) over the tree's)\n")
    print("\n".join(tables(cost, saved, args.k_max, args.shorter)))
    print("\n" + cost_line(cost))
    if args.save:
        args.save.write_text(json.dumps({"seed": seed, "cost": cost, "data": saved}))


if __name__ == "__main__":
    main()
