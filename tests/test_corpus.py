"""The lookup corpus (drafters/corpus.py): its index against one built afresh from the documents it kept, its bound
over a thousand requests, how it ranks beside the request's own text, its file, and where it is on by default."""

import json
import random
import subprocess
import sys
import tracemalloc

import pytest
from spectool_lab.helpers import SPECTOOL, Server, spectool, tokens_of
from hypothesis import given, settings
from hypothesis import strategies as st

from spectool.core.controller import Controller
from spectool.core.evidence import Source
from spectool.generate.loop import GenerationConfig
from spectool.core.stats import Stats
from spectool.drafters.builder import Drafting
from spectool.drafters.corpus import Corpus, vocab_tag
from spectool.drafters.lookup import NGramIndex, PromptLookup
from spectool.options import Options, UserError, is_loopback, with_corpus_default


def fresh(corpus: Corpus) -> dict:
    """The follower table of an index built from nothing but the documents `corpus` kept."""
    index = NGramIndex(corpus.index.n_min, corpus.index.n_max)
    for doc in corpus.docs:
        index.add(doc)
    return index._follow


docs = st.lists(st.lists(st.integers(0, 6), min_size=0, max_size=30), max_size=25)


@settings(max_examples=200, deadline=None)
@given(docs, st.integers(1, 60), st.booleans())
def test_the_index_is_that_of_the_documents_it_kept(documents, bound, extend):
    """After every document, what the corpus indexes is exactly the n-grams of the documents it kept (counts and
    all: the oldest documents' n-grams were counted out), within its bound. With `extend`, each document is the
    last one grown (a chat's turns), which replaces it."""
    corpus, last = Corpus(bound, 1, 3), []
    for doc in documents:
        doc = last + doc if extend else doc
        corpus.add(doc)
        last = doc
        assert corpus.n_tokens == sum(map(len, corpus.docs)) <= bound
        assert corpus.index._follow == fresh(corpus)
        if doc:
            assert corpus.docs[-1] == doc[-bound:]


def test_memory_stays_within_its_bound_over_a_thousand_requests():
    """A thousand requests through a corpus of 6000 tokens: it never holds more, its n-grams never outnumber what
    its tokens can make, the memory it holds after the thousandth is what it held after the 200th (within a tenth:
    forgetting the oldest documents gives their memory back), and that is under 1.5 kB a token."""
    rng = random.Random(35)
    corpus = Corpus(6000)
    grams = corpus.index.n_max - corpus.index.n_min + 1
    tracemalloc.start()
    try:
        for i in range(1000):
            shape = rng.randrange(20)  # related requests: one of 20 shapes, a few words of its own
            doc = [shape * 50 + j for j in range(40)] + [rng.randrange(2000) for _ in range(rng.randrange(10, 80))]
            corpus.add(doc)
            assert corpus.n_tokens <= 6000 and len(corpus.index) <= grams * corpus.n_tokens
            if i == 199:  # long since full (the first document went at about the 70th)
                settled = tracemalloc.get_traced_memory()[0]
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(corpus.docs) < 100 and corpus.index._follow == fresh(corpus)
    assert held < 1.1 * settled and held < 1500 * 6000, (held, settled)


def corpus_of(*documents, bound=10_000):
    corpus = Corpus(bound)
    for doc in documents:
        corpus.add(doc)
    return corpus


def test_the_requests_own_text_outranks_the_corpus():
    """Where both match as long, the request's own follower wins; where the corpus matches longer, the corpus's
    does, under a key of its own, and the draft is the corpus's."""
    lk = PromptLookup()
    lk.corpus = corpus_of([1, 2, 3, 4, 5, 6, 7, 8])
    tokens, keys = lk.lookup([0, 3, 4, 20, 9, 3, 4], 1)  # own "3 4" -> 20; the corpus's "3 4" -> 5
    assert tokens == [20] and keys[0].source is Source.lookup
    tokens, keys = lk.lookup([9, 2, 3, 4, 20, 7, 1, 2, 3, 4], 4)  # the corpus's "1 2 3 4" is longer than own "2 3 4"
    assert tokens[:2] == [5, 6] and keys[0].source is Source.corpus and str(keys[0]) == "corpus:4"
    assert keys[1] is keys[0].next  # the same stretch
    offer = lk.peek([9, 2, 3, 4, 20, 7, 1, 2, 3, 4], 4)
    assert lk.propose(offer.history, 3, None, None).source is Source.corpus
    lk.corpus = None
    assert lk.lookup([9, 2, 3, 4, 20, 7, 1, 2, 3, 4], 1)[0] == [20]


def test_the_corpus_keeps_its_rank_only_while_it_wins_the_disputes():
    """Where the corpus's longer match and the request's own text predict different tokens, the next step's history
    shows which was right and the corpus is told (Corpus.judge). A corpus that lost more of these disputes than it
    won hands its rank back: the request's own token is drafted though the corpus's match is longer. One that wins
    keeps it; where neither was right nothing is told. A dispute is settled by verified tokens only (not those past
    `final`, a grammar's forced tokens), and only where the history holds what was predicted before it."""
    own = [9, 2, 3, 4, 20, 7, 1, 2, 3, 4]  # own "2 3 4" -> 20; the corpus's longer "1 2 3 4" -> 5

    def step(corpus, actual):  # one step's draft after `own`, then the next step, after the target wrote `actual`
        lk = PromptLookup()
        lk.corpus = corpus
        lk.start(own)
        drafted = lk.peek(own, 1).take(1)
        lk.peek([*own, actual], 1).take(1)
        return drafted

    losing = corpus_of([1, 2, 3, 4, 5, 6, 7, 8])
    assert step(losing, 20) == [5] and losing.won == [0, 1]  # it outranks at first, and the target wrote own's 20
    assert not losing.outranks() and step(losing, 20) == [20]  # own's token now, the dispute still noted and lost
    assert losing.won[1] > 1
    winning = corpus_of([1, 2, 3, 4, 5, 6, 7, 8])
    assert step(winning, 5) == [5] and step(winning, 5) == [5] and winning.won[0] > 1 and winning.outranks()
    neither = corpus_of([1, 2, 3, 4, 5, 6, 7, 8])
    assert step(neither, 99) == [5] and neither.won == [0, 0]

    unverified = corpus_of([1, 2, 3, 4, 5, 6, 7, 8])
    lk = PromptLookup()
    lk.corpus = unverified
    assert lk.lookup(own, 1)[0] == [5]
    lk.lookup([*own, 20], 1, final=len(own))  # 20 drafted (forced), not verified: no verdict
    assert unverified.won == [0, 0]
    lk.lookup([*own, 20], 1)
    assert unverified.won == [0, 1]

    # own "5" -> 30 and "2 3 4" -> 20; the corpus's "1 2 3 4" -> 5 and "1 2 3 4 5" -> 6: two disputes in one draft
    own = [9, 5, 30, 2, 3, 4, 20, 7, 1, 2, 3, 4]
    diverged = corpus_of([1, 2, 3, 4, 5, 6, 7, 8])
    lk = PromptLookup()
    lk.corpus = diverged
    assert lk.lookup(own, 2)[0] == [5, 6]
    lk.lookup([*own, 20, 6], 1)  # 20: own was right; then 6, the corpus's, but after 20, not after the 5 it followed
    assert diverged.won == [0, 1]


def test_the_corpus_drafts_the_most_frequent_continuation():
    lk = PromptLookup()
    lk.corpus = corpus_of([5, 6, 7, 1], [5, 6, 7, 2], [5, 6, 7, 2])
    tokens, keys = lk.lookup([0, 5, 6, 7], 1)
    assert tokens == [2] and str(keys[0]) == "corpus:3~"


PROMPT = "def add(a, b):\n    return a + b\n\ndef greet(name):"


def test_greedy_output_with_the_corpus_is_plain_decodings(target):
    """Greedy output is the target's, token for token, with a corpus that fits (the same prompt answered before)
    and one that misleads (another text's tokens, shuffled): the first drafts from the corpus, and both were
    verified."""
    prompt = target.tokenize(PROMPT)
    plain = tokens_of(GenerationConfig(target, None, max_tokens=80), prompt)
    rng = random.Random(1)
    noise = list(prompt + plain)
    rng.shuffle(noise)
    for corpus in (corpus_of(prompt + plain), corpus_of(noise, noise[::-1])):
        g = GenerationConfig(target, Drafting(PromptLookup(), corpus), max_tokens=80,
                       controller=Controller(k_max=5, timed=False))
        assert tokens_of(g, prompt) == plain
        assert len(corpus.docs[-1]) == len(prompt) + len(plain)  # this generation joined the corpus
    g = GenerationConfig(target, Drafting(PromptLookup(), corpus_of(prompt + plain)), max_tokens=80,
                   controller=Controller(k_max=5, timed=False))
    stats = Stats()
    assert tokens_of(g, prompt, stats) == plain and stats.by_source.get("corpus", 0) > 0


def test_under_a_grammar_the_corpus_drafts_and_counts_as_its_own_source(target):
    """Under a grammar, lookup's turn may come from the corpus: the output is constrained plain decoding's, and the
    drafts that drew on the corpus are counted as `corpus`, not as the request's own lookup."""
    from spectool.core.grammar import Grammar

    grammar = Grammar.gbnf('root ::= "{\\"name\\": \\"" [a-z ]{1,10} "\\", \\"n\\": " [0-9]{1,3} "}"')
    prompt = target.tokenize("Write a record:")
    plain = tokens_of(GenerationConfig(target, None, max_tokens=40, grammar=grammar), prompt)
    g = GenerationConfig(target, Drafting(PromptLookup(), corpus_of(prompt + plain)), max_tokens=40, grammar=grammar,
                   controller=Controller(k_max=5, timed=False))
    stats = Stats()
    assert tokens_of(g, prompt, stats) == plain and stats.by_source.get("corpus", 0) > 0


def test_the_default_follows_the_host_and_the_flags_choose():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.168.1.20", "example.org", ""):
        assert not is_loopback(host), host
    o = Options()
    assert with_corpus_default(o, True).lookup_corpus and not with_corpus_default(o, False).lookup_corpus
    assert not with_corpus_default(Options(lookup_corpus=False), True).lookup_corpus
    assert with_corpus_default(Options(lookup_corpus=True), False).lookup_corpus
    assert with_corpus_default(Options(lookup_cache="c.json"), False).lookup_corpus
    with pytest.raises(UserError, match="--lookup-cache"):
        with_corpus_default(Options(lookup_cache="c.json", lookup_corpus=False), True)


def test_serve_keeps_a_corpus_on_loopback_only_unless_told(tiny):
    """/metrics shows the corpus's size and its disputes' tally where there is one: on 127.0.0.1 it grows with each
    request; on 0.0.0.0 there is none, unless --lookup-corpus asks; --no-lookup-corpus turns it off on loopback."""
    def corpus_tokens(s):
        _, text = s.request("GET", "/metrics")
        return next((float(ln.split()[1]) for ln in text.splitlines()
                     if ln.startswith("spectool_lookup_corpus_tokens ")), None)

    for args, on in (((), True), (("--host", "0.0.0.0"), False), (("--host", "0.0.0.0", "--lookup-corpus"), True),
                     (("--no-lookup-corpus",), False)):
        s = Server(tiny["target"], *args)
        try:
            before = corpus_tokens(s)
            s.client().completions.create(model="m", prompt="The quick brown fox", max_tokens=8)
            after = corpus_tokens(s)
            _, text = s.request("GET", "/metrics")
        finally:
            s.stop()
        assert (before, after is not None and after > 0) == ((0.0, True) if on else (None, False)), args
        gauges = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines()
                  if ln.startswith("spectool_lookup_corpus_")}
        assert set(gauges) == ({"spectool_lookup_corpus_tokens", 'spectool_lookup_corpus_disputes{result="won"}',
                                'spectool_lookup_corpus_disputes{result="lost"}', "spectool_lookup_corpus_outranks"}
                               if on else set()), args
        if on:  # the tally's gauges say what Corpus.outranks says of it
            won, lost = gauges['spectool_lookup_corpus_disputes{result="won"}'], \
                gauges['spectool_lookup_corpus_disputes{result="lost"}']
            assert won >= 0 and lost >= 0 and gauges["spectool_lookup_corpus_outranks"] == float(won >= lost)


SECRETS = {"a": "amber falcon 7731", "b": "cobalt heron 2968"}
PROBE = "Tell me: the vault code is"  # what each secret's request says before it: the corpus drafts the secret after it
SHARED = ["The quick brown fox", "def add(a, b):\n    return a + b\n\ndef greet(name):", "the dog the fox the dog"]


def secret(who: str) -> str:
    return f"Remember this: the vault code is {SECRETS[who]}, {SECRETS[who]}."


def ask(server, prompt: str, chat: bool) -> tuple[str, dict]:
    """A greedy answer to `prompt` from a client of its own (chat or completions): its text and drafts by source."""
    c = server.client()
    if chat:
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}], max_tokens=24,
                                      temperature=0)
        text = r.choices[0].message.content or ""
    else:
        r = c.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0)
        text = r.choices[0].text
    return text, r.usage.model_extra["speculative"]["by_source"]


def clients_session(server) -> dict:
    """Client a tells its secret, then client b asks after it; b tells its own, then a asks. Then four clients at
    once, a and b telling their secrets again, every client asking after them and sending prompts the others send
    too, by chat and by completions in turn. Every answer, keyed (client, what, chat)."""
    from concurrent.futures import ThreadPoolExecutor

    out = {}
    for who, other in (("a", "b"), ("b", "a")):
        out[who, secret(who), False] = ask(server, secret(who), False)
        out[other, "first " + PROBE, False] = ask(server, PROBE, False)
    plans = {"a": [secret("a"), PROBE, *SHARED], "b": [secret("b"), PROBE, *SHARED[::-1]],
             "c": [PROBE, *SHARED, PROBE], "d": [SHARED[1], PROBE, SHARED[2], SHARED[0], PROBE]}

    def client(who):
        return {(who, p, i % 2 == 1): ask(server, p, i % 2 == 1) for i, p in enumerate(plans[who])}

    with ThreadPoolExecutor(4) as ex:
        for answers in ex.map(client, plans):
            out.update(answers)
    return out


def test_the_corpus_changes_no_answer_and_carries_no_clients_text_to_another(tiny):
    """Issue 47 item 4: greedy answers are the same text with the corpus and without it (--no-lookup-corpus), for
    every client, one after another and four at once, and the same for every client that sends the same request.
    Two clients with disjoint secrets: where one asks after the other told its secret, the corpus drafts that secret
    (its match is longer than the request's own), and the target's verification rejects it: neither secret's words
    reach another client's answer."""
    # --draft-min: on the tiny model a batch of 2 costs 4-8x a batch of 1 (its cost table), so whether the
    # controller drafts at all turns on timing noise (a fresh table drafted nothing for b about 1 run in 8)
    forced = ("-t", "1", "--draft-min", "2")
    servers = {"with": Server(tiny["target"], *forced), "without": Server(tiny["target"], *forced,
                                                                          "--no-lookup-corpus")}
    try:
        got = {name: clients_session(s) for name, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()
    assert {k: text for k, (text, _) in got["with"].items()} == {k: text for k, (text, _) in got["without"].items()}
    by_request: dict = {}
    for (who, prompt, chat), (text, _) in got["with"].items():
        by_request.setdefault((prompt.removeprefix("first "), chat), set()).add(text)
    assert all(len(texts) == 1 for texts in by_request.values()), by_request
    assert got["with"]["b", "first " + PROBE, False][1].get("corpus", 0) > 0  # a's secret was drafted for b
    assert not any(by.get("corpus") for _, by in got["without"].values())
    for who in SECRETS:
        words = SECRETS[who].split()
        theirs = [text for (client, _, _), (text, _) in got["with"].items() if client != who]
        assert len(theirs) > 10 and not any(w in text for w in words for text in theirs), (who, theirs)


def test_a_cache_file_is_read_and_written_back_and_a_broken_one_is_one_warning(tiny, tmp_path):
    """`run --lookup-cache FILE`: a first run writes it (the run's prompt and output), a second reads and extends
    it; a broken file, a foreign one and one of another vocabulary are one warning line each, never a crash, and a
    file that is not a lookup cache is left as it was. One of ours that is cut short (anywhere, down to nothing),
    damaged or huge (over 16 MiB: only that much is read) is a fresh start, replaced with this run's document."""
    cache = tmp_path / "lookup.json"
    args = ("run", "-m", tiny["target"], "-c", "1024", "-t", "2", "-n", "12", "-q", "--lookup-cache", cache)
    first = spectool(*args, "the dog the fox the dog")
    assert first.returncode == 0 and "lookup" not in first.stderr, first.stderr
    saved = json.loads(cache.read_text())
    assert saved["format"] == "spectool-lookup-cache" and len(saved["documents"]) == 1
    second = spectool(*args, "a cat and a bird")
    assert second.returncode == 0 and "lookup" not in second.stderr
    assert len(json.loads(cache.read_text())["documents"]) == 2
    plain = spectool("run", "-m", tiny["target"], "-c", "1024", "-t", "2", "-n", "12", "-q", "--spec", "none",
                     "a cat and a bird")
    assert second.stdout == plain.stdout  # greedy: the corpus changes drafts, never the text

    whole = cache.read_bytes()
    huge = json.dumps({**saved, "documents": [[300] * 1000] * 5000}, separators=(",", ":")).encode()
    assert len(huge) > 1 << 24 and huge.startswith(whole[:30])  # 20 MB: over 16 MiB, not read
    for content, kept in ((b'{"format": "spectool-lookup-cache", "version": 1, "vo', False),
                          (whole[: len(whole) // 2], False), (whole[:20], False), (b"", False), (huge, False),
                          (b"\x00\xff not json at all", True), (b'{"some": "other tool"}', True),
                          (json.dumps({**saved, "vocab": "another"}).encode(), False),
                          (json.dumps({**saved, "documents": [[1, "x"]]}).encode(), False)):
        cache.write_bytes(content)
        out = spectool(*args, "the dog the fox")
        lines = out.stderr.splitlines()
        assert out.returncode == 0 and len(lines) == 1 and "--lookup-cache" in lines[0], out.stderr
        assert "Traceback" not in out.stderr and out.stdout
        assert (cache.read_bytes() == content) == kept  # a file of ours is replaced, anyone else's left alone
        if not kept:  # a fresh start: this run's document alone
            assert len(json.loads(cache.read_text())["documents"]) == 1, content[:60]
    bad = spectool(*args, "--no-lookup-corpus", "x")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1


def test_the_cache_round_trips_and_knows_its_vocabulary(tmp_path):
    path = tmp_path / "c.json"
    corpus = corpus_of([1, 2, 3], [4, 5, 6, 7])
    corpus.judge(False)  # the disputes' tally goes with the documents: `run --lookup-cache` learns it across runs
    tag = vocab_tag([b"a", b"b"], 1)
    assert corpus.save(path, tag) is None
    back, warning = Corpus.load(path, tag, 10_000)
    assert warning is None and list(back.docs) == list(corpus.docs) and back.index._follow == corpus.index._follow
    assert back.won == [0, 1] and not back.outranks()
    obj = json.loads(path.read_text())
    for won in (None, [1], ["a", 2], [-1, 0], [float("nan"), 0], [1e300, 0], [True, 0]):  # a bad tally: anew
        path.write_text(json.dumps({**obj, "won": won}))
        back, warning = Corpus.load(path, tag, 10_000)
        assert warning is None and back.won == [0, 0] and list(back.docs) == list(corpus.docs)
    path.write_text(json.dumps(obj))
    assert vocab_tag([b"a", b"c"], 1) != tag and vocab_tag([b"ab"], 1) != vocab_tag([b"a", b"b"], 1)
    small, warning = Corpus.load(path, tag, 5)  # a smaller bound keeps the newest
    assert warning is None and list(small.docs) == [[4, 5, 6, 7]]
    assert Corpus.load(tmp_path / "none.json", tag, 10)[1] is None  # a first run


def run_at_once(*argvs) -> list[subprocess.CompletedProcess]:
    """`spectool ARGV` for each of `argvs`, all started at once, stdin closed; each one's result when all ended."""
    procs = [subprocess.Popen([*SPECTOOL, *map(str, argv)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for argv in argvs]
    outs = [p.communicate(timeout=300) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outs)]


def test_runs_at_once_on_one_cache_file_keep_every_runs_document(tiny, tmp_path, target):
    """Issue 47 item 3: three `spectool run --lookup-cache FILE` at once on a file that holds an earlier run's
    document. Each reads the file when it starts and writes it when it ends, under the file's lock and merged with
    what the file holds by then, so none loses another's document: the file ends with all four, each whole, the
    earlier run's first."""
    cache = tmp_path / "lookup.json"
    args = ("run", "-m", tiny["target"], "-c", "1024", "-t", "1", "-n", "24", "-q", "--lookup-cache", cache)
    prompts = ["the dog the fox the dog", "a cat and a bird", "the river and the stone", "bread salt rain wind"]
    assert spectool(*args, prompts[0]).returncode == 0
    runs = run_at_once(*((*args, p) for p in prompts[1:]))
    assert all(r.returncode == 0 and r.stdout and not r.stderr for r in runs), runs
    docs = json.loads(cache.read_text())["documents"]
    starts = [target.tokenize(p) for p in prompts]
    assert len(docs) == 4 and docs[0][: len(starts[0])] == starts[0]
    for want, r in zip(starts, [None, *runs]):
        (doc,) = [d for d in docs if d[: len(want)] == want]
        assert len(doc) > len(want)  # its output too
        if r is not None:  # the document holds the text the run wrote
            assert target.detokenize(doc[len(want):]).strip() == r.stdout.strip()


# a process that reads the cache file, adds a document of its own and saves, again and again, as many runs would
SAVER = """
import sys
from spectool.drafters.corpus import Corpus
path, me = sys.argv[1], int(sys.argv[2])
for i in range(int(sys.argv[3])):
    corpus, warning = Corpus.load(path, "v", 100_000)
    assert warning is None, warning
    corpus.add([me, i] * 30)
    assert corpus.save(path, "v") is None
"""


def test_processes_saving_at_once_lose_no_document(tmp_path):
    """Four processes, each reading the cache file, adding a document and saving it 25 times over, all at once: each
    save merges under the file's lock, so the file ends with all 100 documents, each process's in its own order."""
    cache = tmp_path / "lookup.json"
    procs = [subprocess.Popen([sys.executable, "-c", SAVER, str(cache), str(me), "25"], stderr=subprocess.PIPE,
                              text=True) for me in range(1000, 1004)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    docs = json.loads(cache.read_text())["documents"]
    assert len(docs) == 100
    for me in range(1000, 1004):
        assert [d for d in docs if d[0] == me] == [[me, i] * 30 for i in range(25)]


def test_chat_drafts_from_the_conversations_before_a_reset(target):
    """chat keeps the corpus across its conversations: the same question after /reset gets the same greedy
    answer, drafted from the first conversation's (the corpus)."""
    from spectool.cli.chat import Chat

    target.reset()
    corpus = Corpus(10_000)
    chat = Chat(GenerationConfig(target, Drafting(PromptLookup(), corpus), max_tokens=40,
                           controller=Controller(k_max=8, timed=False)))
    first = "".join(t for t, _ in chat.send("Tell me about the quick brown fox and the lazy dog."))
    "".join(t for t, _ in chat.send("And then?"))
    chat.reset()
    again = "".join(t for t, _ in chat.send("Tell me about the quick brown fox and the lazy dog."))
    assert again == first and chat.turns[-1].by_source.get("corpus", 0) > 0


def test_a_generations_draft_max_bounds_every_step_and_zero_drafts_nothing(target):
    """GenerationConfig.draft_max (a request's `speculative`) bounds each step's draft even where the controller's
    floor (k_min) asks for more, and 0 drafts nothing, the corpus's and a grammar's forced tokens included; the
    output is plain decoding's."""
    from spectool.core.grammar import Grammar

    prompt = target.tokenize(PROMPT)
    grammar = Grammar.gbnf('root ::= "def " [a-z]{1,8} "(a, b):\\n    return a + b" [a-z \\n]*')
    for gram in (None, grammar):
        plain = tokens_of(GenerationConfig(target, None, max_tokens=60, grammar=gram), prompt)
        for bound in (0, 1):
            g = GenerationConfig(target, Drafting(PromptLookup(), corpus_of(prompt + plain)), max_tokens=60,
                                 grammar=gram, draft_max=bound, controller=Controller(k_max=8, k_min=4, timed=False))
            stats = Stats()
            assert tokens_of(g, prompt, stats) == plain
            assert stats.n_drafted == 0 if bound == 0 else 0 < len(stats.accepted_per_position) <= bound, stats
