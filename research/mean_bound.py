"""How far issue 57's speed bars can go on this machine with lookup's drafts: an oracle replay, family by family.

    python research/mean_bound.py [--models gemma-f16,smollm2] [--families qa,raw] [--prompts 8] [--seed N]
                                  [--live RUN.json] [--temp 0.8 --samples 3]

For each real model and format family (the prompts benchmarks/vs_llamacpp.py measures), the target's greedy output
of each prompt and this machine's batch costs (rule_margin.each_family), and over them, replayed: the oracle over
lookup's drafts (it knows how many tokens of each draft the target accepts and takes the cheapest way through the
output: no controller choosing among those drafts is faster; replay.oracle), spectool's lookup under its controller
(cost table known, audited), llama-lookup's drafting (ported, checked against the tool in research/test_lab.py) and
the best fixed length over lookup's drafts; and spectool's controller told each key's acceptance as it turned out
over the whole prompt, fixed from the first step (controller_replay.Hindsight): what knowing lookup's keys' rates in
advance gives. That is a reference, not a bound: a controller that follows the text as it goes can beat rates fixed
for the whole prompt, and spectool's does on some families. Each is given as plain decoding's replayed seconds over
its own, summed over the family's prompts as the benchmark pools them: its speed-up over one token a step. Replayed
costs leave out Python time and machine noise, which only lower a live figure.

The bound: spectool lookup over the fastest drafter, live, is (lookup over plain) x (plain over the fastest), and the
first factor is at most the oracle's. With --live, a benchmarks/vs_llamacpp.py run's stored .json on the same seed,
prompts and tokens, each family's live fastest drafter over llama-completion divides the oracle's speed-up: the
bound on that family's figure against the issue's bars (1.00x every family, 1.15x on average).

With --temp, each prompt's output is --samples seeded samples of plain decoding at that temperature with llama.cpp's
default chain (audit_sampled.samples, seeded as the benchmark seeds its repeats) instead, and every policy is replayed over the same samples, its keys at that
temperature. A deterministic draft is judged by the target drawing its own token from each row, kept while it is the
draft's (core/verify.py, llama.cpp's rule too), so drafting any of lookup's drafts leaves a seeded sample as it is:
the replay over a sample is that sample's, and the oracle over it a bound as the greedy one is (up to batched rows'
near-ties, docs/exactness.md). The rates in hindsight are each key's over the sample at that temperature.
"""

from __future__ import annotations

import json
from pathlib import Path

from spectool_lab import common, formats, replay
from spectool_lab.replay import fixed, oracle

from spectool.core.audit import LENGTHS
from spectool.core.controller import Controller

from audit_sampled import samples
from controller_replay import K_MAX, Hindsight, hindsight, known
from lookup_bound import llama_lookup
from rule_margin import each_family, options, parser

BARS = {"family": 1.0, "mean": 1.15}  # issue 57's "Done when", as benchmarks/vs_llamacpp.py's BARS
DRAFTERS_AFTER = ("llama-lookup", "ngram-")  # the names of llama.cpp's n-gram drafters in a run's records


def live_fastest(path: Path, seed: int) -> dict[tuple[str, str], tuple[str, float]]:
    """(model, family) -> the fastest of llama.cpp's n-gram drafters in a vs_llamacpp run and its tok/s over
    llama-completion's (each the mean over repeats of the family's pooled tok/s; runs that ended at their first token
    left out, as the report leaves them)."""
    run = json.loads(path.read_text())
    if run["seed"] != seed:
        raise SystemExit(f"{path} was run with --seed {run['seed']}, not {seed}")
    out: dict[tuple[str, str], tuple[str, float]] = {}
    ok = [r for r in run["records"] if not r["failed"] and not r.get("at_once")]
    for key in dict.fromkeys((r["model"], r["family"]) for r in ok):
        mine = [r for r in ok if (r["model"], r["family"]) == key]

        def mean(name: str) -> float:
            by = [[r for r in mine if r["contender"] == name and r["repeat"] == k] for k in {r["repeat"] for r in mine}]
            tps = [sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs) for rs in by if rs]
            return sum(tps) / len(tps)

        names = {r["contender"] for r in mine if r["contender"].startswith(DRAFTERS_AFTER)}
        best = max(names, key=mean)
        out[key] = best, mean(best) / mean("llama-completion")
    return out


def seeds(args, i: int) -> list[int]:
    """The seeds of prompt i's samples: benchmarks/vs_llamacpp.py's for repeats 0, 1, ..., so that with --live a
    replay and the live run draw the same texts where their rows are the same."""
    return [common.generation_seed(repeat, i) for repeat in range(args.samples)]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--live", type=Path, default=None,
                    help="a benchmarks/vs_llamacpp.py run's .json on the same seed, prompts and tokens")
    ap.add_argument("--temp", type=float, default=0.0, help="0: greedy outputs (default); above: samples")
    ap.add_argument("--samples", type=int, default=3, help="samples a prompt with --temp (default: 3)")
    args, seed = options(__doc__, ap)
    live = live_fastest(args.live, seed) if args.live else {}
    sampled = f"{args.samples} samples a prompt at temperature {args.temp:g}" if args.temp else "greedy"
    print(f"{common.machine(2)}; seed {seed}, {'tuning lists' if args.tuning else 'unseen samples'}, "
          f"{args.tokens} tokens, {sampled}; replayed "
          "speed-up over plain decoding (plain's seconds over the policy's), the family's prompts pooled\n")
    head = ("| model | family | oracle | lookup's keys in hindsight | spectool lookup | llama-lookup | best fixed "
            "length |")
    if live:
        head += (" live fastest drafter / llama-completion | over it: oracle, keys in hindsight, spectool lookup "
                 "(replayed) |")
    print(head + "\n|---|---|" + "---:|" * (head.count("|") - 3))
    bounds: dict[str, list[float]] = {}
    for name, fam, data, cost, theirs, _, target in each_family(args, seed):
        if args.temp:  # the prompts' samples in place of their greedy outputs
            data = [(p, y) for i, (p, _) in enumerate(data) for y in samples(target, p, args, seeds(args, i))]
            theirs = [llama_lookup(p, y, cost) for p, y in data]
        kept = [i for i, (_, y) in enumerate(data) if len(y) > 1]  # an output that ended at once measures nothing
        data, theirs = [data[i] for i in kept], [theirs[i] for i in kept]
        if not data:
            continue
        plain = sum(len(y) for _, y in data) * cost[1]
        audit = not args.temp  # the loop audits greedy runs only (core/audit.py)
        ours = [replay.ours(p, y, cost, K_MAX, c, temp=args.temp, ctl=Controller(k_max=K_MAX, costs=c, audit=audit))
                for p, y in data for c in [known(cost)]]
        best = min(sum(fixed(p, y, cost, k) for p, y in data) for k in LENGTHS)
        bound = [replay.ours(p, y, cost, K_MAX, c, temp=args.temp, ctl=Hindsight(
            k_max=K_MAX, costs=c, audit=audit, rates={k.at(args.temp): r for k, r in hindsight(p, y).items()}))
            for p, y in data for c in [known(cost)]]
        cells = [plain / sum(oracle(p, y, cost, K_MAX) for p, y in data), plain / sum(bound), plain / sum(ours),
                 plain / sum(theirs), plain / best]
        line = f"| {name} | {fam}{' (held out)' if formats.FAMILIES[fam].held_out else ''} | " + " | ".join(
            f"{c:.3f}x" for c in cells)
        if (name, fam) in live:
            drafter, over = live[name, fam]
            over_it = [c / over for c in cells[:3]]
            bounds.setdefault(name, []).append(over_it)
            line += f" | {over:.3f}x ({drafter}) | " + ", ".join(f"{c:.3f}x" for c in over_it)
        print(line + " |", flush=True)
    for name, bs in bounds.items():
        print(f"\n{name}, over the live fastest drafter: " + "; ".join(
            f"{what} {sum(b[i] for b in bs) / len(bs):.3f}x on average (lowest family {min(b[i] for b in bs):.3f}x)"
            for i, what in enumerate(("the oracle", "lookup's keys in hindsight", "spectool lookup replayed")))
            + f". The bars: {BARS['mean']:.2f}x on average, {BARS['family']:.2f}x every family.")


if __name__ == "__main__":
    main()
