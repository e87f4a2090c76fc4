"""OpenAI's Predicted Outputs as a drafter: the text a request says its output will mostly be (the
file an edit request rewrites), drafted ahead of the request's usual drafter.

The drafter follows the output through the prediction (`Place`: where it stands there). While the
output writes the prediction's tokens, a draft is the prediction's continuation from there. Where
the output leaves it (a rejected draft, an edit), its place is found again by lookup of the output's
last tokens in the prediction: the longest n-gram of them that the prediction holds, at its nearest
occurrence ending at or after the last place the output was seen to follow, else at its latest one
before. Where the prediction has nothing to offer (no match, or its end), the request's usual
drafter (prompt lookup, a draft model, ...) drafts. The target verifies these drafts as any other:
the output is the same with a prediction or without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Iterable, Sequence


from spectool.core.evidence import Agreement, Evidence, Source, bucket
from spectool.core.grammar import Constraint
from spectool.core.protocol import EMPTY, Branch, Draft, Drafter, Estimate, no_grammar
from spectool.core.verify import Random, Sampling
from spectool.drafters.lookup import PromptLookup


@dataclass(frozen=True, slots=True)
class Place:
    """Where the output stands in the prediction."""

    pos: int  # the prediction's token the output would write next
    run: int  # how many of the output's last tokens are the prediction's before `pos`
    agreed: bool  # whether those tokens occur once in the prediction (else: once more, elsewhere)


START = Place(0, 0, True)  # a generation's output starts where the prediction does


class PredictionDrafter(Drafter):
    """The prediction's tokens (on the target's vocabulary) as a generation's first draft source,
    `fallback` (the session's drafter, or None) where it offers nothing (see the module). Its keys
    are Source.prediction's, by the length of the match behind the place (Evidence.match: its
    bucket, 0 at the output's start) and how far along the draft a token is, as lookup's are: the
    controller learns how often each is accepted."""

    N_MIN, N_MAX = 1, 8  # the n-grams of the output that find its place again
    STRETCH_MAX = PromptLookup.STRETCH_MAX  # tokens further along a draft share one key

    def __init__(self, prediction: Sequence[int], fallback: Drafter | None = None):
        self.prediction = list(prediction)
        # a character per token (ids are far below 0x110000): str.find looks n-grams up in C
        self.text = "".join(map(chr, self.prediction))
        self.fallback = fallback
        self.place: Place | None = START  # None: lost, and not found again
        self.anchor = 0  # the place after the last prediction token the output wrote
        self.seen = 0  # how many of the history's tokens the place follows
        # the last peek's offer where the prediction made it: (its history, that history's length,
        # the tokens); None where the fallback made it
        self._offer: tuple[Sequence[int], int, list[int]] | None = None
        self._drafted = False  # whether the last proposal was the prediction's

    def start(self, history: Sequence[int], constraint: Constraint | None = None) -> str | None:
        no_grammar(constraint)
        self.place, self.anchor, self.seen, self._offer = START, 0, len(history), None
        return self.fallback.start(history) if self.fallback is not None else None

    def follow(self, place: Place | None, anchor: int, history: Sequence[int], start: int,
               end: int) -> tuple[Place | None, int]:
        """(The place, the anchor) after the output wrote history[start:end], from `place` and
        `anchor`: each token that is the prediction's next moves them on, any other loses the
        place, found again after the last token (`find`)."""
        pred = self.prediction
        for t in history[start:end]:
            if place is not None and place.pos < len(pred) and pred[place.pos] == t:
                place = Place(place.pos + 1, place.run + 1, True)
                anchor = place.pos
            else:
                place = None
        if place is None:
            place = self.find(history, end, anchor)
        return place, anchor

    def find(self, history: Sequence[int], end: int, anchor: int) -> Place | None:
        """The place of the output (the history's first `end` tokens) found again: the longest of
        its last n-grams (N_MAX down to N_MIN tokens) that the prediction holds with a token after
        it, at its nearest occurrence ending at or after `anchor`, else at its latest one before;
        None where there is none."""
        text = self.text
        tail = "".join(map(chr, history[max(0, end - self.N_MAX) : end]))
        for n in range(len(tail), self.N_MIN - 1, -1):
            gram = tail[-n:]
            i = text.find(gram, max(0, anchor - n))
            if i < 0 or i + n >= len(text):
                i = text.rfind(gram, 0, max(0, anchor - 1))
            if i >= 0:
                return Place(i + n, n, text.count(gram) == 1)
        return None

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> Iterable[Evidence]:
        """The prediction's next tokens from the output's place, keyed (`keys`); the fallback's
        offer where it has none. Under a grammar, the history's tokens past `final` (forced, not
        final yet) move the place for this offer only."""
        final = len(history) if final is None else final
        self.place, self.anchor = self.follow(self.place, self.anchor, history, self.seen, final)
        self.seen = final
        place = self.place
        if final < len(history):
            place, _ = self.follow(place, self.anchor, history, final, len(history))
        tokens = self.prediction[place.pos : place.pos + k_max] if place is not None else []
        self._offer = None
        if self.fallback is not None:
            offer = iter(self.fallback.peek(history, k_max, estimate, final))
            first = next(offer, None)
            if first is not None and (not tokens or self.outmatched(place, first)):
                return chain([first], offer)
        if not tokens:
            return []
        assert place is not None
        self._offer = (history, len(history), tokens)
        return self.keys(place, len(tokens))

    @staticmethod
    def outmatched(place: Place | None, key: Evidence) -> bool:
        """Whether the fallback's first token, under `key`, rests on a longer match than the
        prediction's place (a lookup's n-gram, bucketed as the place's run): an output that went
        its own way (a loop of its own, text the prediction lacks) is lookup's to copy. At the
        output's start (no run yet) the prediction goes first."""
        return place is not None and place.run > 0 and key.match > bucket(place.run) and \
            key.source in (Source.lookup, Source.corpus)

    def keys(self, place: Place, n: int) -> list[Evidence]:
        """The keys of n tokens drafted from `place`: its match's bucket and agreement, then one key
        a token further along the draft, up to STRETCH_MAX."""
        key = Evidence.lookup(bucket(place.run) if place.run else 0,
                              Agreement.agreed if place.agreed else Agreement.contested,
                              source=Source.prediction)
        out = [key]
        for _ in range(n - 1):
            if key.pos < self.STRETCH_MAX:
                key = key.next
            out.append(key)
        return out

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: Random,
                constraint: Constraint | None = None) -> Draft:
        """The first k tokens of the last peek's offer (peeked afresh where it was for another
        history): the prediction's (deterministic), or the fallback's draft."""
        offer = self._offer
        if offer is not None and not (offer[0] is history and offer[1] == len(history)):
            self.peek(history, k)
            offer = self._offer
        self._offer, self._drafted = None, offer is not None
        if offer is not None:
            return Draft(offer[2][:k], None, Source.prediction)
        if self.fallback is None:
            return EMPTY
        return self.fallback.propose(history, k, sampling, rng, constraint)

    def branches(self, history: Sequence[int], chain: Sequence[int], width: int) -> list[Branch]:
        """Beside the chain just proposed: the fallback's siblings (lookup's other followers), and
        where the fallback drafted it, the prediction's own token at each depth where it differs,
        from the place the chain so far leads to, at a share of 1/2 (one follower, seen once, as
        lookup counts one)."""
        theirs = self.fallback.branches(history, chain, width) if self.fallback is not None else []
        if self._drafted:
            return theirs
        ours, place, anchor, text = [], self.place, self.anchor, [*history, *chain]
        for d, token in enumerate(chain):
            if place is None or place.pos >= len(self.prediction):
                break
            if self.prediction[place.pos] != token:
                ours.append(Branch(d, self.prediction[place.pos], 0.5, Source.prediction))
            place, anchor = self.follow(place, anchor, text, len(history) + d, len(history) + d + 1)
        return [*theirs, *ours]  # (each source's: Controller.branch weighs them)

    def finish(self, history: Sequence[int]) -> None:
        if self.fallback is not None:
            self.fallback.finish(history)
