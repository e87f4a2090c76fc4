"""The one place drafting is decided: which models a mode drafts with (`loads`, before they load),
the session's drafter, controller and limits for the options, the loaded models and the serving
shape (`choose`: a Policy), and each generation's drafter built whole around the session's
(`Policy.drafting`, `for_generation`: the grammar, the corpus, a request's prediction, the
fallback; a sequence decoded beside others gets a prompt lookup of its own). The loop takes what
this module builds and decides nothing of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.core.controller import DRAFT_MAX, Controller
from spectool.core.costs import Costs
from spectool.core.evidence import Evidence, Mode, Source
from spectool.core.grammar import Constraint
from spectool.core.protocol import Branch, Draft, Drafter, Estimate
from spectool.core.verify import Random, Sampling
from spectool.drafters.corpus import Corpus
from spectool.drafters.dflash import Dflash, DflashContext
from spectool.drafters.draft_model import DraftModel
from spectool.drafters.eagle3 import Eagle3, Eagle3Context
from spectool.drafters.grammar import GrammarDrafter
from spectool.drafters.hybrid import Hybrid
from spectool.drafters.lookup import PromptLookup
from spectool.drafters.mtp import Mtp, MtpContext
from spectool.drafters.prediction import PredictionDrafter
from spectool.drafters.text import TextDraft
from spectool.llama.engine import EngineError, Model
from spectool.llama.vocab import Facts

KINDS = (Source.lookup, Source.draft, Source.mtp, Source.eagle3, Source.hybrid)  # what build makes


class PolicyError(ValueError):
    """A drafting mode the models or the serving shape cannot have: a usage error (exit code 2)."""

    code = 2


@dataclass(frozen=True)
class Wish:
    """What the user asks of drafting (--spec, --draft-max, --draft-min, --draft-p-min, whether
    --draft-tree drafts trees) and the serving shape: one sequence, or `n_seq` decoded together
    (--parallel)."""

    spec: Mode = Mode.auto
    k_max: int = DRAFT_MAX
    k_min: int = 0
    p_min: float = 0.0
    n_seq: int = 1
    tree: bool = False


def resolve(spec: Mode, draft_model: bool, mtp: bool, eagle3: bool = False,
            dflash: bool = False) -> Mode:
    """What `spec` drafts by, given whether there is a draft model, an MTP head, an EAGLE-3 head
    and a DFlash head (-md HEAD.gguf): auto is hybrid with a draft model, else the head -md names,
    else the MTP head, else prompt lookup; hybrid pairs lookup with the draft model, or without one
    with an MTP or EAGLE-3 head (a DFlash head drafts a block after the target's last position
    only); a mode whose model or head is missing is prompt lookup (drafter_for says whether that
    is a fallback or an error)."""
    if spec is Mode.auto:
        return (Mode.hybrid if draft_model else Mode.eagle3 if eagle3 else
                Mode.dflash if dflash else Mode.mtp if mtp else Mode.lookup)
    missing = {Mode.draft: not draft_model, Mode.mtp: not mtp, Mode.eagle3: not eagle3,
               Mode.dflash: not dflash, Mode.hybrid: not (draft_model or mtp or eagle3)}
    return Mode.lookup if missing.get(spec, False) else spec


# what -md can be beside a model
HEADS = {Mode.eagle3: "an EAGLE-3 head", Mode.dflash: "a DFlash head"}


def loads(w: Wish, draft_model: bool, head: Mode | None = None) -> tuple[bool, bool, bool]:
    """Before anything loads: whether the mode drafts with the draft model (`draft_model`: one is
    named), with the target's MTP heads, if it has them, and with the head -md names (`head`: its
    kind, Mode.eagle3 or Mode.dflash, None: none). Sequences decoded together draft by prompt
    lookup only: another mode is a PolicyError there."""
    if w.n_seq > 1 and w.spec in (Mode.draft, Mode.hybrid, Mode.mtp, Mode.eagle3, Mode.dflash):
        raise PolicyError(f"--parallel above 1 drafts by prompt lookup only, not --spec {w.spec}")
    if head is not None and w.spec in (Mode.draft, *HEADS.keys() - {head}):
        raise PolicyError(f"-md is {HEADS[head]}, not a draft model: --spec {head} drafts with it"
                          if w.spec is Mode.draft else f"-md is {HEADS[head]}: --spec {head} "
                          f"drafts with it, not --spec {w.spec}")
    alone = w.n_seq == 1
    mode = resolve(w.spec, draft_model and alone, mtp=alone, eagle3=head is Mode.eagle3 and alone,
                   dflash=head is Mode.dflash and alone)
    paired = mode is Mode.hybrid and not draft_model
    by_head = mode is head or (paired and head is Mode.eagle3)
    return (mode in (Mode.draft, Mode.hybrid), mode is Mode.mtp or (paired and not by_head),
            by_head)


def drafter_for(spec: Mode, draft_model: Model | None, p_min: float = 0.0,
                notices: list[str] | None = None, ids: np.ndarray | None = None,
                n_target: int = 0, mtp: MtpContext | None = None,
                text_of: Facts | None = None,
                eagle3: Eagle3Context | None = None, dflash: DflashContext | None = None,
                k_max: int = 0, tree: bool = False) -> tuple[Drafter | None, Mode]:
    """(drafter, the Mode it drafts by, see resolve) for a mode (run, chat, serve, bench, the
    tests). `mtp` is the target's MTP head when it has one, `eagle3` the EAGLE-3 head, `dflash`
    the DFlash head (its block's masks: `k_max`, --draft-max, at most its own); `tree`: steps may
    verify trees (a greedy draft model keeps its runner-ups); `text_of` the
    target where the draft
    model's vocabulary is another (it drafts through text). A mode that cannot have what it needs is
    a PolicyError when the user demanded it (draft, mtp), else prompt lookup with a notice."""
    mode = resolve(spec, draft_model is not None, mtp is not None, eagle3 is not None,
                   dflash is not None)
    if mode is Mode.lookup and spec in HEADS:
        raise PolicyError(f"--spec {spec} needs -md HEAD.gguf, {HEADS[spec]} for the target "
                          "(`spectool check TARGET HEAD` says)")
    if mode is Mode.lookup and spec is Mode.mtp:
        raise PolicyError("--spec mtp needs a target with MTP heads (NextN layers; `spectool check "
                          "MODEL` says)")
    if mode is Mode.lookup and spec is Mode.draft:
        raise PolicyError("--spec draft needs a draft model (-md MODEL.gguf)")
    if mode is Mode.lookup and spec is Mode.hybrid and notices is not None:
        notices.append("no draft model: using prompt lookup")
    if mode is Mode.none:
        return None, mode
    if mode is Mode.dflash and dflash is not None:
        return Dflash(dflash, p_min=p_min, n_max=k_max), mode
    return build(Source(mode.value), draft_model, mtp, p_min, ids, n_target, text_of,
                 eagle3, tree), mode


@dataclass
class Policy:
    """What a session drafts with (choose): the mode, its drafter (shared by the session's
    generations), the timed controller that learns this machine's costs, the corpus of earlier
    requests where lookup drafts from one, whether rejected drafts can be dropped (`forced`: a
    grammar's forced tokens and a prediction may be drafted), and the serving shape."""

    mode: Mode
    drafter: Drafter | None
    controller: Controller
    corpus: Corpus | None = None
    forced: bool = True
    n_seq: int = 1

    def drafting(self, grammar: bool, prediction: Sequence[int] | None = None,
                 seeded: bool = False) -> tuple[Drafter | None, Controller]:
        """A generation's drafter, built whole (for_generation), and its controller. Seeded
        sampling gets an untimed controller of its own and no corpus, so that k, and with it the
        use of random numbers, depends only on the tokens: the same seed gives the same text after
        any earlier request and on any machine (controller.py). A sequence decoded beside others
        drafts with a prompt lookup of its own: lookup's index follows one history at a time."""
        ctl, corpus, base = self.controller, self.corpus, self.drafter
        if seeded:
            ctl = Controller(k_max=ctl.k_max, k_min=ctl.k_min, adaptive=ctl.adaptive, timed=False)
            corpus = None
        if self.n_seq > 1 and base is not None:
            base = PromptLookup()
        return for_generation(base, grammar, corpus, self.forced, prediction), ctl


def choose(w: Wish, target: Model, draft_model: Model | None = None,
           ids: np.ndarray | None = None, mtp: MtpContext | None = None,
           costs: Costs | None = None, corpus: Corpus | None = None,
           notices: list[str] | None = None, through_text: bool = False,
           eagle3: Eagle3Context | None = None, dflash: DflashContext | None = None) -> Policy:
    """The session's drafting for what the user asks (`w`) and the loaded models: the drafter
    (drafter_for; plain decoding where the target cannot drop rejected drafts), a controller over
    the measured `costs` between w's limits (adaptive unless they are one length), and the corpus
    where the drafter drafts by prompt lookup; `through_text`: the draft model's vocabulary is not
    the target's; `eagle3`, `dflash`: the head -md HEAD.gguf names. One-line notices for the user
    go to `notices`."""
    notices = notices if notices is not None else []
    if w.spec is Mode.mtp and target.n_nextn and not target.can_rollback:
        raise PolicyError(f"{target.architecture} keeps a recurrent state that cannot drop "
                          "rejected drafts: spectool cannot draft from its MTP heads (llama.cpp "
                          "restores checkpoints instead)")
    drafter, mode = drafter_for(w.spec, draft_model, w.p_min, notices, ids, target.n_vocab, mtp,
                                target if through_text else None, eagle3, dflash, w.k_max, w.tree)
    if not target.can_rollback and drafter is not None:
        notices.append(f"{target.architecture} cannot roll back its cache: plain decoding")
        drafter, mode = None, Mode.none
    controller = Controller(k_max=w.k_max, k_min=w.k_min, adaptive=w.k_min != w.k_max,
                            costs=costs if costs is not None else Costs())
    return Policy(mode, drafter, controller, corpus if lookup_of(drafter) else None,
                  target.can_rollback, w.n_seq)


def build(kind: Source, draft_model: Model | None = None, mtp: MtpContext | None = None,
          p_min: float = 0.0, ids: np.ndarray | None = None, n_target: int = 0,
          text_of: Facts | None = None, eagle3: Eagle3Context | None = None,
          tree: bool = False) -> Drafter:
    """The session's drafter of `kind` (one of KINDS): prompt lookup, the draft model (`ids`: a
    pruned draft's kept target ids, see prune.py; `text_of`: the target, where the draft's
    vocabulary is another and it drafts through text, text.py), the target's MTP head, or a hybrid
    of prompt lookup and the draft model, or, without one, of prompt lookup and a head (the
    EAGLE-3 head `eagle3`, else the MTP head; `tree`: a greedy draft model keeps its runner-ups for
    draft trees). Its parts are shared by the session's generations."""
    if kind is Source.lookup:
        return PromptLookup()
    if kind in (Source.mtp, Source.eagle3) or (kind is Source.hybrid and draft_model is None):
        if kind is not Source.mtp and eagle3 is not None:
            head: Mtp = Eagle3(eagle3, p_min=p_min)
        elif kind is not Source.eagle3 and mtp is not None:
            head = Mtp(mtp, p_min=p_min)
        else:
            raise ValueError(f"a {kind} drafter needs its head or a draft model")
        return head if kind is not Source.hybrid else Hybrid(PromptLookup(), head)
    if kind not in (Source.draft, Source.hybrid) or draft_model is None:
        raise ValueError(f"no drafter of kind {kind} with a draft model {draft_model}")
    dm = (TextDraft(draft_model, text_of) if text_of is not None else
          DraftModel(draft_model, p_min=p_min, ids=ids, n_target=n_target, runner_ups=tree))
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

    def propose(self, history: Sequence[int], k: int, sampling: Sampling, rng: Random,
                constraint: Constraint | None = None) -> Draft:
        assert self.inner is not None, "propose before a peek that offered something"
        try:
            return self.inner.propose(history, k, sampling, rng)
        except EngineError as e:
            return Draft([], None, Source.none, notice=self.fall_back(history, e))

    def branches(self, history: Sequence[int], chain: Sequence[int], width: int) -> list[Branch]:
        """Prompt lookup's (its corpus's too), the request's prediction's beside them, a draft
        model's runner-ups beside its draft, both beside a hybrid's, under the grammar where there
        is one (a head's, a draft through text's: none)."""
        return self.inner.branches(history, chain, width) if self.inner is not None else []

    def finish(self, history: Sequence[int]) -> None:
        if self.corpus is not None:
            self.corpus.add(history)
