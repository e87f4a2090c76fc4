"""The target's own confidence as a signal for lookup's controller (issue 57, item 2): what the margin of the target's
top choice, on the rows it has just verified, could tell a controller about whether a copy goes on, in hindsight and
learnt online, over every format family on both real models.

    python research/margin_signal.py [--seed N] [--models gemma-f16,smollm2] [--tuning]

For each real model and format family (spectool_lab.formats: unseen samples by default), the target's greedy output
of 8 prompts, the margin (top logit less the second) of the row that made each output token, and this machine's
batch costs. At each output position j a step starts; the rows verified before it are known, so the step's features
can hold the margin of the row that made token j - 1 ("last") and the least over the rows of tokens j - 4 .. j - 1
("min of 4"), bucketed by MARGIN_EDGES (logits). controller_replay.py's chooser then picks each step's length from
each feature combination's acceptance: over the very prompt it is scored on (hindsight: no estimate learnt online
from those features can know more), and learnt online from the steps so far after the controller's estimate for the
key. Each cell is the share of the oracle over the same drafts (replay.oracle, which knows what is accepted).
Hindsight over a finer partition partly memorizes the prompt, so two more columns ask what carries over between
formats: the chooser told the rates of the model's other families (key alone, and key with the last margin where
the others saw that pair), and one factor per margin bucket on the controller's own estimate, learnt online
(`factored_seconds`: afresh each prompt, as a `run`, and carried over the family's prompts, as a server).
A signal is worth building only where it raises the online share on the families, held-out ones included.
"""

from __future__ import annotations

import argparse
import bisect

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (spectool/llama/native.py)
import numpy as np  # noqa: E402

from spectool_lab import common, formats  # noqa: E402
from spectool_lab.replay import batch_costs, oracle, plain_output  # noqa: E402

from spectool.core.controller import Controller  # noqa: E402
from spectool.llama import engine  # noqa: E402
from spectool.options import CTX_SIZE  # noqa: E402

from controller_replay import (K_MAX, features, hindsight_seconds, known, learnt_seconds,  # noqa: E402
                               online_seconds, rates)

MARGIN_EDGES = (0.5, 1.0, 2.0, 4.0, 8.0)  # logits: a bucket's lower edges after the first (below 0.5)
RICHEST = lambda f: (f["key"], f["n"], f["votes"], f["total"], f["run"] // 4)  # noqa: E731 - controller_replay's
TODAY = lambda f: f["key"]  # noqa: E731 - online, the controller's own estimate alone
SIGNALS = {
    "key (today's)": TODAY,
    "key, last margin": lambda f: (f["key"], f["last"]),
    "key, min of 4": lambda f: (f["key"], f["min4"]),
    "key, length, votes, run": RICHEST,
    "the same, min of 4": lambda f: (*RICHEST(f), f["min4"]),
}


def margins(target, prompt: list[int], y: list[int]) -> list[float]:
    """The margin of the row that made each token of `y`, after a plain prefill of the prompt, `y` in one batch."""
    target.reset()
    target.eval(prompt[:-1], logits="none")
    target.eval([prompt[-1], *y[:-1]], logits="all")
    out = []
    for j in range(len(y)):
        row = target.logits(j)
        two = row[np.argpartition(row, -2)[-2:]]
        out.append(float(abs(two[1] - two[0])))
    return out


def with_margins(pos: list[tuple[int, list[dict]]], m: list[float]) -> list[tuple[int, list[dict]]]:
    """controller_replay.features' positions, each drafted token told the bucket of the margins known at its step's
    start ("last", "min4"; -1 before any row)."""
    def bucket(x: float | None) -> int:
        return -1 if x is None else bisect.bisect_right(MARGIN_EDGES, x)

    out = []
    for j, (acc, feats) in enumerate(pos):
        last = bucket(m[j - 1] if j else None)
        low = bucket(min(m[max(0, j - 4):j]) if j else None)
        out.append((acc, [{**f, "last": last, "min4": low} for f in feats]))
    return out


def factored_seconds(pos: list[tuple[int, list[dict]]], cost: list[float], signal: str,
                     factor: dict | None = None, weight: float = 4.0) -> float:
    """Seconds of the chooser over one prompt's positions told the controller's estimate for each token's key (costs
    known) times its margin bucket's factor: how far the tokens drafted at that bucket were accepted against what the
    estimates expected (decayed, after `weight` expected hits at a factor of 1), one factor per bucket for every key,
    learnt online; `factor` carries it between prompts (a server's controller), else it starts afresh (a `run`)."""
    ctl, factor = Controller(k_max=K_MAX, costs=known(cost)), {} if factor is None else factor

    def chance(f: dict) -> float:
        expected, hits = factor.get(f[signal], (0.0, 0.0))
        return min(1.0, ctl.acceptance(f["key"]) * (hits + weight) / (expected + weight))

    def learn(feats: list[dict], k: int, m: int) -> None:
        for i, f in enumerate(feats[: min(k, m + 1)]):
            expected, hits = factor.get(f[signal], (0.0, 0.0))
            factor[f[signal]] = (expected * ctl.decay + ctl.acceptance(f["key"]), hits * ctl.decay + (i < m))
        ctl.observe_accept([f["key"] for f in feats[:k]], k, min(k, m))

    return learnt_seconds(pos, cost, chance, learn)

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    formats.family_options(ap, tuning=True)
    args = ap.parse_args()
    args.seed = common.fresh_seed(args.seed)
    engine.set_verbose(False)
    print(f"seed {args.seed}, {'tuning lists' if args.tuning else 'unseen samples'}; share of the oracle over the same "
          "drafts, hindsight / online (factors: afresh each prompt / carried over the family's prompts)\n")
    print("| model | family | " + " | ".join(SIGNALS) + " | other families' rates: key | the same: key, last margin "
          "| factor: last margin |\n|---|---|" + "---:|" * (len(SIGNALS) + 3))
    for name in args.models.split(","):
        with engine.Model(common.real_model(name), n_ctx=CTX_SIZE, n_threads=2) as target:
            measured = {fam: family(target, fam, args) for fam in args.families.split(",")}
        for fam, (pos, cost, bound) in measured.items():
            if not pos:
                continue
            cells = [f"{bound / sum(hindsight_seconds(ps, cost, fn) for ps in pos):.1%} / "
                     f"{bound / sum(online_seconds(ps, cost, None if fn is TODAY else fn) for ps in pos):.1%}"
                     for fn in SIGNALS.values()]
            others = [ps for f, (p, _, _) in measured.items() if f != fam for ps in p]
            for fn in (TODAY, SIGNALS["key, last margin"]):  # the rates of the other families
                fine, coarse = rates(others, fn), rates(others, TODAY)
                told = lambda f, fn=fn, fine=fine: fn(f) if fn(f) in fine else TODAY(f)  # noqa: E731
                seconds = sum(hindsight_seconds(ps, cost, told, {**coarse, **fine}) for ps in pos)
                cells.append(f"{bound / seconds:.1%}")
            carried: dict = {}
            cells.append(f"{bound / sum(factored_seconds(ps, cost, 'last') for ps in pos):.1%} / "
                         f"{bound / sum(factored_seconds(ps, cost, 'last', carried) for ps in pos):.1%}")
            print(f"| {name} | {fam}{' (held out)' if formats.FAMILIES[fam].held_out else ''} | "
                  + " | ".join(cells) + " |", flush=True)


def family(target, fam: str, args) -> tuple[list, list[float], float]:
    """A family's prompts' positions (features with margins), this machine's batch costs, the oracle's seconds."""
    chat = formats.ChatFormat.of(target)
    texts = [p.render(chat) for p in formats.chosen(fam, args.prompts, args.seed, args.tuning)]
    data = [(p, plain_output(target, p, args.tokens)) for p in (target.tokenize(t, parse_special=True) for t in texts)]
    data = [(p, y) for p, y in data if y]  # (an output that ended at once has no step)
    if not data:
        return [], [], 0.0
    cost = batch_costs(target, data[0][0], K_MAX + 1)
    pos = [with_margins(features(p, y), margins(target, p, y)) for p, y in data]
    return pos, cost, sum(oracle(p, y, cost, K_MAX) for p, y in data)

if __name__ == "__main__":
    main()
