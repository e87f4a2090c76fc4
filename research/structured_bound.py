"""How far drafting can go under a JSON schema: structured.py's extraction prompts, the drafting policies replayed
over the target's own constrained greedy output with this machine's measured batch costs (as lookup_bound.py
replays lookup's).

    python research/structured_bound.py [--prompts 8] [--tokens 256]

It decodes each prompt under its schema plainly once (the output every policy must reproduce), measures what
verifying a batch of 1..k_max+1 tokens costs, then charges each policy that cost per step, without running the
model again:
- spectool's drafting under the grammar (drafters/grammar.GrammarDrafter) with its adaptive Controller: the grammar's
  forced tokens only, lookup only, and lookup with the forced tokens (the default);
- the oracle over each of those drafts (lookup_bound.cheapest: it knows how many tokens of each draft the target
  accepts): no choice of draft lengths from those drafts can be cheaper;
- a drafter that knows the whole output (every draft accepted): what the batch costs alone allow.
Replayed costs leave out Python time, the grammar's masks and machine noise: compare the ratios, not the tokens/s.
"""

from __future__ import annotations

import argparse

from spectool_lab.common import models
from spectool_lab.extraction import extraction_prompts

from lookup_bound import accepted, batch_costs, cheapest, cost_line, plain_output, verified
from spectool.llama import engine  # llama.cpp's libraries before numpy: spectool/llama/native.py
from spectool.templates import prompt_tokens
from spectool.core.controller import Controller
from spectool.core.costs import Costs
from spectool.core.grammar import Grammar
from spectool.drafters.grammar import GrammarDrafter
from spectool.drafters.lookup import PromptLookup
from spectool.options import CTX_SIZE

DRAFTS = {"forced tokens only": (False, True), "lookup only": (True, False), "lookup + forced tokens": (True, True)}


def drafter(target, grammar: Grammar, lookup: bool, forced: bool) -> GrammarDrafter:
    return GrammarDrafter(PromptLookup() if lookup else None, grammar.matcher(target), forced=forced)


def controlled(d: GrammarDrafter, p, y, cost, ctl: Controller) -> float:
    """Seconds of the controller's steps over the output `y` of prompt `p`, drafting with `d`."""
    total, j = 0.0, 0
    while j < len(y):
        h = p + y[:j]
        keys = ctl.pick(d.peek(h, min(ctl.k_max, len(y) - j - 1)))
        draft = d.propose(h, len(keys), None, None).tokens if keys else []
        m, seconds = verified(ctl, keys, draft, y, j, cost)
        total += seconds
        d.constraint.push(y[j : j + m + 1])
        j += m + 1
    return total


def oracle(d: GrammarDrafter, p, y, cost, k_max: int) -> float:
    """Seconds of the oracle over `d`'s drafts (k_max tokens offered at every token of `y`)."""
    reach = []
    for j in range(len(y)):
        h = p + y[:j]
        offered = d.peek(h, min(k_max, len(y) - j - 1))
        reach.append(accepted(d.propose(h, len(list(offered)), None, None).tokens, y, j))
        d.constraint.push([y[j]])
    return cheapest(reach, cost)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine.set_verbose(False)
    with engine.Model(models()["F16"], n_ctx=CTX_SIZE, n_threads=args.threads) as target:
        data = []
        for ex in extraction_prompts(args.prompts):
            p = prompt_tokens(target, [{"role": "user", "content": ex.message}])
            grammar = Grammar.json_schema(ex.schema)
            data.append((p, plain_output(target, p, args.tokens, grammar), grammar))
        cost = batch_costs(target, data[0][0], args.k_max + 1)
        n = sum(len(y) for _, y, _ in data)
        rows = [("constrained plain", n * cost[1])]
        for name, (lookup, forced) in DRAFTS.items():
            ctl = Controller(k_max=args.k_max, costs=Costs())
            rows.append((f"controller: {name}", sum(controlled(drafter(target, g, lookup, forced), p, y, cost, ctl)
                                                    for p, y, g in data)))
        for name, (lookup, forced) in DRAFTS.items():
            rows.append((f"oracle: {name}", sum(oracle(drafter(target, g, lookup, forced), p, y, cost, args.k_max)
                                                for p, y, g in data)))
        rows.append(("a drafter that knows the output", sum(cheapest([min(args.k_max, len(y) - j - 1)
                                                                      for j in range(len(y))], cost)
                                                             for _, y, _ in data)))
    print(cost_line(cost))
    print(f"\n{len(data)} prompts, {n} tokens\n\n| policy, replayed | tok/s | vs constrained plain |\n|---|---:|---:|")
    for name, seconds in rows:
        print(f"| {name} | {n / seconds:.1f} | {rows[0][1] / seconds:.2f}x |")


if __name__ == "__main__":
    main()
