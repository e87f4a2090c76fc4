"""How far a draft model of another vocabulary, drafting through text (spectool/drafters/text.py's TextDraft), can
go on this machine: an oracle replay over the target's own greedy output, at this machine's measured costs (issue
61 item 4, "bound the draft's best case before tuning").

    python research/text_draft_bound.py [--prompts 8] [--tokens 96] [--samples 1] [--seed N] [--k 8]

For each prompt the target (F16 Gemma 3 270M) decodes its greedy output y once (replay.plain_output). At every
position j the TextDraft (SmolLM2 135M Instruct Q4_1), fed the history prompt + y[:j], proposes its greedy
continuation of up to K target tokens (deterministic); m_j = how many of them match y from j. The propose calls are
timed (the draft's cost per proposed target token, its catch-up to the history included), and the target's cost
of verifying a batch of 1..K+1 tokens is measured in one go (replay.batch_costs). Then, without running a model:
- plain: len(y) steps of cost(1);
- draft oracle: a shortest path over the positions, a step of k drafted tokens at j reaching j + min(k, m_j) + 1
  for cost(k + 1) + k times the draft's cost per token (`cheapest_paid`): no controller over these drafts beats it;
- draft fixed k (1..K): the draft's first k tokens at every step, not knowing the output (the proposal of K cut to
  k: the draft's text re-encoded may differ at the cut, rarely);
- lookup oracle and lookup under spectool's controller (replay.oracle, replay.ours; k_max K), for comparison;
- hybrid oracle: at each position the better of lookup's drafts (free) and the draft's (paid) for the rest.
Replayed costs leave out Python time and the loop's overheads, so compare ratios. The draft's time is charged
linearly per target token drafted (its measured mean), which flatters short drafts a little: a propose call has a
fixed part (its catch-up) too.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from spectool_lab import common

from spectool.llama import engine  # llama.cpp's libraries before numpy: spectool/llama/native.py
from spectool.core.costs import Costs
from spectool.core.verify import Sampling
from spectool.drafters.lookup import PromptLookup
from spectool.drafters.text import TextDraft
from spectool.options import CTX_SIZE
from spectool_lab.replay import accepted, batch_costs, cost_line, oracle, ours, plain_output

SETS = ("free-form (ShareGPT)", "grounded chat (ShareGPT)")


def cheapest_paid(options: list[list[tuple[int, float]]], cost) -> tuple[float, int]:
    """Seconds and steps of the cheapest way through an output where, at token j, each option (reach, seconds a
    drafted token) of options[j] can draft k <= reach tokens, all accepted, for cost[k + 1] + k * its seconds a
    token (a shortest path, as replay.cheapest, with the drafter's time paid). Ties: fewer steps."""
    n = len(options)
    best: list[tuple[float, int]] = [(0.0, 0)] * (n + 1)
    for j in range(n - 1, -1, -1):
        best[j] = min((cost[k + 1] + k * per + best[min(n, j + k + 1)][0], best[min(n, j + k + 1)][1] + 1)
                      for reach, per in options[j] or [(0, 0.0)] for k in range(reach + 1))
    return best[0]


def fixed_draft(proposals: list[list[int]], y, cost, k: int, per: float) -> tuple[float, int]:
    """Seconds and steps of drafting the proposal's first k tokens at every step (the draft's time paid)."""
    total, steps, j = 0.0, 0, 0
    while j < len(y):
        draft = proposals[j][: min(k, len(y) - j - 1)]
        total += cost[len(draft) + 1] + len(draft) * per
        j += accepted(draft, y, j) + 1
        steps += 1
    return total, steps


def drafted(drafter, p, y, k: int) -> tuple[list[list[int]], float]:
    """The drafter's proposal of up to k target tokens at each position of y (history p + y[:j]), and the seconds
    its propose calls took in all."""
    out, seconds = [], 0.0
    drafter.start(p)
    for j in range(len(y)):
        t0 = time.perf_counter()
        out.append(list(drafter.propose(p + y[:j], min(k, len(y) - j), Sampling(), None).tokens))
        seconds += time.perf_counter() - t0
    return out, seconds


def bound(data, cost, k: int, per: float) -> dict[str, tuple[float, int]]:
    """Seconds and steps of each policy over `data` (prompt, output, the draft's proposals), at `cost`."""
    rows: dict[str, list[float]] = {}

    def add(name, seconds, steps):
        r = rows.setdefault(name, [0.0, 0])
        r[0] += seconds
        r[1] += steps

    shared = Costs()
    for p, y, props in data:
        look = [accepted(PromptLookup().lookup(p + y[:j], k)[0], y, j) for j in range(len(y))]
        mine = [accepted(d, y, j) for j, d in enumerate(props)]
        add("plain", len(y) * cost[1], len(y))
        add("lookup (controller)", ours(p, y, cost, k, shared), 0)
        add("lookup oracle", oracle(p, y, cost, k), 0)
        add("lookup oracle*", *cheapest_paid([[(r, 0.0)] for r in look], cost))
        add("draft oracle", *cheapest_paid([[(r, per)] for r in mine], cost))
        add("hybrid oracle", *cheapest_paid([[(a, 0.0), (b, per)] for a, b in zip(look, mine)], cost))
        for f in range(1, k + 1):
            add(f"draft k={f}", *fixed_draft(props, y, cost, f, per))
    return {name: (s, int(n)) for name, (s, n) in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=8, help="the most target tokens a draft proposes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=1, help="unseen samples a set")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2, help="batch cost tables measured (the least kept)")
    ap.add_argument("--out", type=Path, help="also write the report (markdown) here")
    args = ap.parse_args()
    engine.set_verbose(False)
    seed = common.fresh_seed(args.seed)
    lines = [f"{common.machine(args.threads)}; load average {Path('/proc/loadavg').read_text().split()[:3]} at the "
             f"start; unseen samples drawn with --seed {seed}; {args.prompts} prompts x {args.tokens} tokens, K = "
             f"{args.k}", ""]
    say = lambda s: (print(s, flush=True), lines.append(s))  # noqa: E731
    for s in lines:
        print(s, flush=True)
    sets: dict[str, list] = {}
    with engine.Model(common.real_model("gemma-f16"), n_ctx=CTX_SIZE, n_threads=args.threads) as target, \
            engine.Model(common.smollm2(), n_ctx=CTX_SIZE, n_threads=args.threads) as dm:
        for name in SETS:
            for i in range(args.samples):
                data = []
                for text in common.unseen(name, args.prompts, seed + i):
                    p = target.tokenize(text)
                    data.append((p, plain_output(target, p, args.tokens)))
                sets[f"{name} / unseen {i + 1}"] = data
        t0 = time.perf_counter()
        first = next(iter(sets.values()))[0][0]
        tables = [batch_costs(target, first, args.k + 1) for _ in range(args.rounds)]
        cost = [min(c) for c in zip(*tables)]  # the least of each size's medians: the machine is shared
        say(f"{cost_line(cost)} (the least of {args.rounds} tables measured in one go, {len(first)}-token prompt, "
            f"{time.perf_counter() - t0:.0f} s)")
        say("")
        say("| set | draft acceptance (mean m/K) | accepted / proposed | draft ms / token | plain | lookup "
            "(controller) | lookup oracle | draft oracle (tok/step) | hybrid oracle (tok/step) | best fixed k | "
            "bound > 1.3x? |")
        say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for label, data in sets.items():
            full, seconds = [], 0.0
            for p, y in data:
                props, s = drafted(TextDraft(dm, target), p, y, args.k)
                full.append((p, y, props))
                seconds += s
            n_prop = sum(len(d) for _, _, props in full for d in props)
            m = [accepted(d, y, j) for _, y, props in full for j, d in enumerate(props)]
            per = seconds / max(1, n_prop)
            rows = bound(full, cost, args.k, per)
            n = sum(len(y) for _, y, _ in full)
            plain = rows["plain"][0]
            x = {name: plain / s for name, (s, _) in rows.items()}
            fixed = max((f for f in x if f.startswith("draft k=")), key=x.get)
            say(f"| {label} | {sum(m) / (args.k * len(m)):.0%} | {sum(m) / max(1, n_prop):.0%} | {1000 * per:.2f} "
                f"| 1.00x | {x['lookup (controller)']:.2f}x | {x['lookup oracle']:.2f}x | "
                f"{x['draft oracle']:.2f}x ({n / rows['draft oracle'][1]:.2f}) | "
                f"{x['hybrid oracle']:.2f}x ({n / rows['hybrid oracle'][1]:.2f}) | {fixed[6:]}: {x[fixed]:.2f}x | "
                f"draft {'above' if x['draft oracle'] > 1.3 else 'below'}, hybrid "
                f"{'above' if x['hybrid oracle'] > 1.3 else 'below'} |")
            say("  fixed k: " + " ".join(f"{f[8:]}:{x[f]:.2f}x" for f in x if f.startswith("draft k=")) +
                f"; lookup oracle {n / rows['lookup oracle*'][1]:.2f} tok/step; draft "
                f"{seconds:.1f} s for {n_prop} proposed tokens over {n} positions")
    say(f"\nload average at the end {Path('/proc/loadavg').read_text().split()[:3]}")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
