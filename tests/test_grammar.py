"""Constrained decoding against llama.cpp's own grammar sampler (the oracle: `llama_sampler_init_grammar` on the
same GBNF, through llama-cpp-python's low-level bindings): the masks state by state, the constrained distribution
row by row, greedy output token for token under every drafter, and sampled output by chi-square (docs/exactness.md).
On a GPU host the same tests run on the GPU's rows (the target's layers go where -ngl auto puts them)."""

import numpy as np
import pytest
from exactness import N_RUNS, SAMPLING, chi2_rejects, exact_joint, sample_joint
from spectool_lab.helpers import first_divergence_is_a_near_tie, tokens_of
from test_verify import SETTINGS, apply_sampler, assert_same, llama_cpp_chain

from spectool.core.controller import Controller
from spectool.core.grammar import Grammar, GrammarError, mask_for
from spectool.drafters.builder import for_generation
from spectool.generate.loop import GenerationConfig, speculative_generate
from spectool.core.stats import Stats
from spectool.core.verify import Sampling, distribution
from spectool.drafters.draft_model import DraftModel
from spectool.drafters.hybrid import Hybrid
from spectool.drafters.lookup import PromptLookup

# lowercase words: the tiny models' vocabulary has tokens of every kind, so the mask cuts every row
WORDS = 'root ::= [a-z]+ (" " [a-z]+)* "."'
# a JSON-like record: literal keys the grammar forces, free values
RECORD = 'root ::= "{\\"name\\": \\"" [a-z ]{1,10} "\\", \\"n\\": " [0-9]{1,3} "}"'


class LlamaGrammar:
    """llama.cpp's grammar sampler over a model's vocabulary, fed the generated tokens."""

    def __init__(self, model, gbnf: str):
        import llama_cpp as L

        self.L, self.n = L, model.n_vocab
        vocab = L.llama_model_get_vocab(model.llama_model)
        self.smpl = L.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        assert self.smpl, "llama.cpp rejected the grammar"

    def accept(self, tokens):
        for t in tokens:
            self.L.llama_sampler_accept(self.smpl, int(t))

    def banned(self) -> np.ndarray:
        ids, z = apply_sampler(self.smpl, np.zeros(self.n, np.float32))
        banned = np.ones(self.n, bool)
        banned[ids[np.isfinite(z)]] = False
        return banned

    def close(self):
        self.L.llama_sampler_free(self.smpl)


def walk(model, gbnf: str, text: str):
    """(ours, llama.cpp's) banned masks at each state along the tokens of `text` (a string the grammar accepts)."""
    tokens = model.tokenize(text, add_special=False)
    c = Grammar.gbnf(gbnf).matcher(model)
    ref = LlamaGrammar(model, gbnf)
    try:
        for i in range(len(tokens) + 1):
            yield tokens[:i], mask_for(c), ref.banned()
            if i < len(tokens):
                assert c.push([tokens[i]])
                ref.accept([tokens[i]])
    finally:
        ref.close()


@pytest.mark.parametrize("gbnf,text", [(WORDS, "the cat sat."), (RECORD, '{"name": "ann lee", "n": 42}')])
def test_masks_match_llama_cpp_state_by_state(target, gbnf, text):
    states = 0
    for prefix, ours, theirs in walk(target, gbnf, text):
        states += 1
        assert ours.sum() < len(ours)
        diff = np.flatnonzero(ours != theirs)
        assert not len(diff), (prefix, [target.piece(int(t)) for t in diff[:8]])
    assert states > 3


@pytest.mark.parametrize("s", SETTINGS[:4] + SETTINGS[7:8], ids=str)
def test_constrained_rows_match_llama_cpps_grammar_then_chain(target, s):
    """Random rows and the tiny target's own rows, masked by our grammar state, through our chain, against
    llama.cpp's chain on the row its grammar sampler masked (grammar first)."""
    rng = np.random.default_rng(7)
    prompt = target.tokenize("the quick brown fox", add_special=True)
    for prefix, ours, theirs in walk(target, WORDS, "the cat sat on the mat."):
        history = prompt + prefix
        target.sync(history)
        for row in (np.array(target.logits(-1)), (rng.standard_normal(target.n_vocab) * 3).astype(np.float32)):
            masked = np.where(theirs, -np.inf, row).astype(np.float32)
            assert_same(distribution(row, s, history, ours), llama_cpp_chain(masked, s, history),
                        row=(masked, s, history))
    target.reset()


def llama_cpp_greedy(model, prompt, gbnf, n):
    """llama.cpp's constrained greedy decoding, one token at a time: the argmax of each row its grammar sampler
    masked, until end-of-generation or n tokens."""
    ref = LlamaGrammar(model, gbnf)
    out = []
    try:
        while len(out) < n:
            model.sync(prompt + out)
            row = np.where(ref.banned(), -np.inf, model.logits(-1))
            t = int(np.argmax(row))
            if model.is_eog(t):
                break
            out.append(t)
            ref.accept([t])
    finally:
        ref.close()
        model.reset()
    return out


def drafters(draft):
    return {"none": lambda: None, "lookup": PromptLookup, "draft": lambda: DraftModel(draft),
            "hybrid": lambda: Hybrid(PromptLookup(), DraftModel(draft))}


@pytest.mark.parametrize("kind", ["none", "lookup", "draft", "hybrid"])
@pytest.mark.parametrize("forced", [False, True])
def test_greedy_constrained_output_is_llama_cpps(target, draft, kind, forced):
    prompt = target.tokenize('{"name": "ann lee", "n": 42} {"name": "bob', add_special=True)
    want = llama_cpp_greedy(target, prompt, RECORD, 40)
    st = Stats()
    drafter = for_generation(drafters(draft)[kind](), grammar=True, forced=forced)
    g = GenerationConfig(target, drafter, Sampling(), max_tokens=40, grammar=Grammar.gbnf(RECORD))
    got = tokens_of(g, prompt, st)
    assert got == want
    assert st.finish_reason == "stop"  # the record closed: the grammar is complete
    if forced:
        assert st.by_source.get("grammar", 0) > 0
    else:
        assert "grammar" not in st.by_source


def test_forced_tokens_are_drafted_and_accepted(target):
    """The record's literal keys are forced: drafted from the grammar alone, with no drafter (a fixed draft
    length takes whatever is offered), and accepted where the model splits them as the tokenizer does (the tiny
    model, nearly random, often splits them otherwise)."""
    prompt = target.tokenize("a record:", add_special=True)
    st = Stats()
    g = GenerationConfig(target, for_generation(None, grammar=True), Sampling(),
                         Controller(k_max=8, k_min=8, adaptive=False), max_tokens=60, grammar=Grammar.gbnf(RECORD))
    tokens = tokens_of(g, prompt, st)
    assert st.by_source["grammar"] >= 4 and st.n_accepted >= 1
    assert set(st.by_source) == {"grammar"} and st.n_drafted == st.by_source["grammar"]
    assert st.n_steps < len(tokens)


def offered(target, prompt: str, output: str, gbnf: str, k: int = 24):
    """The draft GrammarDrafter(PromptLookup) offers after `prompt` + `output` (the grammar advanced over `output`):
    its text and the Draft."""
    from spectool.drafters.grammar import GrammarDrafter

    out = target.tokenize(output, add_special=False)
    history = target.tokenize(prompt, add_special=True) + out
    c = Grammar.gbnf(gbnf).matcher(target)
    assert c.push(out)
    lookup = PromptLookup()
    lookup.start(history)
    drafter = GrammarDrafter(lookup, c)
    keys = list(drafter.peek(history, k))
    d = drafter.propose(history, len(keys), Sampling(), np.random.default_rng(0))
    assert c.valid(d.tokens) == len(d.tokens)  # every token of it fits the grammar, which is back where it was
    return target.detokenize(d.tokens), d


def test_lookup_goes_on_after_the_forced_text_that_follows_its_cut(target):
    """Lookup copies a record whose second key the grammar does not have: its draft is cut there, the grammar's
    forced key follows in the same draft, and lookup goes on after it (the value of that key, copied)."""
    text, d = offered(target, '{"name": "ann lee", "x": 42} {"name": "bob lee", "n": 42} ', '{"name": "ann',
                      RECORD)
    assert text.startswith(' lee", "n')  # lookup up to its cut at "x", then the forced "n"
    assert d.forced > 0 and d.source.value == "lookup"
    assert text == ' lee", "n": 42}'  # and lookup again after it, copying the second record to its end


def test_a_value_copied_without_its_leading_space_is_looked_up_with_it(target):
    """A JSON string starts right after its quote, so a word copied into it lacks the space that preceded it in the
    text: lookup matches it as the spaced word and drafts what followed it there. (The tiny vocabulary has both
    "The" and " The"; the text has only the spaced one.)"""
    title = 'root ::= "{\\"title\\": \\"" [A-Za-z ]{1,40} "\\"}"'
    text, _ = offered(target, "a lazy dog. The dog sleeps in the sun\n", '{"title": "The', title)
    assert text.startswith(" dog sleeps in the sun")


def llama_cpp_banned(model, gbnf):
    """prefix -> the tokens llama.cpp's grammar sampler bans after it (for exactness.exact_joint)."""
    def banned(prefix):
        ref = LlamaGrammar(model, gbnf)
        try:
            ref.accept(prefix)
            return ref.banned()
        finally:
            ref.close()

    return banned


@pytest.mark.parametrize("kind", ["lookup", "draft", "hybrid"])
def test_sampled_constrained_output_follows_the_constrained_target(target, draft, kind):
    """k = 3 drafts a step; the first three tokens' joint distribution against the exact one."""
    prompt = target.tokenize("the cat sat on the mat. the cat", add_special=True)
    counts = sample_joint(target, drafters(draft)[kind], prompt, grammar=Grammar.gbnf(WORDS))
    joint = exact_joint(target, prompt, SAMPLING, banned=llama_cpp_banned(target, WORDS))
    rejects, stat, crit = chi2_rejects(counts, joint, N_RUNS)
    assert not rejects, (stat, crit)


def test_the_chi_square_catches_a_mask_dropped_after_the_first_row(target, draft, monkeypatch):
    """Negative control: verification that masks only a step's first row (drafts past it are judged by the
    unconstrained target) must fail the same test."""
    import spectool.generate.loop as spec
    from spectool.core.grammar import dist_under
    from spectool.core.verify import dist_at

    monkeypatch.setattr(spec, "dist_under", lambda m, i, s, recent, c: dist_under(m, i, s, recent, c) if i == 0
                        else dist_at(m, i, s, recent))
    prompt = target.tokenize("the cat sat on the mat. the cat", add_special=True)
    counts = sample_joint(target, lambda: DraftModel(draft), prompt, n=1500, grammar=Grammar.gbnf(WORDS))
    joint = exact_joint(target, prompt, SAMPLING, banned=llama_cpp_banned(target, WORDS))
    rejects, _, _ = chi2_rejects(counts, joint, 1500)
    assert rejects


def test_a_bad_grammar_or_schema_is_one_line_before_any_model():
    for make, bad in ((Grammar.gbnf, 'root ::= "yes" | ('), (Grammar.json_schema, '{"type": "bogus"}'),
                      (Grammar.json_schema, "{not json"), (Grammar.json_schema, "[1, 2]"),
                      (Grammar.gbnf, "root ::= undefined-rule")):
        with pytest.raises(GrammarError) as e:
            make(bad)
        assert "\n" not in str(e.value) and str(e.value)


def test_property_names_that_are_strings_ask_nothing_and_any_other_form_is_refused():
    """`propertyNames: {"type": "string"}` (Claude Code's tools carry it) is dropped before llguidance, which has no
    such keyword, wherever it stands; a property of that name stays; another form is refused, by name."""
    strings = {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "integer"}}
    schema = {"type": "object", "properties": {"propertyNames": {"type": "string"}, "tags": strings},
              "required": ["propertyNames"]}
    source = Grammar.json_schema(schema).source
    assert '"properties": {"propertyNames": {"type": "string"}' in source  # the property, kept
    assert source.count("propertyNames") == 2  # (its name in `properties` and in `required`)
    with pytest.raises(GrammarError, match="propertyNames"):
        Grammar.json_schema({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}})


def test_one_of_is_read_as_any_of_as_llama_cpp_reads_it(target):
    """qwen-code's agent tool carries a `oneOf` (llguidance refuses it unless told to read it as `anyOf`, which
    llama.cpp's json-schema-to-grammar does): each branch's values are taken, others refused."""
    schema = {"type": "object", "properties": {"turns": {"oneOf": [
        {"type": "string", "enum": ["all"]}, {"type": "string", "pattern": "^[1-9][0-9]*$"}]}}, "required": ["turns"]}
    grammar = Grammar.json_schema(schema)
    for text, ok in (('{"turns": "all"}', True), ('{"turns": "12"}', True), ('{"turns": "x1"}', False)):
        tokens = target.tokenize(text, add_special=False)
        assert (grammar.matcher(target).valid(tokens) == len(tokens)) == ok, text


def test_a_grammar_stopped_by_the_budget_ends_with_length(target):
    prompt = target.tokenize("a record:", add_special=True)
    st = Stats()
    g = GenerationConfig(target, for_generation(PromptLookup(), grammar=True), Sampling(), max_tokens=5,
                         grammar=Grammar.gbnf(RECORD))
    steps = list(speculative_generate(g, prompt, st))
    assert st.finish_reason == "length" and st.n_generated == 5 and steps[-1].finish_reason == "length"


# a person record in GBNF, in llama.cpp's own JSON whitespace (common/json-schema-to-grammar.cpp's `space`)
PERSON = r'''root ::= "{" space "\"name\"" space ":" space string "," space "\"age\"" space ":" space [0-9]{1,3} space "}"
string ::= "\"" [^"\\\n]{0,40} "\""
space ::= | " " | "\n"{1,2} [ \t]{0,20}'''
NOT_TEXT = {b"\x00", *(bytes([b]) for b in range(0xF5, 0x100))}
PERSON_PROMPT = ("<start_of_turn>user\nAs JSON with name and age: Alice Johnson is a 34-year-old engineer from "
                 "Portland.<end_of_turn>\n<start_of_turn>model\n")


@pytest.mark.realmodel
def test_gemma_masks_and_greedy_output_match_llama_cpp(gemma_f16):
    """On Gemma's 262k-token vocabulary: the masks along a JSON text, and constrained greedy output under lookup
    with forced drafts, against llama.cpp's grammar sampler, up to a near-tie where batched and single-token
    kernels round apart (F16: logits within 0.05, docs/exactness.md; Q4_K_M's batch rows stray by up to 1.0, and
    on an AVX2-only machine its output parted from llama.cpp's at a gap that wide)."""
    from spectool.llama.engine import Model

    from spectool.core.grammar import tokenizer_for

    with Model(gemma_f16, n_ctx=512, n_threads=2) as m:
        vocabulary = tokenizer_for(m)
        tok = vocabulary.tokenizer
        special = np.array([tok.is_special_token(t) and t not in vocabulary.eog for t in range(m.n_vocab)])
        assert special.sum() > 6000  # <start_of_turn>, <unused0>... : what a text never means
        # and the byte tokens of NUL and of the bytes no UTF-8 text holds (0xF5-0xFF, RFC 3629), which each
        # library reads its own way
        never = np.array([tok.decode_bytes([t]) in NOT_TEXT for t in range(m.n_vocab)])
        for prefix, ours, theirs in walk(m, PERSON, '{\n  "name": "Ann Lee",\n  "age": 42\n}'):
            # llama.cpp's sampler allows a special token wherever its printed name fits (inside a JSON string):
            # llguidance never, unless the grammar names it (docs/exactness.md). Every other token agrees.
            assert ours[special].all()
            diff = np.flatnonzero((ours != theirs) & ~special & ~never)
            assert not len(diff), (prefix, [m.piece(int(t)) for t in diff[:8]])
        prompt = m.tokenize(PERSON_PROMPT, add_special=True, parse_special=True)
        want = llama_cpp_greedy(m, prompt, PERSON, 60)
        st = Stats()
        # a fixed draft length: an adaptive one, timed on a busy machine, may find no draft worth its batch
        fixed = Controller(k_max=4, k_min=4, adaptive=False)
        lookup = for_generation(PromptLookup(), grammar=True)
        got = tokens_of(GenerationConfig(m, lookup, Sampling(), fixed, max_tokens=60, grammar=Grammar.gbnf(PERSON)),
                        prompt, st)
        if first_divergence_is_a_near_tie(m, prompt, want, got, max_gap=0.05):
            assert st.finish_reason == "stop"
        assert st.by_source.get("grammar", 0) > 0


def test_after_an_end_of_generation_token_only_another_may_follow(target):
    """A draft may end with an end-of-generation token where the grammar may end but need not (lowercase text, here
    after "the cat"): the row after it, read where the target accepts it, is masked to end-of-generation tokens alone
    (the output ends at the first), so the target's token there is one, never a letter the grammar took before the
    end and now refuses (which ended the step as if the grammar admitted nothing, its accepted tokens lost)."""
    c = Grammar.gbnf('root ::= [a-z ]+').matcher(target)
    assert c.push(target.tokenize("the cat", add_special=False))
    eog = sorted(c.eog)
    before = mask_for(c)
    assert not before[eog].any() and (~before).sum() > len(eog)  # letters or the end
    assert c.push(eog[:1])
    after = mask_for(c)
    assert set(np.flatnonzero(~after)) == set(eog)
    assert not c.push(target.tokenize(" a", add_special=False)) and c.push(eog[:1])
    c.pop(2)
    assert (mask_for(c) == before).all()
