"""How far parallel sequences could go here: what one llama_decode costs with R rows over S
sequences, and what that makes of batched plain decoding and of the best speculative schedule
(issue 48's bars).

    python research/parallel_bound.py [--prompts 8] [--tokens 128] [--reps 7] [--seed N]
    python research/parallel_bound.py --clock cpu --threads 1   # a machine others keep busy
    python research/parallel_bound.py --line 14,2.9             # no measuring: a + b*R ms a decode

It opens one llama.cpp context per S (n_seq_max = S, KV cache unified or one stream per sequence),
holds --context tokens of a different code prompt in each sequence, and times a decode of R rows,
every one with logits (a verification), spread as evenly as can be over the S sequences, for
R = S..9S and a few larger R (one sequence drafting up to --k-max), priced at the median of --reps
rounds (and again at their fastest: a busy machine only slows a decode), each round visiting every
shape once (the first round builds the graphs and is dropped), every decode
rolled back per sequence (llama_memory_seq_rm). Then, on code edits (the target's own greedy output
after each prompt, as lookup_bound.py replays it):
- queued: one sequence at a time, as `spectool serve` is today: plain, and spectool's lookup under
  its controller (spectool_lab.replay's `ours`) at the one-sequence costs;
- batched plain (`--parallel N --spec none`): N rows a step, N tokens;
- the bound at N: N sequences always active (continuous batching), each drafting from its own
  PromptLookup and knowing what will be accepted. On a cost a + b*R per decode (a line below every
  measured cost of N sequences), a step's cost splits exactly into a/N + b*(k+1) per sequence, so
  each sequence's cheapest path (replay.cheapest) at that share bounds any schedule: no batch
  controller drafting from lookup can beat it;
- an estimate: spectool's controller per sequence, pricing its share of the line not lowered.
Replayed costs leave out Python time; compare the ratios.
"""

from __future__ import annotations

import argparse
import ctypes
import time

from spectool_lab import common
from spectool_lab.common import models

from spectool.llama import engine  # llama.cpp's libraries before numpy: native.py
import numpy as np
from spectool_lab.replay import oracle, ours, plain_output
from spectool.core.costs import Costs
from spectool.options import CTX_SIZE

CODE = "code editing (HumanEval)"
SEQS = (1, 2, 4, 8)
WIDE = (12, 17, 25, 33)  # rows per sequence beyond 9, measured to keep the line honest there
# wall: what a decode takes; cpu: the process's CPU seconds in it, which other programs on a busy
# machine inflate far less (honest with --threads 1 only: ggml's threads spin while they wait)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def spread(rows: int, seqs: int) -> list[int]:
    """Rows per sequence, `rows` over `seqs` as evenly as can be (the first ones get one more)."""
    return [rows // seqs + (i < rows % seqs) for i in range(seqs)]


def shapes(seqs: int, k_max: int) -> list[int]:
    """The R measured with `seqs` sequences: S..9S, then a few wider ones up to a k_max draft."""
    wide = [seqs * w for w in WIDE if w <= k_max + 1] + [seqs - 1 + k_max + 1]
    return sorted(set(range(seqs, 9 * seqs + 1)) | {r for r in wide if r > 9 * seqs})


Line = tuple[float, float]  # (a, b): a + b*R seconds for a decode of R rows


def lines(cost: dict[int, float]) -> tuple[Line, Line]:
    """(lower, fit): `fit` a line through the measured costs, its slope the median of the pairwise
    slopes (Theil-Sen: a busy spell only slows a decode, and a few slow ones do not tilt it), its
    intercept the median one; `lower` the same line lowered to touch the lowest of them (every cost
    lies on or above it), or where that would start below zero, the steepest line through the
    origin under them all."""
    r = np.array(sorted(cost), float)
    y = np.array([cost[int(x)] for x in r])
    i, j = np.triu_indices(len(r), 1)
    b = float(np.median((y[j] - y[i]) / (r[j] - r[i]))) if len(r) > 1 else 0.0
    a, c = float(min(y - b * r)), float(np.median(y - b * r))
    return ((a, b) if a >= 0 else (0.0, float(min(y / r)))), (c, b)


def share(a: float, b: float, seqs: int, largest: int) -> list[float]:
    """What a sequence pays for a step of k+1 rows (index k+1) when `seqs` share a decode of
    a + b*R."""
    return [0.0] + [a / seqs + b * rows for rows in range(1, largest + 1)]


def rates(data, one: list[float], batch: dict[int, dict[int, float]],
          k_max: int) -> dict[int, dict[str, float]]:
    """Tokens per second at each N of `batch` (N -> R -> seconds), from `data` ((prompt, output)
    pairs), `one` the one-sequence costs by rows (index 0 unused, up to k_max + 1)."""
    n = sum(len(y) for _, y in data)
    today = n / sum(ours(p, y, one, k_max, Costs()) for p, y in data)
    alone = n / sum(oracle(p, y, one, k_max) for p, y in data)
    out = {}
    for seqs, cost in sorted(batch.items()):
        lower, line = lines(cost)
        bound, fit = share(*lower, seqs, k_max + 1), share(*line, seqs, k_max + 1)
        shared = Costs()
        out[seqs] = {"queued plain": 1 / one[1], "queued lookup": today, "queued oracle": alone,
                     "batched plain": seqs / cost[seqs],
                     "bound": n / sum(oracle(p, y, bound, k_max) for p, y in data),
                     "controller (est.)": n / sum(ours(p, y, fit, k_max, shared) for p, y in data)}
    return out


class Probe:
    """One context over `target`'s weights with n_seq_max sequences, each holding its own tokens,
    and a batch that spreads rows over them."""

    def __init__(self, target, seqs: int, unified: bool, n_ctx: int, args):
        lib, threads = target.lib, args.threads
        self.lib, self.clock = lib, CLOCKS[args.clock]
        p = lib.llama_context_default_params()
        p.n_ctx, p.n_seq_max, p.kv_unified, p.swa_full = n_ctx * seqs, seqs, unified, True
        p.n_batch = p.n_ubatch = 512
        p.n_threads = p.n_threads_batch = threads
        p.no_perf = True
        self.ctx = lib.llama_init_from_model(target.llama_model, p)
        if not self.ctx:
            raise SystemExit(f"no context with n_seq_max {seqs} (kv_unified {unified})")
        self.mem = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(512, 0, 1)
        self.seqs, self.held = seqs, 0

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)

    def decode(self, per_seq: list[list[int]], logits: bool) -> float:
        """Seconds of one llama_decode of per_seq[i]'s tokens after what sequence i holds."""
        b, j = self.batch, 0
        for s, tokens in enumerate(per_seq):
            for i, t in enumerate(tokens):
                b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = t, self.held + i, 1, logits
                b.seq_id[j][0] = s
                j += 1
        b.n_tokens = j
        t0 = self.clock()
        if self.lib.llama_decode(self.ctx, b) != 0:
            raise SystemExit(f"llama_decode failed on {j} rows over {self.seqs} sequences")
        self.lib.llama_synchronize(self.ctx)
        return self.clock() - t0

    def hold(self, prompts: list[list[int]]) -> None:
        """Prefill sequence i with prompts[i] (all of one length), in batches of at most 512."""
        n = len(prompts[0])
        for start in range(0, n, 512 // self.seqs):
            self.decode([p[start:start + 512 // self.seqs] for p in prompts], False)
            self.held = min(n, start + 512 // self.seqs)

    def drop(self) -> None:
        """Every sequence back to what it held (the measured rows rolled back)."""
        for s in range(self.seqs):
            if not self.lib.llama_memory_seq_rm(self.mem, s, self.held, -1):
                raise SystemExit("llama_memory_seq_rm failed")


def measure(target, prompts: list[list[int]], seqs: int, unified: bool,
            args) -> dict[int, list[float]]:
    """The seconds of --reps decodes of R rows over `seqs` sequences, for each R of shapes()."""
    probe = Probe(target, seqs, unified, args.context + 2 * (args.k_max + 1), args)
    try:
        held = [(p * (args.context // len(p) + 1))[: args.context] for p in prompts[:seqs]]
        probe.hold(held)
        times: dict[int, list[float]] = {r: [] for r in shapes(seqs, args.k_max)}
        for rep in range(args.reps + 1):
            for r in times:
                rows = [held[s][:n] for s, n in enumerate(spread(r, seqs))]
                seconds = probe.decode(rows, True)
                probe.drop()
                if rep:  # the first round builds each graph
                    times[r].append(seconds)
        return times
    finally:
        probe.close()


Table = dict[bool, dict[int, dict[int, list[float]]]]  # unified -> S -> R -> seconds measured


def costs_table(target, prompts: list[list[int]], args) -> Table:
    """Both KV layouts' decodes, their medians printed as they come."""
    out: Table = {False: {}, True: {}}
    for seqs in SEQS:
        for unified in (False, True):
            out[unified][seqs] = measure(target, prompts, seqs, unified, args)
            cost = priced(out[unified][seqs], np.median)
            (a, b), (c, d) = lines(cost)
            shown = " ".join(f"{r}:{1000 * s:.1f}" for r, s in cost.items())
            print(f"S={seqs} {'unified' if unified else 'per-seq'}: line {1000 * c:.1f} + "
                  f"{1000 * d:.2f}*R ms, lowered {1000 * a:.1f} + {1000 * b:.2f}*R; {shown}",
                  flush=True)
    return out


def priced(times: dict[int, list[float]], stat) -> dict[int, float]:
    return {r: float(stat(t)) for r, t in times.items()}


def prompt_seconds(target, prompts: list[list[int]], args) -> float:
    """What processing the prompts takes (each prefilled alone, the median of 3 on --clock): a
    server pays it per request whether the decodes are batched or not, and on this compute-bound
    CPU a batch does not make it cheaper."""
    clock, total = CLOCKS[args.clock], 0.0
    for p in prompts:
        times = []
        for _ in range(3):
            t0 = clock()
            target.sync(p[:-1], logits="none")
            times.append(clock() - t0)
            target.reset()
        total += float(np.median(times))
    return total


def with_prompts(data, got: dict[int, dict[str, float]], seconds: float) -> None:
    """The bound and the estimate over queued lookup with the prompts' processing (`seconds`)
    counted too, as an end-to-end clock (benchmarks/serve_bench.py's) counts it."""
    n = sum(len(y) for _, y in data)
    today = seconds + n / got[1]["queued lookup"]
    print(f"\nwith prompt processing ({seconds:.2f} s for {len(data)} prompts, "
          f"{n} tokens generated): bound / queued lookup, controller (est.) / queued lookup")
    for s, r in got.items():
        print(f"N={s} | {today / (seconds + n / r['bound']):.2f}x | "
              f"{today / (seconds + n / r['controller (est.)']):.2f}x")


def report(data, table: Table, args, stat, prompt_s: float) -> None:
    """The rates at each N on the faster KV layout there, each shape priced at `stat` of its
    decodes; then with the prompts' processing (`prompt_s` seconds) counted too."""
    cost = {u: {s: priced(table[u][s], stat) for s in SEQS} for u in table}
    faster = {s: min((False, True), key=lambda u: sum(cost[u][s].values())) for s in SEQS}
    batch = {s: cost[faster[s]][s] for s in SEQS}
    rows = sorted(batch[1])  # the one-sequence costs of every R, between the measured ones
    one = [0.0] + list(np.interp(range(1, args.k_max + 2), rows, [batch[1][r] for r in rows]))
    got = rates(data, one, batch, args.k_max)
    names = list(got[1])
    print(f"\ntokens/s (replayed, each shape's {stat.__name__}) | " + " | ".join(names)
          + " | bound / batched plain | "
          "bound / queued lookup | batched plain / queued lookup | KV")
    for s, r in got.items():
        cells = " | ".join(f"{r[k]:.1f}" for k in names)
        print(f"N={s} | {cells} | {r['bound'] / r['batched plain']:.2f}x | "
              f"{r['bound'] / r['queued lookup']:.2f}x | "
              f"{r['batched plain'] / r['queued lookup']:.2f}x | "
              f"{'unified' if faster[s] else 'per-seq'}")
    with_prompts(data, got, prompt_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--context", type=int, default=384, help="tokens each sequence holds")
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--line", type=lambda v: [float(x) / 1000 for x in v.split(",")],
                    metavar="A,B", help="no measuring: replay at A + B*R ms a decode (a what-if)")
    ap.add_argument("--clock", choices=CLOCKS, default="wall",
                    help="what a decode's cost is: its wall time, or CPU time (with --threads 1)")
    common.sample_options(ap)
    args = ap.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        raise SystemExit("--clock cpu needs --threads 1 (ggml's threads spin while they wait)")
    engine.set_verbose(False)
    seed = common.fresh_seed(args.seed)
    texts = common.chosen(CODE, max(args.prompts, max(SEQS)), args, seed)
    priced_by = (f"the median of {args.reps} {args.clock} times a shape; {args.context} tokens a "
                 "sequence" if not args.line
                 else f"costs {args.line[0] * 1000:g} + {args.line[1] * 1000:g}*R ms")
    print(f"{common.machine(args.threads)}; F16; {CODE}, "
          f"{'tuning list' if args.tuning else f'unseen, --seed {seed}'}; {priced_by}")
    with engine.Model(models()["F16"], n_ctx=CTX_SIZE, n_threads=args.threads) as target:
        prompts = [target.tokenize(t) for t in texts]
        table = costs_table(target, prompts, args) if not args.line else {
            u: {s: {r: [args.line[0] + args.line[1] * r] for r in shapes(s, args.k_max)}
                for s in SEQS} for u in (False, True)}
        data = [(p, plain_output(target, p, args.tokens)) for p in prompts[: args.prompts]]
        prompt_s = prompt_seconds(target, [p for p, _ in data], args)
    report(data, table, args, np.median, prompt_s)
    if not args.line:
        report(data, table, args, np.min, prompt_s)  # a busy machine only slows a decode


if __name__ == "__main__":
    main()
