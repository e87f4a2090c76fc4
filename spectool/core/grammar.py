"""Grammars: which tokens a constrained generation may take next, from llguidance (the library
llama.cpp itself builds on under LLAMA_LLGUIDANCE): GBNF, Lark or a JSON schema compiled once, a
matcher per generation that follows the accepted tokens, rolls back drafted ones, and names the
tokens the grammar forces.

The constrained target distribution is llama.cpp's `grammar_first`: the mask applied to the row,
then the sampler chain (penalties, top-k, top-p, min-p, temperature) on what is left
(verify.distribution with `banned`). At temperature 0 that is the argmax among the allowed tokens,
the same token llama.cpp's default (sample, and resample with the grammar applied when the token is
invalid) gives.
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

if TYPE_CHECKING:
    from llguidance import LLTokenizer

from spectool.core.verify import Dist, Sampling, dist_at, token_at

# The tokens a grammar allows are those whose bytes it allows, however the text is split into
# tokens, as in llama.cpp's grammar sampler. (By default llguidance allows only the canonical
# tokenization of the bytes a grammar forces: a narrower distribution than llama.cpp's.)
NO_FORCING = '%llguidance {"no_forcing": true}\n'

# llama.cpp's whitespace between JSON tokens (common/json-schema-to-grammar.cpp, SPACE_RULE): none,
# one space, or one or two newlines and an indent of up to 20. Unbounded whitespace lets a small
# model pad forever.
JSON_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"


# The bounds on what reaches the parsers and llguidance, whose Rust code recurses over a grammar and
# overflows its thread's stack (the process dies) on a chain of about 2,500 rules or 1,100 nested
# `$ref`s (8 MB stacks); GBNF's converter (Python) fails at about 350 nested groups.
DEPTH_MAX = 100  # levels of JSON (a schema's, its $refs followed; a request body's), of GBNF groups
RULES_MAX = 1000  # a grammar's rules (GBNF's converter takes about a second for 1,000)
# a grammar's rule, GBNF (`name ::=`) or Lark (`name:`), at the start of its line
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w.-]*[ \t]*(?:::=|:)", re.M)
# what of GBNF's text holds no groups: string literals, character classes, comments
_NO_GROUPS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|#[^\n]*')


class GrammarError(ValueError):
    """A grammar or schema that cannot be used, with the reason in one line."""


def _one_line(message: str) -> str:
    return " ".join(message.split())[:300]


class _Deeper(Exception):
    """Raised inside `deeper` past the limit: no deeper level is looked at."""


def deeper(value: Any, limit: int = DEPTH_MAX, schema: bool = False) -> bool:
    """Whether `value` (parsed JSON) nests lists and objects deeper than `limit` levels. In a JSON
    `schema` each `$ref` to a place in it ("#/$defs/a") is one more level over what it points to, as
    llguidance inlines it (a cycle counted once). Recursion stays within `limit` levels."""
    heights: dict[str, int] = {}  # a $ref's target: its height (0 while it is being measured)

    def height(v: Any, level: int) -> int:
        if level > limit:
            raise _Deeper
        children = list(v.values()) if isinstance(v, dict) else v
        h = 0
        for c in children:
            if isinstance(c, (dict, list)):
                h = max(h, height(c, level + 1))
        ref = v.get("$ref") if schema and isinstance(v, dict) else None
        if isinstance(ref, str) and ref.startswith("#"):
            if ref not in heights:
                heights[ref] = 0
                target = _pointed(value, ref)
                heights[ref] = height(target, level + 1) if isinstance(target, (dict, list)) else 0
            if level + heights[ref] > limit:
                raise _Deeper
            h = max(h, heights[ref])
        return h + 1

    try:
        return isinstance(value, (dict, list)) and height(value, 1) > limit
    except _Deeper:
        return True


def _pointed(root: Any, ref: str) -> Any:
    """What a local JSON pointer ("#/$defs/a") points to in `root`, None where nothing is."""
    node = root
    for part in ref.lstrip("#").split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            node = node[int(key)] if key.isdigit() and int(key) < len(node) else None
        else:
            node = node.get(key) if isinstance(node, dict) else None
    return node


def _loads(text: str, what: str) -> Any:
    """JSON text, parsed (a schema, or one embedded in Lark); too deep or not JSON: a GrammarError
    that says which."""
    try:
        return json.loads(text)
    except RecursionError:
        raise _too_deep(what) from None
    except ValueError as e:
        raise GrammarError(f"{what} is not valid JSON: {e}") from None


def _too_deep(what: str) -> GrammarError:
    return GrammarError(f"{what} is nested deeper than {DEPTH_MAX} levels")


def _bounded(lark: str) -> str:
    """Lark text within the bounds (RULES_MAX rules; each `%json` schema in it, DEPTH_MAX levels):
    else a GrammarError naming the bound."""
    _few_rules(lark)
    for m in re.finditer(r"%json\s*(?=\{)", lark):
        try:
            embedded, _ = json.JSONDecoder().raw_decode(lark, m.end())
        except ValueError:
            continue  # not JSON: llguidance says what is wrong
        except RecursionError:
            raise _too_deep("a %json schema") from None
        _checked_schema(embedded, "a %json schema")
    return lark


def _few_rules(text: str) -> None:
    """GBNF or Lark text of RULES_MAX rules at most, else a GrammarError naming the bound."""
    if len(_RULE.findall(text)) > RULES_MAX:
        raise GrammarError(f"the grammar has more than {RULES_MAX} rules")


def _checked_schema(schema: Any, what: str = "the schema") -> dict:
    """A JSON schema whose own fields llguidance reads without a TypeError (an object; its
    `x-guidance` an object), nested at most DEPTH_MAX levels ($refs followed); else a GrammarError
    that names what is wrong."""
    if not isinstance(schema, dict):
        raise GrammarError(f"{what} must be a JSON object (it is a {_json_type(schema)})")
    if not isinstance(schema.get("x-guidance", {}), dict):
        raise GrammarError(f"{what}'s 'x-guidance' must be a JSON object (it is a "
                           f"{_json_type(schema['x-guidance'])})")
    if deeper(schema, schema=True):  # (each $ref counted where it is used)
        raise _too_deep(what)
    return schema


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


@dataclass(frozen=True)
class Grammar:
    """A grammar compiled for llguidance (`source`, its JSON form), checked without a model; `kind`
    says what the user gave ("gbnf", "lark", "json_schema"), and `schema` the JSON schema where it
    was one (for a grammar that embeds it: a tool-call reply's answer)."""

    source: str
    kind: str
    schema: dict | None = field(default=None, compare=False, hash=False)

    @classmethod
    def _checked(cls, source: str, kind: str) -> Grammar:
        from llguidance import LLMatcher

        error = _library(LLMatcher.validate_grammar, source)
        if error:
            raise GrammarError(_one_line(error))
        return cls(source, kind)

    @classmethod
    def _from_lark(cls, lark: str, kind: str) -> Grammar:
        from llguidance import LLMatcher

        lark = _bounded(lark.replace("%llguidance {}", "", 1))
        return cls._checked(_library(LLMatcher.grammar_from_lark, NO_FORCING + lark), kind)

    @classmethod
    def gbnf(cls, text: str) -> Grammar:
        """llama.cpp's GBNF (its `root` rule starts), as --grammar takes it."""
        from llguidance.gbnf_to_lark import any_to_lark

        _few_rules(text)  # (before the converter's time goes on them)
        groups = re.sub(r"[^()]", "", _NO_GROUPS.sub("", text))
        if max(accumulate(1 if c == "(" else -1 for c in groups), default=0) > DEPTH_MAX:
            raise GrammarError(f"the grammar's groups nest deeper than {DEPTH_MAX} levels")
        try:
            lark = any_to_lark(text)
        except Exception as e:  # the converter raises what its parser raises
            raise GrammarError(_one_line(f"invalid GBNF: {e}")) from None
        return cls._from_lark(lark, "gbnf")

    @classmethod
    def lark(cls, text: str) -> Grammar:
        return cls._from_lark(text, "lark")

    @classmethod
    def json_schema(cls, schema: str | dict) -> Grammar:
        """A JSON schema (its text or the parsed object), read as llama.cpp reads one
        (common/json-schema.cpp): its whitespace between tokens, and an object that lists its
        properties has no others unless `additionalProperties` says so."""
        from llguidance import LLMatcher

        parsed = _loads(schema, "the schema") if isinstance(schema, str) else schema
        closed = _for_llguidance(parsed)  # (a schema that is no object: a GrammarError here)
        # checked on its own first, for the library's own words about what is wrong with it
        cls._checked(_library(LLMatcher.grammar_from_json_schema, closed), "json_schema")
        return replace(cls._from_lark("start: %json " + json.dumps(closed), "json_schema"),
                       schema=parsed)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        return cls.json_schema({"type": "object"})

    def check(self, model) -> None:
        """The grammar against `model`'s vocabulary (the token ids and special tokens it names), as
        `matcher` would find it, in a millisecond: a GrammarError saying what is wrong."""
        from llguidance import LLMatcher

        error = _library(LLMatcher.validate_grammar, self.source, tokenizer_for(model).tokenizer)
        if error:
            raise GrammarError(_one_line(error))

    def matcher(self, model) -> Constraint:
        """A fresh constraint for one generation on `model`'s vocabulary."""
        from llguidance import LLMatcher

        vocabulary = tokenizer_for(model)
        m = _library(LLMatcher, vocabulary.tokenizer, self.source, log_level=0)
        if m.is_error():
            raise GrammarError(_one_line(m.get_error()))
        return Constraint(m, model.n_vocab, vocabulary)


def _library(call, *args, **kwargs):
    """llguidance's `call(*args, **kwargs)`; its ValueError, or its panic (pyo3's PanicException, a
    BaseException: a bug of the library's, such as an error message cut inside a character), a
    GrammarError."""
    try:
        return call(*args, **kwargs)
    except ValueError as e:
        raise GrammarError(_one_line(str(e))) from None
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise GrammarError(_one_line(f"the grammar library failed on it: {e}")) from None


def _closed(schema):
    """The schema with `"additionalProperties": false` on every object that lists properties and
    says nothing about others (llama.cpp's reading; JSON Schema's own default would allow any)."""
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def lark_json(schema: dict) -> str:
    """A JSON schema as a Lark grammar's `%json` item, read as Grammar.json_schema reads it (closed
    objects, llama.cpp's whitespace): for a grammar that wraps JSON in text of its own (a tool
    call's markers)."""
    return "%json " + json.dumps(_for_llguidance(schema))


def _for_llguidance(schema: Any) -> dict:
    """The schema as llguidance is given it (closed objects, llama.cpp's whitespace, no
    `propertyNames` that asks nothing, `oneOf` read as `anyOf` as llama.cpp's json-schema-to-grammar
    reads it: qwen-code's tools carry one), checked first (_checked_schema)."""
    extra = _checked_schema(schema).get("x-guidance", {})
    return {**_closed(_any_keys(schema)),
            "x-guidance": {"coerce_one_of": True, **extra, "whitespace_pattern": JSON_WHITESPACE}}


# the keywords whose object maps names to schemas (the map is no schema), and those that hold data
_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
_DATA = {"enum", "const", "default", "examples"}


def _any_keys(schema):
    """The schema without `propertyNames: {"type": "string"}` wherever it stands: JSON's keys are
    strings, so it asks nothing (Claude Code's tools carry it). llguidance implements no
    `propertyNames`: any other form stays, and is refused there."""
    if isinstance(schema, list):
        return [_any_keys(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: v if k in _DATA else {name: _any_keys(s) for name, s in v.items()}
            if k in _SCHEMA_MAPS and isinstance(v, dict) else _any_keys(v)
            for k, v in schema.items() if not (k == "propertyNames" and v == {"type": "string"})}


_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Vocabulary:
    """llguidance's tokenizer of a model, and the tokens that spell the same bytes as others
    (`members`, each with the index of its group in `group`): llguidance's mask allows one token per
    spelling, llama.cpp's grammar every token whose bytes fit, so the mask is widened to each
    allowed token's twins (a byte-fallback token beside an ordinary one)."""

    tokenizer: LLTokenizer
    members: np.ndarray
    group: np.ndarray
    n_groups: int
    eog: frozenset[int]  # end-of-generation tokens: allowed where the grammar may end
    # a token -> the token that spells the same with a space before it (" x" for "x")
    spaced: dict[int, int]


def tokenizer_for(model) -> Vocabulary:
    """llguidance's tokenizer for a model's vocabulary, built once per model (seconds for 262k
    tokens) and kept while the model lives; its end-of-generation tokens end a completed grammar."""
    vocabulary = _TOKENIZERS.get(model)
    if vocabulary is None:
        import warnings

        from llguidance.llamacpp import lltokenizer_from_vocab

        lib = native.lib()
        vocab = lib.llama_model_get_vocab(model.llama_model)
        eog = [t for t in range(model.n_vocab) if model.is_eog(t)] or [lib.llama_vocab_eos(vocab)]
        # llguidance reads each token's attributes by a deprecated name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            tok = lltokenizer_from_vocab(vocab, n_vocab=model.n_vocab, eos_token=eog)
        spellings: dict[bytes, list[int]] = {}
        for t in range(model.n_vocab):
            spelled = tok.decode_bytes([t])
            if spelled and not tok.is_special_token(t):
                spellings.setdefault(spelled, []).append(t)
        twins = [ids for ids in spellings.values() if len(ids) > 1]
        members = np.array([t for ids in twins for t in ids], np.int64)
        group = np.repeat(np.arange(len(twins)), [len(ids) for ids in twins])
        spaced = {ids[0]: spellings[b" " + s][0] for s, ids in spellings.items()
                  if b" " + s in spellings}
        vocabulary = _TOKENIZERS[model] = Vocabulary(tok, members, group, len(twins),
                                                     frozenset(eog), spaced)
    return vocabulary


class Constraint:
    """One generation's grammar state: the tokens accepted so far, and drafted ones pushed while a
    draft or a verification looks ahead (`push`, `pop`). End-of-generation tokens are counted, not
    given to the matcher (llguidance takes one of them, and none once its grammar is complete): the
    generation ends there anyway."""

    def __init__(self, matcher, n_vocab: int, vocabulary: Vocabulary):
        self.m = matcher
        self.n_vocab = n_vocab
        self.vocabulary = vocabulary
        self.eog = vocabulary.eog
        self._banned: np.ndarray | None = None  # the mask of the current state, until it moves
        # end-of-generation tokens pushed (and not popped) after the matcher's last token
        self._ended = 0

    def allows(self, token: int) -> bool:
        if token in self.eog:
            return self.m.is_accepting()
        return not self._ended and self.m.validate_tokens([token]) == 1

    def valid(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the current state, the grammar accepts in a row (up to an
        end-of-generation token, which counts where the grammar may end)."""
        if not tokens:
            return 0
        end = self._first_end(tokens)
        n = self.m.validate_tokens(list(tokens[:end])) if end and not self._ended else 0
        if n < end or end == len(tokens):
            return n
        return end + self._after(tokens[:end], self.m.is_accepting)

    def _first_end(self, tokens: Sequence[int]) -> int:
        """The index of the first end-of-generation token in `tokens` (their length where there is
        none)."""
        return next((i for i, t in enumerate(tokens) if t in self.eog), len(tokens))

    def _after(self, tokens: Sequence[int], ask):
        """What `ask()` says of the grammar's state after `tokens` (each allowed), the state left as
        it was."""
        self.m.consume_tokens(list(tokens))
        answer = ask()
        self.m.rollback(len(tokens))
        return answer

    def banned(self) -> np.ndarray:
        """A boolean row, true for each token the grammar does not allow next (after an
        end-of-generation token, all but those: the output ends at the first)."""
        if self._banned is None and self._ended:
            self._banned = np.ones(self.n_vocab, bool)
            self._banned[list(self.eog)] = False
        if self._banned is None:
            bits = np.frombuffer(self.m.compute_bitmask(), np.uint8)
            allowed = np.unpackbits(bits, count=self.n_vocab, bitorder="little").view(bool)
            v = self.vocabulary
            if v.n_groups:  # a token is allowed where a twin of it is
                any_allowed = np.zeros(v.n_groups, bool)
                np.logical_or.at(any_allowed, v.group, allowed[v.members])
                allowed[v.members] = any_allowed[v.group]
            self._banned = ~allowed
        return self._banned

    def forced(self) -> list[int]:
        """The bytes the grammar forces from here, as the tokenizer splits them (the model may split
        them otherwise: a draft, not a certainty), up to the first token the grammar would not take,
        and but the last unless the grammar ends there: a model likes to spell the end of forced
        text together with what follows (`":"` and a value's first letters in one token), so that
        token is its choice, not a draft."""
        forced = self.m.compute_ff_bytes() if not self._ended else b""
        if not forced:
            return []
        tokens = self.vocabulary.tokenizer.tokenize_bytes(forced)
        tokens = tokens[: self.m.validate_tokens(tokens)]
        return tokens if tokens and self._after(tokens, self.m.is_stopped) else tokens[:-1]

    def push(self, tokens: Sequence[int]) -> bool:
        """Advance over `tokens` (each allowed); false when one was not (the matcher is then in
        error)."""
        if not tokens:
            return True
        self._banned = None
        end = self._first_end(tokens)
        if end and (self._ended or not self.m.consume_tokens(list(tokens[:end]))):
            return False
        self._ended += len(tokens) - end
        return all(t in self.eog for t in tokens[end:])

    def pop(self, n: int) -> None:
        """Undo the last n tokens pushed."""
        if n:
            self._banned = None
            ended = min(n, self._ended)
            self._ended -= ended
            if n > ended:
                self.m.rollback(n - ended)

    @property
    def complete(self) -> bool:
        """Nothing but end-of-generation can follow (or the matcher failed)."""
        return self.m.is_stopped()


def follow(c: Constraint, tree, held: Sequence[int], i: int) -> list[int]:
    """Move `c` from the state after the draft tree's nodes `held` (a path from the root, the root
    left out) to the state after node i's path, which it returns."""
    path = tree.path(i)[1:]
    n = next((j for j, (a, b) in enumerate(zip(held, path)) if a != b), min(len(held), len(path)))
    c.pop(len(held) - n)
    c.push([tree.tokens[j] for j in path[n:]])
    return path


class NothingAllowed(GrammarError):
    """The grammar admits no token here (a state it cannot leave): the generation ends."""


def mask_for(c: Constraint, to_target: np.ndarray | None = None,
             banned: np.ndarray | None = None) -> np.ndarray:
    """The tokens a model may not take next under `c`, in the model's ids (`to_target`: a draft's id
    -> the target's, see VocabMap), with the ids `banned` besides; NothingAllowed when that is every
    token."""
    mask = c.banned() if to_target is None else c.banned()[to_target]
    if banned is not None:
        mask = mask.copy() if to_target is None else mask
        mask[banned] = True
    if mask.all():
        raise NothingAllowed("the grammar admits no token here")
    return mask


def token_under(model, i: int, s: Sampling, recent: Sequence[int], c: Constraint, to_target=None,
                banned=None) -> int:
    """The chain's token at temperature 0 for output i, among the tokens `c` allows: the row's own
    when the grammar allows it (one cheap check), else the argmax of the masked row."""
    t = token_at(model, i, s, recent, banned)
    if c.allows(t if to_target is None else int(to_target[t])):
        return t
    return token_at(model, i, s, recent, mask_for(c, to_target, banned))


def dist_under(model, i: int, s: Sampling, recent: Sequence[int], c: Constraint, to_target=None,
               banned=None) -> Dist:
    """The chain's distribution for output i on the row with the grammar's mask applied first
    (grammar_first)."""
    return dist_at(model, i, s, recent, mask_for(c, to_target, banned))
