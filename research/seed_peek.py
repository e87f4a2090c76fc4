"""Whether the seed's own random numbers tell a sampled draft where to stop (issue 57, the sampled bars).

    python research/seed_peek.py [--seed N] [--models gemma-f16,smollm2] [--families qa,raw] [--prompts 4]
                                 [--samples 3] [--temp 0.8]

A seeded generation draws each token with one number of llama.cpp's `dist` sampler (core/verify.py's Random), and a
deterministic draft (lookup's) is kept while the target's own draw is the draft's token. So the text is the same
whatever is drafted, and the numbers that will draw the next tokens are known before the step: the walk goes by
decreasing probability, so a number near 1 draws from the tail of the row, where a copied token seldom is. Choosing a
draft's length from those numbers cannot change the text, only the time it takes.

Replayed over the target's own samples (audit_sampled.samples, seeded as benchmarks/vs_llamacpp.py seeds its
repeats) at this machine's batch costs, relative to plain decoding: spectool's lookup as it ships (unaudited
sampled), the same with each draft cut before the first token whose number is above a threshold, and the oracle over
lookup's drafts (replay.oracle: no controller choosing among them is faster).
"""

from __future__ import annotations

from spectool_lab import common, formats
from spectool_lab.replay import batch_costs, oracle, ours

from spectool.core.controller import Controller
from spectool.core.verify import Random
from spectool.llama import engine
from spectool.options import CTX_SIZE

from audit_sampled import options, samples
from controller_replay import K_MAX, known
from mean_bound import seeds

CUTS = (0.5, 0.7, 0.8, 0.9, 0.95)


class Cut(Controller):
    """The controller's pick, cut before the first drafted token whose number is above `above`."""

    def __init__(self, above: float, numbers: list[float], **kw):
        super().__init__(**kw)
        self.above, self.numbers, self.at = above, numbers, 0

    def pick(self, offer, temp: float = 0.0, limit=None):
        keys = super().pick(offer, temp, limit)
        for i in range(len(keys)):
            if self.at + i < len(self.numbers) and self.numbers[self.at + i] > self.above:
                return keys[:i]
        return keys


def seconds(p, y, cost, temp: float, numbers: list[float], above: float | None) -> float:
    costs = known(cost)
    if above is None:
        return ours(p, y, cost, K_MAX, costs, ctl=Controller(k_max=K_MAX, costs=costs, audit=False), temp=temp)
    ctl = Cut(above, numbers, k_max=K_MAX, costs=costs, audit=False)

    def step(c, offer, j, keys, m, n):
        c.at = n

    return ours(p, y, cost, K_MAX, costs, ctl=ctl, temp=temp, step=step)


def main() -> None:
    args, seed = options(__doc__)
    engine.set_verbose(False)
    print(f"{common.machine(2)}; unseen samples drawn with --seed {seed}; temperature {args.temp:g}, {args.samples} "
          f"samples a prompt, {args.tokens} tokens; replayed speed-up over plain decoding\n")
    print("| model | family | lookup | " + " | ".join(f"cut above {c:g}" for c in CUTS) + " | oracle |\n|---|---|"
          + "---:|" * (len(CUTS) + 2), flush=True)
    for name in args.models.split(","):
        with engine.Model(common.real_model(name), n_ctx=CTX_SIZE, n_threads=2) as target:
            chat, cost = formats.ChatFormat.of(target), None
            for fam in args.families.split(","):
                prompts = [target.tokenize(p.render(chat), parse_special=True)
                           for p in formats.chosen(fam, args.prompts, seed)]
                data = []
                for i, p in enumerate(prompts):
                    for s, y in zip(seeds(args, i), samples(target, p, args, seeds(args, i))):
                        rng = Random(s)
                        data.append((p, y, [rng.random() for _ in y]))
                cost = cost or batch_costs(target, prompts[0], K_MAX + 1)
                plain = sum(len(y) for _, y, _ in data) * cost[1]
                cells = [plain / sum(seconds(p, y, cost, args.temp, u, c) for p, y, u in data)
                         for c in (None, *CUTS)]
                cells.append(plain / sum(oracle(p, y, cost, K_MAX) for p, y, _ in data))
                print(f"| {name} | {fam} | " + " | ".join(f"{c:.3f}x" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
