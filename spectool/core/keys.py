"""What the controller learns acceptance by: the evidence behind one drafted token, as a small typed value.

A drafter names each token it offers with a `Key`: its source (prompt lookup or the draft model), for lookup the
match behind it (the n-gram length bucket and whether that n-gram's followers agreed) and how far along its
stretch it is, and the sampling temperature it will be verified at (acceptance is learnt per temperature).

Keys are interned: `Key.of` returns one object per distinct key, so the controller's tables hash them by
identity (no per-step string building or parsing on the hot path), and each key knows the key before it in its
stretch, its prior's key and itself at another temperature.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class Source(StrEnum):
    """Where a step's drafts came from: nothing drafted, prompt lookup, a draft model, the target's own MTP
    heads, or lookup's tokens then the draft model's or the MTP head's."""

    none = "none"
    lookup = "lookup"
    draft = "draft"
    mtp = "mtp"
    hybrid = "hybrid"


# lookup's evidence: how the n-gram's followers agreed on this token
AGREED, MOSTLY, SPLIT = "", "~", "?"


class Key:
    __slots__ = ("source", "match", "agreement", "pos", "temp", "before", "anchor", "drafter", "_at", "_next", "_text")
    _interned: ClassVar[dict[tuple, Key]] = {}

    source: Source  # Source.lookup, Source.draft or Source.mtp
    match: int  # lookup: the n-gram length bucket (1, 2, 3, 4, 8); 0 otherwise
    agreement: str  # lookup: AGREED, MOSTLY or SPLIT
    pos: int  # lookup: tokens after the start of its stretch (0: the start itself)
    temp: float  # sampling temperature; 0 = greedy
    before: Key | None  # the key of the token before it in its stretch (pos - 1), None at the start
    anchor: Key  # the greedy start of its stretch: whose prior it starts from
    drafter: Key  # what drafting this token cost is kept by: its source at its temperature

    @classmethod
    def of(cls, source: Source, match: int = 0, agreement: str = AGREED, pos: int = 0, temp: float = 0.0) -> Key:
        ident = (source, match, agreement, pos, temp)
        key = cls._interned.get(ident)
        if key is None:
            key = object.__new__(cls)
            key.source, key.match, key.agreement, key.pos, key.temp = ident
            key._at, key._next, key._text = {}, None, None
            cls._interned[ident] = key  # before its neighbours, which refer back to it
            key.before = cls.of(source, match, agreement, pos - 1, temp) if pos > 0 else None
            key.anchor = key if pos == 0 and temp == 0.0 else cls.of(source, match, agreement)
            key.drafter = key if (match, agreement, pos) == (0, AGREED, 0) else cls.of(source, temp=temp)
        return key

    @classmethod
    def lookup(cls, match: int, agreement: str = AGREED, pos: int = 0) -> Key:
        return cls.of(Source.lookup, match, agreement, pos)

    def at(self, temp: float) -> Key:
        """This key at sampling temperature `temp` (0: greedy)."""
        key = self._at.get(temp)
        if key is None:
            key = self._at[temp] = Key.of(self.source, self.match, self.agreement, self.pos, temp)
        return key

    @property
    def next(self) -> Key:
        """The key of the token after this one in its stretch (pos + 1)."""
        if self._next is None:
            self._next = Key.of(self.source, self.match, self.agreement, self.pos + 1, self.temp)
        return self._next

    def __str__(self) -> str:  # "lookup:2~+3@T0.8": for people (debug output, tests' messages)
        if self._text is None:
            text = self.source.value
            if self.source is Source.lookup:
                text += f":{self.match}{self.agreement}" + (f"+{self.pos}" if self.pos else "")
            self._text = text + (f"@T{self.temp:g}" if self.temp else "")
        return self._text

    __repr__ = __str__

    def __reduce__(self):  # copies and pickles stay interned
        return Key.of, (self.source, self.match, self.agreement, self.pos, self.temp)


DRAFT = Key.of(Source.draft)  # every draft-model token
MTP = Key.of(Source.mtp)  # every token of the target's MTP head
