"""What the controller learns acceptance by: the evidence behind one drafted token, as a small typed value.

A drafter names each token it offers with a `Key`: its source, for prompt lookup the match behind it (the n-gram
length bucket and whether that n-gram's followers agreed) and how far along its stretch it is, and the sampling
temperature it will be verified at (acceptance is learnt per temperature).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar


class Source(StrEnum):
    """Where a step's drafts came from: nothing drafted, prompt lookup, prompt lookup in the corpus of earlier
    requests (drafters/corpus.py), a draft model, the target's own MTP heads, lookup's tokens then the draft model's
    or the MTP head's, or the tokens a grammar forces."""

    none = "none"
    lookup = "lookup"
    corpus = "corpus"
    draft = "draft"
    mtp = "mtp"
    hybrid = "hybrid"
    grammar = "grammar"


# lookup's evidence: how the n-gram's followers agreed on this token
AGREED, MOSTLY, SPLIT = "", "~", "?"

BUCKETS = (1, 2, 3, 4, 8)  # the n-gram match lengths lookup's keys keep apart: 1, 2, 3, 4-7, 8 and more
_BUCKET_OF = [max((b for b in BUCKETS if b <= n), default=0) for n in range(BUCKETS[-1] + 1)]


def bucket(n: int) -> int:
    """The bucket of an n-gram match of length n >= 1: the largest of BUCKETS not above n."""
    return _BUCKET_OF[min(n, BUCKETS[-1])]


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Key:
    """The evidence behind one drafted token. Made by `Key.of` (or `Key.lookup`), which interns keys: one object
    per distinct key, so keys compare and hash by identity, cheaply, in the controller's tables."""

    source: Source  # Source.lookup, Source.corpus, Source.draft or Source.mtp
    match: int = 0  # lookup: the n-gram length bucket (BUCKETS); 0 otherwise
    agreement: str = AGREED  # lookup: AGREED, MOSTLY or SPLIT
    pos: int = 0  # lookup: tokens after the start of its stretch (0: the start itself)
    temp: float = 0.0  # sampling temperature; 0 = greedy
    # derived when interned (each key they name is made first, and none refers back to this one):
    before: Key | None = field(init=False)  # the key of the token before it in its stretch (pos - 1), None at 0
    anchor: Key = field(init=False)  # the greedy start of its stretch: whose prior it starts from
    drafter: Key = field(init=False)  # what drafting this token cost is kept by: its source at its temperature
    # keys found from this one as they are first asked for (.next, .at): interning hashes `source`, an enum
    _next: Key | None = field(init=False, default=None)
    _at: dict[float, Key] = field(init=False, default_factory=dict)

    _interned: ClassVar[dict[tuple, Key]] = {}

    @classmethod
    def of(cls, source: Source, match: int = 0, agreement: str = AGREED, pos: int = 0, temp: float = 0.0) -> Key:
        """The one key with these fields."""
        ident = (source, match, agreement, pos, temp)
        key = cls._interned.get(ident)
        if key is None:
            key = cls._interned[ident] = cls(*ident)
        return key

    @classmethod
    def lookup(cls, match: int, agreement: str = AGREED, pos: int = 0, source: Source = Source.lookup) -> Key:
        """A greedy prompt-lookup key (`source`: Source.lookup, or Source.corpus for a match in the corpus);
        `match` is one of BUCKETS (see `bucket`)."""
        return cls.of(source, match, agreement, pos)

    def __post_init__(self):
        source, match, agreement, pos, temp = self.source, self.match, self.agreement, self.pos, self.temp
        derive = object.__setattr__  # how a frozen dataclass sets the fields it derives
        derive(self, "before", Key.of(source, match, agreement, pos - 1, temp) if pos > 0 else None)
        derive(self, "anchor", Key.of(source, match, agreement) if pos or temp else self)
        derive(self, "drafter", Key.of(source, temp=temp) if (match, agreement, pos) != (0, AGREED, 0) else self)

    def at(self, temp: float) -> Key:
        """This key at sampling temperature `temp` (0: greedy)."""
        key = self._at.get(temp)
        if key is None:
            key = self._at[temp] = Key.of(self.source, self.match, self.agreement, self.pos, temp)
        return key

    @property
    def next(self) -> Key:
        """The key of the token after this one in its stretch (pos + 1)."""
        key = self._next
        if key is None:
            key = Key.of(self.source, self.match, self.agreement, self.pos + 1, self.temp)
            object.__setattr__(self, "_next", key)
        return key

    def __str__(self) -> str:  # "lookup:2~+3@T0.8": for people (debug output, tests' messages)
        text = self.source.value
        if self.source in (Source.lookup, Source.corpus):
            text += f":{self.match}{self.agreement}" + (f"+{self.pos}" if self.pos else "")
        return text + (f"@T{self.temp:g}" if self.temp else "")

    __repr__ = __str__

    def __reduce__(self):  # copies and pickles stay interned
        return Key.of, (self.source, self.match, self.agreement, self.pos, self.temp)


DRAFT = Key.of(Source.draft)  # every draft-model token
MTP = Key.of(Source.mtp)  # every token of the target's MTP head
GRAMMAR = Key.of(Source.grammar)  # every token a grammar forces
