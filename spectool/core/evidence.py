"""What the controller learns acceptance by: the evidence behind one drafted token, as a small typed
value.

A drafter names each token it offers with a `Evidence`: its source, for prompt lookup the match
behind it (the n-gram length bucket and whether that n-gram's followers agreed) and how far along
its stretch it is, and the sampling temperature it will be verified at (acceptance is learnt per
temperature).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar


class Source(StrEnum):
    """Where a step's drafts came from: nothing drafted, prompt lookup, prompt lookup in the corpus
    of earlier requests (drafters/corpus.py), a draft model, the target's own MTP heads, an EAGLE-3
    head, a DFlash head, lookup's tokens then the draft model's or a head's, the tokens a grammar
    forces, or the prediction a request handed over (drafters/prediction.py: OpenAI's Predicted
    Outputs)."""

    none = "none"
    lookup = "lookup"
    corpus = "corpus"
    draft = "draft"
    mtp = "mtp"
    eagle3 = "eagle3"
    dflash = "dflash"
    hybrid = "hybrid"
    grammar = "grammar"
    prediction = "prediction"


class Mode(StrEnum):
    """How the user asks for drafts (--spec): auto picks the best source the models allow; none
    drafts nothing; the others name the Source to draft by (drafters/builder.py decides)."""

    auto = "auto"
    draft = "draft"
    lookup = "lookup"
    mtp = "mtp"
    eagle3 = "eagle3"
    dflash = "dflash"
    hybrid = "hybrid"
    none = "none"


class Agreement(StrEnum):
    """How the followers of lookup's n-gram agreed on the token drafted (its value is how a key
    prints it)."""

    agreed = ""  # the n-gram was always followed by this token
    mostly = "~"  # by others too, but mostly by this one
    contested = "?"  # not mostly by this one

# the n-gram match lengths lookup's keys keep apart: 1, 2, 3, 4-7, 8 and more
BUCKETS = (1, 2, 3, 4, 8)
_BUCKET_OF = [max((b for b in BUCKETS if b <= n), default=0) for n in range(BUCKETS[-1] + 1)]


def bucket(n: int) -> int:
    """The bucket of an n-gram match of length n >= 1: the largest of BUCKETS not above n."""
    return _BUCKET_OF[min(n, BUCKETS[-1])]


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Evidence:
    """The evidence behind one drafted token: its key in the controller's tables. Made by
    `Evidence.of` (or `Evidence.lookup`), which interns keys: one object per distinct key, so keys
    compare and hash by identity, cheaply."""

    source: Source  # lookup, corpus, prediction, draft, mtp, eagle3 or dflash
    # lookup: the n-gram length bucket (BUCKETS); the prediction: its match's (0: the output's
    # start); 0 otherwise
    match: int = 0
    agreement: Agreement = Agreement.agreed  # lookup: how the n-gram's followers agreed
    pos: int = 0  # lookup: tokens after the start of its stretch (0: the start itself)
    temp: float = 0.0  # sampling temperature; 0 = greedy
    # derived when interned (each key they name is made first, and none refers back to this one):
    # the key of the token before it in its stretch (pos - 1), None at 0
    before: Evidence | None = field(init=False)
    # the greedy start of its stretch: whose prior it starts from
    stretch_start: Evidence = field(init=False)
    # the key drafting costs are kept under: its source at its temperature
    cost_key: Evidence = field(init=False)
    # keys found from this one as they are first asked for (.next, .at): interning hashes `source`,
    # an enum
    _next: Evidence | None = field(init=False, default=None)
    _at: dict[float, Evidence] = field(init=False, default_factory=dict)

    _interned: ClassVar[dict[tuple, Evidence]] = {}

    @classmethod
    def of(cls, source: Source, match: int = 0, agreement: Agreement = Agreement.agreed,
           pos: int = 0, temp: float = 0.0) -> Evidence:
        """The one key with these fields."""
        ident = (source, match, agreement, pos, temp)
        key = cls._interned.get(ident)
        if key is None:
            key = cls._interned[ident] = cls(*ident)
        return key

    @classmethod
    def lookup(cls, match: int, agreement: Agreement = Agreement.agreed, pos: int = 0,
               source: Source = Source.lookup) -> Evidence:
        """A greedy prompt-lookup key (`source`: Source.lookup, or Source.corpus for a match in the
        corpus); `match` is one of BUCKETS (see `bucket`)."""
        return cls.of(source, match, agreement, pos)

    def __post_init__(self):
        source = self.source
        match = self.match
        agreement = self.agreement
        pos = self.pos
        temp = self.temp
        derive = object.__setattr__  # how a frozen dataclass sets the fields it derives
        derive(self, "before", Evidence.of(source, match, agreement, pos - 1, temp) if pos > 0
               else None)
        derive(self, "stretch_start", Evidence.of(source, match, agreement) if pos or temp
               else self)
        plain = match == 0 and agreement is Agreement.agreed and pos == 0
        derive(self, "cost_key", self if plain else Evidence.of(source, temp=temp))

    def at(self, temp: float) -> Evidence:
        """This key at sampling temperature `temp` (0: greedy); itself at its own temperature."""
        if temp == self.temp:
            return self
        key = self._at.get(temp)
        if key is None:
            key = self._at[temp] = Evidence.of(self.source, self.match, self.agreement, self.pos,
                                               temp)
        return key

    @property
    def next(self) -> Evidence:
        """The key of the token after this one in its stretch (pos + 1)."""
        key = self._next
        if key is None:
            key = Evidence.of(self.source, self.match, self.agreement, self.pos + 1, self.temp)
            object.__setattr__(self, "_next", key)
        return key

    def __str__(self) -> str:  # "lookup:2~+3@T0.8": for people (debug output, tests' messages)
        text = self.source.value
        if self.source in (Source.lookup, Source.corpus, Source.prediction):
            text += f":{self.match}{self.agreement}" + (f"+{self.pos}" if self.pos else "")
        return text + (f"@T{self.temp:g}" if self.temp else "")

    __repr__ = __str__

    def __reduce__(self):  # copies and pickles stay interned
        return Evidence.of, (self.source, self.match, self.agreement, self.pos, self.temp)


DRAFT = Evidence.of(Source.draft)  # every draft-model token
MTP = Evidence.of(Source.mtp)  # every token of the target's MTP head
EAGLE3 = Evidence.of(Source.eagle3)  # every token of an EAGLE-3 head (drafters/eagle3.py)
DFLASH = Evidence.of(Source.dflash)  # every token of a DFlash head (drafters/dflash.py)
GRAMMAR = Evidence.of(Source.grammar)  # every token a grammar forces
