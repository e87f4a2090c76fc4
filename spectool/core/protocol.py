"""The drafter protocol: what the speculative loop asks of any drafter, and the Draft it hands back.

A generation begins with `start(history, constraint)`: the prompt (a draft model prefills it) and,
under a grammar, the grammar's state the drafts must follow. Then once a step: `peek(history, k_max,
estimate)` offers up to k_max tokens cheaply, as one key per token (evidence.py: the evidence the
controller keeps acceptance statistics under), possibly lazily (prompt lookup predicts a token only
when the controller draws its key); the controller picks how many to draft (Controller.pick); then
`propose(history, k, sampling, rng)`, with the history peeked at, drafts the first k tokens of that
offer. A draft holds the drafter's probability rows q when it samples (None, or None for a token,
means deterministic: q is one-hot on that token). Under a grammar (drafters/grammar.py) the history
peeked at may end with tokens the grammar forces that are not final yet (`final`: how many of it
are), and `propose` gets the grammar's state (`constraint`): a drafter that draws from rows draws
from the grammar's masked rows, so that q stays what it drew from. The generation ends with
`finish(history)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Protocol, Sequence


from spectool.core.evidence import Evidence, Source
from spectool.core.grammar import Constraint
from spectool.core.verify import Dist, Random, Sampling


@dataclass
class Draft:
    tokens: list[int]
    # the drafter's rows, on the target's vocabulary (None: one-hot)
    q: Sequence[Dist | None] | None
    source: Source
    catch_up_seconds: float = 0.0  # time a drafter spent catching up on tokens it missed while idle
    # of the tokens, this many were forced by a grammar (Source.grammar; the rest: source's)
    forced: int = 0
    # a one-line message for the user: the drafter changed its plan (drafters/builder.py)
    notice: str | None = None


EMPTY = Draft([], None, Source.none)


WIDTH = 4  # the most tokens a draft tree holds at one node (ngram-map-k keeps as many)


class Branch(NamedTuple):
    """A token a drafter offers beside its draft's token at `depth` (a sibling in a draft tree,
    issue 59), with `share`: its estimated chance of being the target's token there where the
    draft's is not, as its `source` estimates it (the controller learns each source's shares apart:
    Controller.share_scale)."""

    depth: int
    token: int
    share: float
    source: Source


def at_best(offered: Sequence[Branch], value: Callable[[Branch], float]
            ) -> dict[tuple[int, int], tuple[float, int]]:
    """Each (depth, token) of `offered` once, at the largest of its values: (value, the index in
    `offered` of the sibling that has it), in the order first offered."""
    best: dict[tuple[int, int], tuple[float, int]] = {}
    for i, b in enumerate(offered):
        v = value(b)
        if (b.depth, b.token) not in best or v > best[b.depth, b.token][0]:
            best[b.depth, b.token] = v, i
    return best


def merged(offered: Sequence[Branch], width: int) -> list[Branch]:
    """Siblings of like shares (prompt lookup's own text and the corpus: counts of followers)
    beside one chain, by depth: each token once at a depth, at the largest of its shares, the
    likeliest first (ties: in the order offered), at most width - 1. Siblings of unlike shares are
    the controller's to weigh (Controller.branch)."""
    best = at_best(offered, lambda b: b.share)
    out: list[Branch] = []
    for depth in sorted({d for d, _ in best}):
        here = [offered[i] for (d, _), (_, i) in best.items() if d == depth]
        out += sorted(here, key=lambda b: -b.share)[: width - 1]
    return out


# key -> what the controller thinks a token drafted under it is worth
Estimate = Callable[[Evidence], float]


class Drafter(Protocol):
    """What proposes tokens (see the module). A class that subclasses it keeps `finish`'s
    default."""

    def start(self, history: Sequence[int], constraint: Constraint | None = None) -> str | None:
        """A generation begins over `history`, under the grammar's state `constraint` where it has
        one; a one-line notice for the user where the drafter had to change its plan (None: nothing
        to say)."""
        ...

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> Iterable[Evidence]: ...

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: Random,
                constraint: Constraint | None = None) -> Draft: ...

    def branches(self, history: Sequence[int], chain: Sequence[int], width: int) -> list[Branch]:
        """Tokens beside each of the deterministic draft `chain` (just proposed after `history`),
        at most width - 1 at a depth, as a draft tree's siblings: none by default (a chain is a
        tree with one leaf)."""
        return []

    def finish(self, history: Sequence[int]) -> None:
        """The generation ended: `history` is its prompt and output."""
        return None


def no_grammar(constraint: Constraint | None) -> None:
    """What a drafter that knows no grammar says to one: under a grammar a generation's drafter is
    built whole (drafters/builder.py wraps it in a GrammarDrafter), never handed one bare."""
    if constraint is not None:
        raise TypeError("this drafter drafts under no grammar: build the generation's drafter with "
                        "drafters.builder.for_generation")
