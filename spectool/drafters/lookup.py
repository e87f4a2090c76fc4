"""Prompt lookup: n-gram drafting from the prompt and the text so far."""

from __future__ import annotations

from itertools import islice
from typing import Iterator, NamedTuple, Sequence


from spectool.core.evidence import Agreement, Evidence, Source, bucket
from spectool.core.protocol import EMPTY, Branch, Draft, Drafter, Estimate, merged, no_grammar
from spectool.core.verify import Random, Sampling

# an n-gram's: {token: count}, or the token alone where one was seen once
Followers = int | dict[int, int]


# The follower an n-gram's followers vote for: (token, how often it followed, how often any follower
# did). Plain tuples, made and unpacked once per predicted token: a NamedTuple's making doubled
# lookup's own time per step.
Vote = tuple[int, int, int]
# A predicted token with its evidence: (token, the match's length, its votes, their total, where)
Prediction = tuple[int, int, int, int, Source]


class Dispute(NamedTuple):
    """Where the corpus and the request's own text predicted different tokens, until the history
    shows which was right."""

    start: int  # the first position not yet verified when it was predicted
    before: list[int]  # the tokens predicted from there up to the disputed position
    own: int  # the request's own prediction
    theirs: int  # the corpus's


class NGramIndex:
    """Every n-gram (n_min <= n <= n_max) of a token sequence -> the tokens that followed it, with
    counts, in the order of their last occurrence; kept up to date as the sequence grows. A
    prediction costs O(n_max) dictionary look-ups, whatever the sequence's length."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min = n_min
        self.n_max = n_max
        self.tokens: list[int] = []  # the sequence indexed
        # An n-gram is a string of n characters, chr(token) each (token ids are far below 0x110000):
        # sliced, hashed and compared in one piece, and not tracked by the garbage collector as a
        # tuple would be. Its followers are {token: count}, or the token alone where one was seen
        # once (most n-grams of a text: an int costs a fraction of a dict's memory and making)
        self._follow: dict[str, Followers] = {}
        # the first match of the last prediction: the next one's first guess
        self.first_guess = n_max

    def extend(self, history: Sequence[int], end: int | None = None) -> None:
        """Index `history` (its first `end` tokens): the tokens past those indexed, or all of it
        anew where it does not extend them."""
        n_old = len(self.tokens)
        end = len(history) if end is None else end
        if n_old > end or (n_old and history[n_old - 1] != self.tokens[-1]):
            self.tokens, self._follow = [], {}
            n_old = 0
        # the n-grams before the next token are its ends
        tail = "".join(map(chr, self.tokens[-self.n_max:]))
        self._count(tail, history[n_old:end])
        self.tokens += history[n_old:end]

    def add(self, doc: Sequence[int], start: int = 0) -> None:
        """Index a document of a corpus (Corpus): the n-grams ending before each of its tokens from
        `start` on, none reaching back before it. The document's tokens are not kept (`tokens` stays
        the sequence's)."""
        self._count("".join(map(chr, doc[max(0, start - self.n_max) : start])), doc[start:])

    def remove(self, doc: Sequence[int]) -> None:
        """Forget a document `add` indexed whole: each of its n-grams counted once less, dropped at
        zero."""
        # locals, in the loop over every token
        follow, n_min, n_max = self._follow, self.n_min, self.n_max
        tail = ""
        for t in doc:
            m = len(tail)
            for n in range(n_min, m + 1):
                gram = tail[m - n :]
                f = follow[gram]
                if isinstance(f, int):
                    del follow[gram]
                    continue
                c = f[t] - 1
                if c:
                    f[t] = c
                else:
                    del f[t]
                # seen once now: the token alone, as `_count` makes it
                if len(f) == 1 and 1 in f.values():
                    follow[gram] = next(iter(f))
            tail = tail[1 - n_max :] + chr(t) if n_max > 1 else chr(t)

    def _count(self, tail: str, new: Sequence[int]) -> None:
        """Count the n-grams before each token of `new`, `tail` (chr per token) the text before the
        first."""
        # locals, in the loop over every token
        follow, n_min, n_max = self._follow, self.n_min, self.n_max
        for t in new:
            m = len(tail)
            for n in range(n_min, m + 1):
                gram = tail[m - n :]
                f = follow.get(gram)
                if f is None:
                    follow[gram] = t
                elif isinstance(f, int):
                    follow[gram] = {t: 2} if f == t else {f: 1, t: 1}
                else:  # counted, and moved last: a follower's order is that of its last occurrence
                    f[t] = f.pop(t, 0) + 1
            tail = tail[1 - n_max :] + chr(t) if n_max > 1 else chr(t)

    def __len__(self) -> int:
        """How many n-grams are indexed."""
        return len(self._follow)

    def predict(self, context: Sequence[int]) -> Iterator[Prediction]:
        """What follows `context`, token after token, each predicted token taken as the next one's
        context: the vote of the followers of the longest n-gram ending the context that was seen
        before, voting for its most frequent follower (ties: the last seen). Ends only where no
        n-gram was seen: take as many as needed.

        The longest match is searched from a guess, up or down: an n-gram seen (followed by
        something) means each of its suffixes was seen, and one not seen means no longer one was.
        The guess is one more than the last match (right at the first look-up along a copied
        stretch), first the last prediction's first match."""
        seq = "".join(map(chr, context[-self.n_max :]))
        n, f = self.longest(seq, self.first_guess)
        if f is not None:
            self.first_guess = n
        while f is not None:
            token, votes, total = vote(f)
            yield token, n, votes, total, Source.lookup
            seq += chr(token)
            n, f = self.longest(seq, n + 1)

    def longest(self, seq: str, guess: int) -> tuple[int, Followers | None]:
        """(n, the followers) of the longest n-gram ending `seq` seen before, searched from `guess`
        (see `predict`); (0, None) where none was."""
        follow, n_min = self._follow, self.n_min
        top = min(self.n_max, len(seq))
        n = max(n_min, min(guess, top))
        f = follow.get(seq[-n:])
        if f is not None:
            while n < top and (longer := follow.get(seq[-n - 1 :])) is not None:
                n, f = n + 1, longer
            return n, f
        while f is None:
            n -= 1
            if n < n_min:
                return 0, None
            f = follow.get(seq[-n:])
        return n, f


def latest(f: Followers) -> Vote:
    """`vote`'s answer by recency alone: the follower seen last (research/corpus_replay.py measures
    both)."""
    if isinstance(f, int):
        return f, 1, 1
    t = next(reversed(f))
    return t, f[t], sum(f.values())


def ranked(f: Followers | None) -> list[tuple[int, int]]:
    """An n-gram's followers as (token, count), the most frequent first, ties the last seen first
    (`vote`'s order: the first is what lookup drafts)."""
    if f is None:
        return []
    if isinstance(f, int):
        return [(f, 1)]
    return sorted(((t, f[t]) for t in reversed(f)), key=lambda tc: -tc[1])


def vote(f: Followers) -> Vote:
    """The most frequent follower; of those, the last seen."""
    if isinstance(f, int):  # the usual case: one follower, seen once
        return f, 1, 1
    if len(f) == 1:
        ((t, c),) = f.items()
        return t, c, c
    t = max(reversed(f), key=f.__getitem__)
    return t, f[t], sum(f.values())


class LookupOffer:
    """What PromptLookup.peek offers: iterated, the key of each predicted token, predicted as it is
    drawn (the controller draws only while a longer draft could pay); `take(k)` the first k tokens,
    however many keys were drawn before."""

    __slots__ = ("history", "n_history", "tokens", "sources", "keys", "_keys")

    def __init__(self, lookup: PromptLookup, history: Sequence[int], k_max: int,
                 final: int | None = None):
        self.history, self.n_history = history, len(history)
        self.tokens: list[int] = []  # the tokens behind the keys drawn so far ...
        # ... and where each came from: the request's own text or the corpus
        self.sources: list[Source] = []
        self.keys: list[Evidence] = []  # ... and their keys
        self._keys = lookup._keys(history, k_max, self.tokens, final, self.sources, self.keys)

    def __iter__(self) -> Iterator[Evidence]:
        return self._keys

    def take(self, k: int) -> list[int]:
        """The first k tokens on offer (fewer where the prediction ends); `keys[:k]` are theirs."""
        if len(self.tokens) < k:
            for _ in islice(self._keys, k - len(self.tokens)):
                pass  # drawing a key predicts its token
        return self.tokens[:k]

    def is_for(self, history: Sequence[int]) -> bool:
        return history is self.history and len(history) == self.n_history


class PromptLookup(Drafter):
    """N-gram drafting from the prompt and the text so far (NGramIndex): a draft extends the current
    suffix one token at a time by the followers of its longest n-gram seen before. With a `corpus`
    (drafters/corpus.py: the text of earlier requests), a token comes from the corpus where the
    request's own text has no match, or where the corpus's is longer by more than `corpus_margin`
    tokens and the corpus outranks the request's own text (Corpus.outranks: it has been right at
    least as often where the two disagreed), under keys of its own (Source.corpus): the controller
    learns how far the corpus is right apart from the request's own text."""

    STRETCH_MAX = 16  # continuations further along a stretch share one key

    def __init__(self, n_min: int = 1, n_max: int = 12, corpus=None, corpus_margin: int = 0):
        if not 1 <= n_min <= n_max:
            raise ValueError("lookup n-gram sizes need 1 <= n_min <= n_max")
        self.index = NGramIndex(n_min, n_max)
        self.corpus = corpus  # a Corpus, consulted while it holds something (a generation's
        # Drafting sets it: drafters/builder.py)
        self.corpus_margin = corpus_margin
        self._offer: LookupOffer | None = None  # the last peek's, until propose drafts from it
        self._disputes: dict[int, Dispute] = {}  # by the disputed position

    def _keys(self, history: Sequence[int], k: int, tokens: list[int], final: int | None = None,
              sources: list[Source] | None = None,
              keys: list[Evidence] | None = None) -> Iterator[Evidence]:
        """For LookupOffer: the controller keys of up to k tokens predicted after `history`, lazily,
        each key's token appended to the offer's `tokens` as the key is yielded (its source to
        `sources`, the key to `keys`).

        A draft copies a stretch of the history: its first token comes from an n-gram match, and
        each next one usually from the same match one token longer, which by then includes drafted
        tokens and so proves nothing new. Such a continuation is keyed by where its stretch began
        and how far along it is ("lookup:2+3": the third token after a 2-gram start), so the
        controller learns how stretches wear out. A token whose own evidence breaks the stretch (a
        shorter match: the copied text went another way before; or followers that disagreed; or the
        other source) starts a new one under its own key (`key`). Only the first `final` tokens of
        the history are indexed (the rest, a grammar's forced tokens, may yet be rejected)."""
        final = len(history) if final is None else final
        self.index.extend(history, final)
        if self._disputes and self.corpus is not None:
            self._settle(history, final)
        yield from self._predicted(history, k, tokens, sources, final, keys)

    def _predicted(self, history: Sequence[int], k: int, tokens: list[int],
                   sources: list[Source] | None = None, final: int | None = None,
                   keys: list[Evidence] | None = None) -> Iterator[Evidence]:
        """`_keys` on the index as it is (`final`: where the history's verified tokens end, to note
        disputes from; None notes none)."""
        corpus = self.corpus
        both = corpus is not None and len(corpus.index) > 0
        predicted = (self._predict_both(history, corpus, final) if both
                     else self.index.predict(history))
        corpus_n_max = corpus.index.n_max if corpus is not None else 0
        key: Evidence | None = None
        prev_n, prev_source = 0, Source.lookup
        for token, n, votes, total, source in islice(predicted, k):
            n_max = corpus_n_max if source is Source.corpus else self.index.n_max
            if (key is not None and votes == total and source is prev_source
                    and n == min(prev_n + 1, n_max)):
                if key.pos < self.STRETCH_MAX:
                    key = key.next
            else:
                key = self.key(n, votes, total, source)
            tokens.append(token)
            if sources is not None:
                sources.append(source)
            if keys is not None:
                keys.append(key)
            prev_n, prev_source = n, source
            yield key

    def _predict_both(self, context: Sequence[int], corpus,
                      final: int | None = None) -> Iterator[Prediction]:
        """NGramIndex.predict over the request's own index and the corpus's: each token from the
        longer match, the request's own unless the corpus's is longer by more than `corpus_margin`
        and the corpus outranks it (Corpus.outranks); with its Source. The corpus's followers are
        voted on by its own rule (Corpus.vote: the most frequent, by default). Where the corpus's
        match is the longer and the two predict different tokens, the dispute is noted (with
        `final`, the end of the context's verified tokens), to be settled once the history shows
        which was right (`_settle`)."""
        own, other, margin = self.index, corpus.index, self.corpus_margin
        seq = "".join(map(chr, context[-max(own.n_max, other.n_max) :]))
        n1, f1 = own.longest(seq, own.first_guess)
        n2, f2 = other.longest(seq, other.first_guess)
        own.first_guess, other.first_guess = n1 or own.first_guess, n2 or other.first_guess
        ahead: list[int] = []  # the tokens predicted so far
        while f1 is not None or f2 is not None:
            theirs = corpus.vote(f2) if f2 is not None else None
            mine = vote(f1) if f1 is not None else None
            if theirs is not None and mine is not None and n2 > n1 + margin:
                if final is not None and theirs[0] != mine[0]:  # their tokens
                    at = len(context) + len(ahead)
                    self._disputes[at] = Dispute(final, [*context[final:], *ahead], mine[0],
                                                 theirs[0])
                if not corpus.outranks():
                    theirs = None
            if theirs is not None and (mine is None or n2 > n1 + margin):
                token, votes, total = theirs
                yield token, n2, votes, total, Source.corpus
            elif mine is not None:
                token, votes, total = mine
                yield token, n1, votes, total, Source.lookup
            else:
                return
            ahead.append(token)
            seq += chr(token)
            n1, f1 = own.longest(seq, n1 + 1)
            n2, f2 = other.longest(seq, n2 + 1)

    def _settle(self, history: Sequence[int], final: int) -> None:
        """Tell the corpus who was right in each dispute the verified history (its first `final`
        tokens) now reaches: the token it holds there, where it holds what was predicted before
        it."""
        for q in [q for q in self._disputes if q < final]:
            d = self._disputes.pop(q)
            actual = history[q]
            if (d.own == actual) != (d.theirs == actual) and list(history[d.start : q]) == d.before:
                self.corpus.judge(d.theirs == actual)

    def lookup_instead(self, history: Sequence[int], last: int,
                       k: int) -> tuple[list[int], list[Evidence]]:
        """Up to k tokens predicted after `history` (indexed already) with its last token taken as
        `last` instead, and their keys."""
        tokens: list[int] = []
        keys = list(self._predicted([*history[:-1], last], k, tokens))
        return tokens, keys

    def lookup(self, history: Sequence[int], k: int,
               final: int | None = None) -> tuple[list[int], list[Evidence]]:
        """Up to k tokens predicted after `history`, and the controller key of each (see
        `_keys`)."""
        offer = LookupOffer(self, history, k, final)
        keys = list(offer)
        return offer.tokens, keys

    def branches(self, history: Sequence[int], chain: Sequence[int],
                 width: int) -> list[Branch]:
        """Beside a draft `chain` after `history`: at each of its depths d, the other followers of
        the longest n-gram ending history + chain[:d] (up to width - 1 of them, the likeliest
        first), each with its share of the followers other than the chain's token, count / (their
        total + 1): the chance that it is the next token where the chain's is not (one unseen
        follower besides). With a corpus, its longest match's followers too, each token at the
        larger of its two shares (ties: the request's own text first)."""
        indices = [(self.index, Source.lookup)]
        if self.corpus is not None and len(self.corpus.index) > 0:
            indices.append((self.corpus.index, Source.corpus))
        out: list[Branch] = []
        seq = "".join(map(chr, history[-max(i.n_max for i, _ in indices) :]))
        for d, token in enumerate(chain):
            for index, source in indices:
                followers = [tc for tc in ranked(index.longest(seq, index.n_max)[1])
                             if tc[0] != token]
                total = sum(c for _, c in followers) + 1
                out += [Branch(d, t, c / total, source) for t, c in followers]
            seq += chr(token)
        return merged(out, width)

    @staticmethod
    def key(n: int, count: int, total: int, source: Source = Source.lookup) -> Evidence:
        """The evidence class of a predicted token: an n-gram match (its length bucketed) that was
        always followed by this token (Agreement.agreed, "lookup:N"), followed by others too but
        mostly by this one (Agreement.mostly, "lookup:N~"), or not mostly (Agreement.contested,
        "lookup:N?"); in the request's own text or in the corpus ("corpus:N"). See Controller.priors
        for how often each is accepted."""
        if count == total:
            agreement = Agreement.agreed
        elif 2 * count > total:
            agreement = Agreement.mostly
        else:
            agreement = Agreement.contested
        return Evidence.lookup(bucket(n), agreement, source=source)

    def start(self, history: Sequence[int], constraint=None) -> None:
        no_grammar(constraint)
        self.index.extend(history)
        self._disputes.clear()  # a new generation: the last one's open disputes are not settled

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> LookupOffer:
        self._offer = LookupOffer(self, history, k_max, final)
        return self._offer

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: Random,
                constraint=None) -> Draft:
        """The first k tokens of the last peek's offer, where it was for this history; else
        predicted afresh. A grammar (`constraint`) cuts them afterwards (drafters/grammar.py):
        predicting them asks nothing of it. A draft that drew on the corpus is the corpus's
        (Source.corpus)."""
        offer, self._offer = self._offer, None
        if offer is None or not offer.is_for(history):
            offer = LookupOffer(self, history, k)
        tokens = offer.take(k)
        if not tokens:
            return EMPTY
        return Draft(tokens, None, Source.corpus if Source.corpus in offer.sources[:k]
                     else Source.lookup)

