"""The one place drafters are made and combined: the session's drafter for a mode (`build`), and
each generation's drafter built whole around it (`for_generation`: the grammar, the corpus, a
request's prediction, the fallback). The loop takes what this module builds and decides nothing of
it."""

from __future__ import annotations

from typing import Iterable, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.evidence import Evidence, Source
from spectool.core.grammar import Constraint
from spectool.core.protocol import Draft, Drafter, Estimate
from spectool.core.verify import Sampling
from spectool.drafters.corpus import Corpus
from spectool.drafters.draft_model import DraftModel
from spectool.drafters.grammar import GrammarDrafter
from spectool.drafters.hybrid import Hybrid
from spectool.drafters.lookup import PromptLookup
from spectool.drafters.mtp import Mtp, MtpContext
from spectool.drafters.prediction import PredictionDrafter
from spectool.llama.engine import EngineError, Model

KINDS = (Source.lookup, Source.draft, Source.mtp, Source.hybrid)  # what `build` makes


def build(kind: Source, draft_model: Model | None = None, mtp: MtpContext | None = None,
          p_min: float = 0.0,
          ids: np.ndarray | None = None, n_target: int = 0) -> Drafter:
    """The session's drafter of `kind` (one of KINDS): prompt lookup, the draft model (`ids`: a
    pruned draft's kept target ids, see prune.py), the target's MTP head, or a hybrid of prompt
    lookup and the draft model, or, without one, of prompt lookup and the MTP head. Its parts are
    shared by the session's generations."""
    if kind is Source.lookup:
        return PromptLookup()
    if kind is Source.mtp or (kind is Source.hybrid and draft_model is None):
        if mtp is None:
            raise ValueError(f"a {kind} drafter needs the target's MTP head or a draft model")
        head = Mtp(mtp, p_min=p_min)
        return head if kind is Source.mtp else Hybrid(PromptLookup(), head)
    if kind not in (Source.draft, Source.hybrid) or draft_model is None:
        raise ValueError(f"no drafter of kind {kind} with a draft model {draft_model}")
    dm = DraftModel(draft_model, p_min=p_min, ids=ids, n_target=n_target)
    return dm if kind is Source.draft else Hybrid(PromptLookup(), dm)


def lookup_of(drafter: Drafter | None) -> PromptLookup | None:
    """The prompt lookup a drafter that `build` made drafts with: itself, or a hybrid's."""
    if isinstance(drafter, PromptLookup):
        return drafter
    return drafter.lookup if isinstance(drafter, Hybrid) else None


def for_generation(base: Drafter | None, grammar: bool, corpus: Corpus | None = None,
                   forced: bool = True,
                   prediction: Sequence[int] | None = None) -> Drafter | None:
    """A generation's drafter around the session's `base` (see Drafting), None where it drafts
    nothing: no drafter, no grammar whose forced tokens it could draft and no prediction (`forced`:
    those two may draft where rejected drafts can be dropped)."""
    prediction = prediction if prediction and forced else None
    if base is None and not (grammar and forced) and prediction is None:
        return None
    return Drafting(base, corpus, forced, prediction)


def for_sequence(drafter: Drafter | None) -> Drafter | None:
    """A generation's drafter (for_generation's) given a prompt lookup of its own in place of the
    session's, for a sequence decoded beside others (generate/batch.py): lookup's index follows one
    history at a time. A draft model or an MTP head, one context for all, cannot: a ValueError."""
    if not isinstance(drafter, Drafting) or drafter.base is None:
        return drafter
    if not isinstance(drafter.base, PromptLookup):
        raise ValueError("only prompt lookup drafts for sequences decoded together")
    drafter.base = PromptLookup()
    return drafter


class Drafting(Drafter):
    """One generation's drafter, built whole for it: the session's `base` drafter (shared by its
    generations: a draft model's cache, lookup's index), under the generation's grammar where it has
    one (GrammarDrafter, which drafts the tokens the grammar forces too where `forced`), its prompt
    lookup drafting from `corpus` as well where there is one (the generation's text joins the corpus
    when it ends), the request's `prediction` (tokens) ahead of the base where it gives one
    (PredictionDrafter), and prompt lookup instead of the base, under the same grammar, where a
    draft model fails: a notice says so, and the output stays the target's."""

    def __init__(self, base: Drafter | None, corpus: Corpus | None = None, forced: bool = True,
                 prediction: Sequence[int] | None = None):
        self.base = base
        self.corpus = corpus
        self.forced = forced
        self.prediction = prediction
        # this generation's, drafting its prediction
        self.predictor: PredictionDrafter | None = None
        # what drafts now: the base under the grammar, or the fallback
        self.inner: Drafter | None = None
        self.constraint: Constraint | None = None

    def start(self, history: Sequence[int], constraint: Constraint | None = None) -> str | None:
        lookup = lookup_of(self.base)
        if lookup is not None:
            lookup.corpus = self.corpus
        self.constraint = constraint
        self.inner = self.under_grammar(self.predicted(self.base))
        try:
            if self.inner is not None:
                self.inner.start(history)
        except EngineError as e:
            return self.fall_back(history, e)
        return None

    def predicted(self, drafter: Drafter | None) -> Drafter | None:
        """`drafter` behind the request's prediction, where it gives one."""
        if self.prediction is None:
            return drafter
        self.predictor = PredictionDrafter(self.prediction, drafter)
        return self.predictor

    def under_grammar(self, drafter: Drafter | None) -> Drafter | None:
        if self.constraint is None or (drafter is None and not self.forced):
            return drafter
        return GrammarDrafter(drafter, self.constraint, self.forced)

    def fall_back(self, history: Sequence[int], error: Exception) -> str:
        """Prompt lookup in place of a draft model that failed, behind the prediction (which keeps
        its place) and under the grammar where there are those."""
        lookup = PromptLookup()
        lookup.start(history)
        if self.predictor is not None:
            self.predictor.fallback = lookup
        self.inner = self.under_grammar(self.predictor or lookup)
        return f"draft model failed ({error}); continuing with prompt lookup"

    def peek(self, history: Sequence[int], k_max: int, estimate: Estimate | None = None,
             final: int | None = None) -> Iterable[Evidence]:
        if self.inner is None:
            return []
        return self.inner.peek(history, k_max, estimate, final)

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator,
                constraint: Constraint | None = None) -> Draft:
        assert self.inner is not None, "propose before a peek that offered something"
        try:
            return self.inner.propose(history, k, sampling, rng)
        except EngineError as e:
            return Draft([], None, Source.none, notice=self.fall_back(history, e))

    def finish(self, history: Sequence[int]) -> None:
        if self.corpus is not None:
            self.corpus.add(history)
