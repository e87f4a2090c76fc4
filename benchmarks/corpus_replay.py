"""How the corpus of earlier requests should draft: its rules replayed over the target's own greedy output on
agentic.py's workloads, with this machine's measured batch costs (as lookup_bound.py replays lookup's).

    python benchmarks/corpus_replay.py [--requests 16] [--tokens 128]

Each workload's requests are decoded plainly once, in order (the output every rule must reproduce); then each rule
drafts them in that order with one controller and one corpus across the requests, as `spectool serve` does, and is
charged the measured cost of each verification:
- no corpus (today's lookup);
- the corpus voting for a match's most frequent follower (`vote`, the default) or for the last seen (`latest`);
- the corpus where its match is longer than the request's own by more than 0 (the default), 2 or 4 tokens, as
  long (it wins ties: margin -1), and only where the request's own text has no match at all;
- the corpus keeping n-grams up to 12 tokens (the request's own index's longest) instead of 8.
Replayed costs leave out Python time and machine noise: compare the ratios, not the tokens/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from agentic import WORKLOADS  # noqa: E402
from lookup_bound import batch_costs, ours  # noqa: E402
from run import models  # noqa: E402

from spectool.llama import engine  # noqa: E402 (llama.cpp's libraries before numpy)
from spectool.core.controller import Controller  # noqa: E402
from spectool.core.costs import Costs  # noqa: E402
from spectool.core.speculative import Generation, speculative_generate  # noqa: E402
from spectool.drafters.corpus import Corpus  # noqa: E402
from spectool.drafters.lookup import PromptLookup, latest, vote  # noqa: E402
from spectool.options import CORPUS_TOKENS, CTX_SIZE  # noqa: E402

RULES = {"no corpus (today's lookup)": None, "corpus, most frequent (default)": (vote, 0),
         "corpus, last seen": (latest, 0), "corpus, wins ties too (margin -1)": (vote, -1),
         "corpus, margin 2": (vote, 2), "corpus, margin 4": (vote, 4),
         "corpus only where own text has no match": (vote, 10_000), "corpus of n-grams up to 12": (vote, 0, 12)}


def replay(data, rule, cost, k_max: int) -> float:
    """Seconds the rule's steps would cost over the requests of `data` in order."""
    ctl, corpus = Controller(k_max=k_max, costs=Costs()), None
    if rule is not None:
        corpus = Corpus(CORPUS_TOKENS, pick=rule[0], **({"n_max": rule[2]} if len(rule) > 2 else {}))
    total = 0.0
    for p, y in data:
        lookup = PromptLookup(corpus_margin=rule[1] if rule else 0)
        lookup.corpus = corpus
        total += ours(p, y, cost, k_max, ctl.costs, lookup, ctl)
        if corpus is not None:
            corpus.add(p + y)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="only the workloads whose name contains this text")
    args = ap.parse_args()
    engine.set_verbose(False)
    lines = ["| workload | rule, replayed | tok/s | vs no corpus |", "|---|---|---:|---:|"]
    with engine.Model(models()["F16"], n_ctx=CTX_SIZE, n_threads=args.threads) as target:
        cost = None
        for name, make in WORKLOADS.items():
            if args.only not in name:
                continue
            data = []
            for text in make(args.requests):
                p = target.tokenize(text)
                g = Generation(target, None, max_tokens=args.tokens)
                data.append((p, [t for s in speculative_generate(g, p) for t in s.tokens]))
            cost = cost or batch_costs(target, data[0][0], args.k_max + 1)
            n = sum(len(y) for _, y in data)
            seconds = {rule: replay(data, r, cost, args.k_max) for rule, r in RULES.items()}
            base = seconds["no corpus (today's lookup)"]
            for rule, s in seconds.items():
                lines.append(f"| {name} | {rule} | {n / s:.1f} | {base / s:.2f}x |")
            print("\n".join(lines), flush=True)
    print("\nbatch cost (ms): " + " ".join(f"{b}:{1000 * c:.1f}" for b, c in enumerate(cost or []) if b))


if __name__ == "__main__":
    main()
