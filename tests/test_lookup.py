"""Prompt lookup: its n-gram index against a brute-force search (property tests), its keys, and its offers."""

from itertools import islice

from hypothesis import given, settings
from hypothesis import strategies as st

from spectool.core.evidence import Source
from spectool.drafters.lookup import NGramIndex, PromptLookup


def brute_force(history, k, n_min, n_max):
    seq, out = list(history), []
    for _ in range(k):
        best = None
        for n in range(min(n_max, len(seq)), n_min - 1, -1):
            suffix = seq[-n:]
            followers = {}
            for j in range(n, len(history)):  # j: position of a follower of history[j-n:j]
                if history[j - n : j] == suffix:
                    c = followers.get(history[j], (0, -1))
                    followers[history[j]] = (c[0] + 1, j)
            if followers:
                best = max(followers.items(), key=lambda kv: kv[1])[0]
                break
        if best is None:
            break
        out.append(best)
        seq.append(best)
    return out


streams = st.lists(st.integers(0, 5), min_size=1, max_size=80)


@settings(max_examples=300, deadline=None)
@given(streams, st.integers(1, 8), st.integers(1, 3), st.integers(0, 3))
def test_index_equals_brute_force(history, k, n_min, extra):
    n_max = n_min + extra
    lk = PromptLookup(n_min, n_max)
    assert lk.lookup(history, k)[0] == brute_force(history, k, n_min, n_max)


@settings(max_examples=100, deadline=None)
@given(streams, st.lists(st.lists(st.integers(0, 5), max_size=6), max_size=6), st.integers(1, 6))
def test_incremental_index_equals_a_fresh_one(start, growths, k):
    lk = PromptLookup(1, 3)
    history = list(start)
    lk.lookup(history, k)
    for g in growths:
        history += g
        assert lk.lookup(history, k) == PromptLookup(1, 3).lookup(history, k)
    # a history that is not an extension (a chat /reset) rebuilds the index
    other = [9, 9, 8, 9, 9]
    assert lk.lookup(other, k) == PromptLookup(1, 3).lookup(other, k)


@settings(max_examples=200, deadline=None)
@given(streams, st.lists(st.integers(0, 5), min_size=1, max_size=14), st.lists(st.integers(0, 5), max_size=14))
def test_the_longest_match_is_found_whatever_came_before(history, seq, before):
    """The index searches up or down from a guess (the last prediction's first match): whatever was predicted
    before, the first prediction after `seq` rests on the longest n-gram ending `seq` that the history holds with
    a follower (brute force)."""
    index = NGramIndex(1, 12)
    index.extend(history)
    longest = max((n for n in range(1, min(12, len(seq)) + 1)
                   if any(history[j - n : j] == seq[-n:] for j in range(n, len(history)))), default=None)
    list(islice(index.predict(before), 5))  # a guess left by another prediction (predictions go on and on)
    found = next(index.predict(seq), None)
    assert (found[1] if found else None) == longest, (found, longest)


def test_prefers_the_most_frequent_follower():
    # after "1" came 2 twice and 3 once (most recently): the count wins
    assert PromptLookup(1, 1).lookup([1, 2, 1, 2, 1, 3, 1], 1)[0] == [2]


def test_a_tie_goes_to_the_follower_seen_last():
    # after "1" came 2, 3, 3, then 2 again: two each, and 2 most recently (first seen first, last seen last)
    assert PromptLookup(1, 1).lookup([1, 2, 1, 3, 1, 3, 1, 2, 1], 1)[0] == [2]
    assert PromptLookup(1, 1).lookup([1, 2, 1, 3, 1, 2, 1, 3, 1], 1)[0] == [3]


def test_longest_match_wins_and_reports_its_size():
    tokens, keys = PromptLookup(1, 3).lookup([7, 8, 9, 1, 1, 8, 5, 7, 8], 2)
    assert tokens == [9, 1] and list(map(str, keys)) == ["lookup:2", "lookup:2+1"]  # "7 8" -> 9, then "7 8 9" -> 1


def test_each_token_carries_its_own_evidence():
    # "8" was followed by 9 and by 5, but "7 8" only by 9: a unanimous 2-gram
    assert list(map(str, PromptLookup(1, 3).peek([7, 8, 9, 1, 1, 8, 5, 7, 8], 2))) == ["lookup:2", "lookup:2+1"]
    # "1" was followed by 2 and by 3: a contested 1-gram (2 of 3 times: mostly; 1 of 2: not mostly)
    assert list(map(str, PromptLookup(1, 3).peek([1, 2, 1, 3, 1, 2, 4, 1], 1))) == ["lookup:1~"]
    assert list(map(str, PromptLookup(1, 3).peek([1, 2, 1, 3, 4, 1], 1))) == ["lookup:1?"]
    assert list(map(str, PromptLookup(1, 1).peek([5, 6, 7], 4))) == []


def test_a_stretch_ends_where_its_evidence_does():
    """A copied stretch goes on under continuation keys while the same match grows by one token. A token where the
    history went two ways gets its own, weak key and starts a new stretch; so does one whose match is shorter
    (here: the copy ran into the end of the history)."""
    history = [1, 2, 3, 4, 5, 9] + [1, 2, 3, 4, 6, 9, 8] + [1, 2]  # "1 2 3 4" went on to 5, then to 6
    tokens, keys = PromptLookup(1, 12).lookup(history, 8)
    assert tokens == [3, 4, 6, 9, 8, 1, 2, 3]
    assert list(map(str, keys)) == ["lookup:2", "lookup:2+1", "lookup:4?", "lookup:4?+1", "lookup:4?+2", "lookup:4?+3",
                                    "lookup:4?+4", "lookup:2"]


@settings(max_examples=100, deadline=None)
@given(streams, st.integers(1, 8), st.integers(0, 10), st.integers(0, 10))
def test_a_proposal_is_the_first_k_of_the_offer_however_far_it_was_drawn(history, k_max, drawn, k):
    """propose(k) after a peek drafts the first k tokens predicted (as many as there are), whether the
    controller drew fewer keys from the lazy offer than k, exactly k, or more."""
    whole = PromptLookup().lookup(history, k_max)[0]
    lookup = PromptLookup()
    lookup.start(history)
    offer = lookup.peek(history, k_max)
    keys = [key for key, _ in zip(offer, range(drawn))]
    assert len(keys) == min(drawn, len(whole))
    k = min(k, k_max)
    assert lookup.propose(history, k, None, None).tokens == whole[:k]


def test_an_offer_is_drawn_from_lazily():
    """Peeking predicts nothing; each key drawn predicts one token more."""
    history = [1, 2, 3, 4, 5, 6, 7, 8] * 3
    offer = PromptLookup().peek(history, 16)
    assert offer.tokens == []
    first = next(iter(offer))
    assert str(first) == "lookup:8" and offer.tokens == [1]
    assert offer.take(3) == [1, 2, 3] and offer.take(2) == [1, 2]


def test_a_proposal_for_another_history_predicts_afresh():
    lookup = PromptLookup()
    peeked = [1, 2, 3, 1, 2]
    list(lookup.peek(peeked, 4))
    other = [5, 6, 7, 5]
    assert lookup.propose(other, 2, None, None).tokens == PromptLookup().lookup(other, 2)[0] == [6, 7]


def brute_followers(history, seq, n_min, n_max, docs=None):
    """{follower: (count, last position)} of the longest n-gram ending `seq` seen in `history` ({} where none), or in
    any of the documents `docs` (n-grams never span two; positions ordered document by document)."""
    docs = [history] if docs is None else docs
    for n in range(min(n_max, len(seq)), n_min - 1, -1):
        followers = {}
        for i, doc in enumerate(docs):
            for j in range(n, len(doc)):
                if doc[j - n : j] == seq[-n:]:
                    c = followers.get(doc[j], (0, -1))
                    followers[doc[j]] = (c[0] + 1, (i, j))
        if followers:
            return followers
    return {}


def brute_branches(history, chain, width, docs):
    """What PromptLookup.branches should offer beside `chain` (brute force): each depth's other followers in the
    history (and in the corpus's `docs`), the likeliest first, each at its larger share, with where it comes from (ties:
    the request's own text)."""
    want = []
    for d, token in enumerate(chain):
        shares = {}
        for where, source in [(None, Source.lookup)] + ([(docs, Source.corpus)] if docs else []):
            others = {t: c for t, c in brute_followers(history, history + chain[:d], 1, 3, where).items() if t != token}
            total = sum(c for c, _ in others.values()) + 1
            for t in sorted(others, key=lambda t: (-others[t][0], -others[t][1][0], -others[t][1][1])):
                if others[t][0] / total > shares.get(t, (0.0,))[0]:
                    shares[t] = (others[t][0] / total, source)
        want += [(d, t, *ss) for t, ss in sorted(shares.items(), key=lambda ts: -ts[1][0])[: width - 1]]
    return want


@settings(max_examples=300, deadline=None)
@given(streams, st.integers(1, 6), st.integers(1, 4))
def test_branches_are_the_other_followers_of_each_depth_s_match(history, k, width):
    """PromptLookup.branches beside its own draft: at each depth the other followers of the longest n-gram ending
    the history and the draft so far, the most frequent first (ties: the last seen), at most width - 1, each
    with its count over the others' total + 1 (brute force over the history)."""
    lk = PromptLookup(1, 3)
    chain = lk.lookup(history, k)[0]
    assert [tuple(b) for b in lk.branches(history, chain, width)] == brute_branches(history, chain, width, None)


@settings(max_examples=300, deadline=None)
@given(streams, st.lists(streams, min_size=1, max_size=3), st.integers(1, 6), st.integers(1, 4))
def test_branches_beside_a_corpus_are_both_indexes_followers(history, docs, k, width):
    """With a corpus of earlier documents: each depth's other followers of the longest match in the request's own
    text and of the longest in the corpus, each token at the larger of its shares, the likeliest first (ties: the
    request's own first), at most width - 1 (brute force over the history and the documents)."""
    from spectool.drafters.corpus import Corpus

    lk = PromptLookup(1, 3, corpus=Corpus(10_000, 1, 3))
    for doc in docs:
        lk.corpus.add(doc)
    chain = lk.lookup(history, k)[0]
    kept = list(lk.corpus.docs)  # (a document that extends the last one replaces it)
    assert [tuple(b) for b in lk.branches(history, chain, width)] == brute_branches(history, chain, width, kept)
