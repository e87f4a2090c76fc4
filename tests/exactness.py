"""Whether sampled output follows the target's distribution: the exact joint distribution of a generation's first
tokens under the target alone, counts of the same tokens over seeded speculative runs, a chi-square test between
the two, and wrong acceptance rules that test must catch (docs/exactness.md)."""

import math

import numpy as np

from spectool_lab.helpers import tokens_of

from spectool.core.controller import Controller
from spectool.core.costs import Costs
from spectool.drafters.builder import for_generation
from spectool.generate.loop import GenerationConfig
from spectool.core.verify import Sampling, distribution

N_RUNS = 3000
N_JOINT = 3  # the joint distribution of the first 3 generated tokens ...
K_DRAFT = 3  # ... with drafts of 3 tokens, so that every draft position is exercised
SAMPLING = Sampling(temp=1.0)


def exact_joint(model, prompt, s, n_tokens=N_JOINT, floor=1e-5, banned=None):
    """P(first n generated tokens) under the target alone, decoding one token at a time, for sequences with
    more mass than `floor` (the chain itself is checked against llama.cpp's in test_verify.py). A sequence ends
    before an end-of-generation token, as generation does. `banned(prefix)`: the tokens a grammar bans after
    the generated `prefix`, masked out of the row before the chain (grammar first)."""
    joint = {}

    def walk(prefix, mass):
        if len(prefix) == n_tokens or (prefix and model.is_eog(prefix[-1])):
            key = tuple(prefix[:-1] if prefix and model.is_eog(prefix[-1]) else prefix)
            joint[key] = joint.get(key, 0.0) + mass
            return
        history = prompt + prefix
        model.sync(history)
        row = model.logits(-1) if banned is None else np.where(banned(prefix), -np.inf, model.logits(-1))
        d = distribution(row.astype(np.float32), s, history[-s.window:] if s.window else [])
        for t, pt in zip(d.ids.tolist(), d.p.tolist()):
            if mass * pt > floor:
                walk(prefix + [t], mass * pt)

    model.reset()
    walk([], 1.0)
    model.reset()
    return joint


def chi2_rejects(counts, joint, n, alpha_z=3.09):
    """Pearson chi-square of observed counts against `joint`; True if it rejects at about 0.1%."""
    cells = {c: p for c, p in joint.items() if p * n >= 5}
    other_p = 1.0 - sum(cells.values())
    stat, other_obs = 0.0, n
    for c, p in cells.items():
        o = counts.get(c, 0)
        other_obs -= o
        stat += (o - n * p) ** 2 / (n * p)
    if other_p * n >= 5:
        stat += (other_obs - n * other_p) ** 2 / (n * other_p)
    df = len(cells) - (0 if other_p * n >= 5 else 1)
    crit = df * (1 - 2 / (9 * df) + alpha_z * math.sqrt(2 / (9 * df))) ** 3  # Wilson-Hilferty, z = 3.09
    return stat > crit, stat, crit


def sample_joint(target, make_drafter, prompt, s=SAMPLING, n=N_RUNS, stats=None, grammar=None):
    """Counts of the first N_JOINT tokens over n seeded runs; the first step drafts K_DRAFT tokens (under
    `grammar`, with its forced tokens first). The runs share one cost table, as a user's runs do: the first
    measures what batches cost before its first step (generate/prompt.py's calibrate), the others need not."""
    counts, costs = {}, Costs()
    for seed in range(n):
        drafter = for_generation(make_drafter(), grammar is not None)
        g = GenerationConfig(target, drafter, s, Controller(k_max=K_DRAFT, adaptive=False, costs=costs),
                             max_tokens=K_DRAFT + 1, seed=seed, grammar=grammar)
        seq = tuple(tokens_of(g, prompt, stats)[:N_JOINT])
        counts[seq] = counts.get(seq, 0) + 1
    return counts


def wrong_acceptance(bug):
    """A realistic bug in the sampled acceptance step (a stand-in for verify.accept_sampled), which the chi-square
    test must catch: "accept always", "q[0] at every position", "p row off by one", or "draw again after a
    refusal" (a lookup draft refused, the token drawn afresh from p rather than the draw that refused it)."""
    from spectool.core.verify import accept_sampled as right

    def draw_again(p, q, d, rng, draw=None):  # (the rule's own draws through verify.py's chain)
        for i, token in enumerate(d):
            if p(i).sample(rng) != token:
                return i, p(i).sample(rng)
        return len(d), p(len(d)).sample(rng)

    def off_by_one(p, q, d, rng, draw=None):  # every row read one further on, by either chain
        def shift(i):
            return min(i + 1, len(d))
        return right(lambda i: p(shift(i)), q, d, rng, draw and (lambda i: draw(shift(i))))

    return {
        "draw again after a refusal": draw_again,
        "accept always": lambda p, q, d, rng, draw=None: (len(d), p(len(d)).sample(rng)),
        "q[0] at every position": lambda p, q, d, rng, draw=None: right(p, q and [q[0]] * len(q), d, rng, draw),
        "p row off by one": off_by_one,
    }[bug]
