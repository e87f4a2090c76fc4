"""The session layer: typed options -> plan -> resolve -> download -> load -> vocabulary check ->
pruned draft -> costs -> the drafting policy (drafters/builder.py decides it) -> GenerationConfig,
with the cost table kept between runs. `run`, `chat` and `serve` start here.

Nothing here talks to the user directly: what needs the user comes in as `Hooks` (the download
confirmation, a progress bar, a one-line message), so a command line and a server can both build on
it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import (TYPE_CHECKING, Callable, ContextManager, Generator, Iterator, NamedTuple,
                    Sequence)

# the session layer's vocabulary, re-exported
from spectool.options import DRAFT_MAX, Mode, Options, UserError  # noqa: F401

if TYPE_CHECKING:  # importing them would load llama.cpp before it is needed
    import numpy as np

    from spectool.core.costs import Costs
    from spectool.core.grammar import Grammar
    from spectool.core.stats import Stats
    from spectool.generate.loop import GenerationConfig, Step
    from spectool.drafters.builder import Policy, Wish
    from spectool.drafters.corpus import Corpus
    from spectool.drafters.dflash import DflashContext
    from spectool.drafters.eagle3 import Eagle3Context
    from spectool.drafters.mtp import MtpContext
    from spectool.llama.engine import Model
    from spectool.models.registry import ModelRef


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def fraction(self, done: float) -> None:
        pass

    def update(self, *args) -> None:
        pass


@dataclass
class Hooks:
    """What needs the user: `ask` confirms a download (None: refuse unless Options.yes), `bar(label,
    unit)` makes a progress bar (a context manager with `fraction(x)` and `update(done, total)`),
    `say` prints a line."""

    ask: Callable[[str], bool] | None = None
    bar: Callable[[str, str], ContextManager] = lambda label, unit: _NoBar()
    say: Callable[[str], None] = lambda line: None


class Refs(NamedTuple):
    """Which models to load (resolve_models)."""

    target: ModelRef
    draft: ModelRef | None
    draft_max: int  # the pair's draft length, else DRAFT_MAX


@dataclass
class Loaded:
    target: Model
    draft: Model | None  # None when none was asked for or it could not be used
    target_ref: ModelRef
    draft_ref: ModelRef | None
    draft_error: Exception | None = None  # why a draft that was asked for is not there
    draft_notice: str = ""
    # the draft's vocabulary is not the target's: it drafts through text (drafters/text.py)
    through_text: bool = False


@dataclass
class Session:
    """A ready generation: the loaded models, the drafting policy (drafters/builder.py: the
    session's drafter, its timed controller, the corpus) and what to call them."""

    gen: GenerationConfig  # with the session's options
    policy: Policy
    target_name: str
    draft_name: str | None
    # one-line messages for the user (fallbacks, pruning)
    notices: list[str] = field(default_factory=list)
    draft_model: Model | None = None  # in use by the drafter, if any

    @property
    def target(self) -> Model:
        return self.gen.target

    @property
    def mode(self) -> Mode:
        """What it drafts by (builder.resolve)."""
        return self.policy.mode

    @property
    def k_max(self) -> int:
        return self.policy.controller.k_max

    @property
    def k_min(self) -> int:
        return self.policy.controller.k_min

    @property
    def corpus(self) -> Corpus | None:
        return self.policy.corpus

    @property
    def offload(self) -> dict:
        """Where the weights went: backend and layers of the target and of the draft model
        (Model.offload)."""
        draft = self.draft_model
        return {"target": self.gen.target.offload(), "draft": draft.offload() if draft is not None
                else None}

    def stats(self) -> Stats:
        """A generation's Stats, naming what runs it; the loop fills them."""
        from spectool.core.stats import Stats

        return Stats(mode=self.mode, target=self.target_name, draft=self.draft_name,
                     offload=self.offload)


def fit_prompt(tokens: list[int], n_ctx: int, max_tokens: int, truncate: bool, bos: int,
               say: Callable[[str], None] = lambda line: None) -> list[int]:
    """The prompt must leave room for at least one new token; `truncate` keeps its end (and the
    BOS)."""
    if len(tokens) < n_ctx:
        return tokens
    if not truncate:
        raise UserError(f"the prompt has {len(tokens)} tokens but the context holds {n_ctx} "
                        "(-c/--ctx-size); raise -c or pass --truncate to keep the end of the "
                        "prompt")
    keep = n_ctx - min(max_tokens, n_ctx // 2)
    head = tokens[:1] if tokens and tokens[0] == bos else []
    out = head + tokens[len(tokens) - (keep - len(head)):]
    say(f"prompt truncated to its last {len(out)} of {len(tokens)} tokens (context {n_ctx})")
    return out


def text_completion(s: Session, text: str, stop, truncate: bool, interrupted, stats: Stats,
                    on_prefill: Callable[[int, int], None] | None = None,
                    say: Callable[[str], None] = lambda line: None
                    ) -> Generator[tuple[str, Step], None, None]:
    """`spectool run`'s generation: the (text, Step) pairs of the completion of `text` (see
    generate_text), `stats` (Session.stats) filled as it goes, `on_prefill` hearing the prompt's
    progress."""
    from spectool.generate.loop import generate_text

    target = s.gen.target
    tokens = fit_prompt(target.tokenize(text, add_special=True, parse_special=True), target.n_ctx,
                        s.gen.max_tokens, truncate, target.vocab_info().bos, say)
    return generate_text(s.gen, tokens, stop or (), stats, interrupted, on_prefill)


def generation(policy: Policy, target: Model, o: Options, grammar: Grammar | None = None,
               predicted: Sequence[int] | None = None) -> GenerationConfig:
    """The GenerationConfig that options `o` ask of a session's `policy` and `target` (a command
    line's, or a serve request's over the server's): checked sampling, token budget and seed, the
    grammar (`grammar` if given, made once: a serve request's, or the server's; else the one `o`
    asks for), and the drafter and controller the policy builds for it (drafters/builder.py: the
    session's drafter under that grammar, with the corpus, behind the tokens the output is predicted
    to be, `predicted`: see prediction_tokens)."""
    from spectool.generate.loop import GenerationConfig

    sampling = o.sampling()
    grammar = grammar if grammar is not None else o.grammar_spec()
    drafter, ctl = policy.drafting(grammar is not None, predicted,
                                   seeded=o.seed is not None and not sampling.greedy)
    return GenerationConfig(target, drafter, sampling, ctl, max_tokens=o.max_tokens, seed=o.seed,
                            grammar=grammar, draft_tree=o.draft_tree)


def prediction_tokens(target: Model, prediction: str | None) -> list[int] | None:
    """The tokens of the text the output is predicted to be (--prediction, a request's
    `prediction`), tokenized once for all of a request's choices; None without one."""
    return target.tokenize(prediction, add_special=False, parse_special=False) if prediction \
        else None


def resolve_models(o: Options) -> Refs:
    """The models of -m / -md / --pair / the default pair."""
    from spectool.models import registry

    if o.pair and o.model:
        raise UserError("give either --pair or -m, not both", code=2)
    pair = None
    if o.model:
        target = registry.parse_ref(o.model)
    else:
        reg = registry.load()
        name = o.pair or reg.default
        if not name:
            raise UserError("no model given: pass -m MODEL.gguf or --pair NAME (see `spectool "
                            "models`)", code=2)
        pair = reg.get(name)
        target = pair.target
    draft = registry.parse_ref(o.model_draft) if o.model_draft else (pair.draft if pair else None)
    return Refs(target, draft, pair.draft_max if pair else DRAFT_MAX)


# the most sequences a llama.cpp context holds (LLAMA_MAX_SEQ, src/llama-cparams.h)
MAX_SEQ = 256


def tree_seqs(draft_tree: int) -> int:
    """The sequences a generating sequence needs for draft trees of `draft_tree` siblings (0: one):
    its own, and a spare one for each leaf, the siblings' and the chain's end."""
    return 1 + (draft_tree + 1 if draft_tree else 0)


def load_models(o: Options, stack: contextlib.ExitStack, refs: Refs, want_draft: bool,
                hooks: Hooks = Hooks(), load_mtp: bool = False) -> Loaded:
    """Download if needed and load the target and (when wanted) the draft of `refs` (from
    resolve_models); check whether they share a vocabulary (else the draft drafts through text). A
    draft that cannot be loaded is reported in `draft_error`, not raised: the caller decides."""
    from spectool import attention
    from spectool.llama import devices, engine, parallel
    from spectool.models import hub

    engine.set_verbose(o.debug)
    hub.VERBOSE["on"] = o.debug
    if o.rpc:
        devices.add_rpc_workers(devices.parse_endpoints(o.rpc))
    target_ref, draft_ref = refs.target, refs.draft
    path = hub.ensure(target_ref, yes=o.yes, ask=hooks.ask)
    with hooks.bar(f"loading {Path(path).name}", "") as bar:
        # --parallel: one context for that many sequences (llama/parallel.py); draft trees: one more
        # a leaf, in one KV buffer sized for the generating sequences (generate/batch.py's spares)
        n_seq = o.parallel * tree_seqs(o.draft_tree)
        kind = engine.Model if n_seq == 1 else parallel.ParallelModel
        unified: dict = {"kv_unified": True} if o.draft_tree or (o.kv_unified and n_seq > 1) else {}
        if o.draft_tree and o.parallel > 1 and not o.kv_unified:  # (each slot -c / N, as without)
            unified["slots"] = o.parallel
        flash = attention.chosen(path, o.threads, o.gpu_layers, o.flash_attn,
                                 plain=o.spec is Mode.none)  # (nothing drafted: a token a step)
        target = stack.enter_context(kind(path, n_ctx=o.ctx_size, n_threads=o.threads,
                                          n_gpu_layers=o.gpu_layers, load_mtp=load_mtp,
                                          flash_attn=flash,
                                          progress=bar.fraction, n_seq_max=n_seq, **unified,
                                          ctx_seqs=o.parallel))
    out = Loaded(target, None, target_ref, draft_ref)
    if draft_ref is not None and want_draft:
        _load_draft(o, stack, out, draft_ref, hooks)
    return out


def _load_draft(o: Options, stack: contextlib.ExitStack, out: Loaded, ref: ModelRef,
                hooks: Hooks) -> None:
    """Load the draft `ref` beside the target of `out`, on the attention kernel chosen for a model
    that decodes a token a step; a draft that cannot be loaded goes to `out.draft_error`; one whose
    vocabulary is not the target's drafts through text."""
    from spectool import attention
    from spectool.llama import engine
    from spectool.models import hub
    from spectool.models.compat import vocab_differences

    try:
        path = hub.ensure(ref, yes=o.yes, ask=hooks.ask)
        with hooks.bar(f"loading {Path(path).name}", "") as bar:
            flash = attention.chosen(path, o.threads, o.gpu_layers_draft, o.flash_attn,
                                     plain=True)  # (a draft decodes a token a step)
            draft = stack.enter_context(engine.Model(path, n_ctx=out.target.n_ctx,
                                                     n_threads=o.threads,
                                                     n_gpu_layers=o.gpu_layers_draft,
                                                     local_only=True, flash_attn=flash,
                                                     progress=bar.fraction))
    except (engine.EngineError, hub.HubError) as e:
        out.draft_error, out.draft_notice = e, f"draft model not loaded ({e})"
        return
    problems = vocab_differences(out.target.vocab_info(), draft.vocab_info(), limit=1)
    if problems:
        out.through_text = True
        out.draft_notice = (f"the draft model's vocabulary is not the target's ({problems[0]}): it "
                            "drafts through text")
    out.draft = draft


def open_corpus(o: Options, target: Model, notices: list[str]) -> tuple[Corpus | None, str | None]:
    """(the corpus of earlier requests, the vocabulary tag of its --lookup-cache file) where
    --lookup-corpus is on (else None, None; the tag is None without a file); the policy keeps it
    where the drafter drafts by prompt lookup. The file's problems are notices: a broken or foreign
    file never stops a run."""
    from spectool.drafters.corpus import Corpus, vocab_tag

    if not o.lookup_corpus:
        return None, None
    if o.lookup_cache is None:
        return Corpus(o.lookup_corpus_size), None
    info = target.vocab_info()
    vocab = vocab_tag(info.texts, info.type)
    corpus, warning = Corpus.load(o.lookup_cache, vocab, o.lookup_corpus_size)
    if warning:
        notices.append(warning)
    return corpus, vocab


def pruned_draft(stack: contextlib.ExitStack, draft_model: Model, vocab: int, o: Options,
                 hooks: Hooks = Hooks(),
                 keep_original: bool = False) -> tuple[Model, np.ndarray | None, str]:
    """The loaded draft's copy pruned to `vocab` tokens (made on first use and cached), in its place
    unless `keep_original`: (Model, kept ids, a notice)."""
    from spectool.llama import engine
    from spectool.drafters import prune

    if not prune.cached_path(draft_model.path, vocab).exists():
        hooks.say(f"preparing a {vocab}-token copy of the draft (once; it is cached)")
    with hooks.bar("preparing the draft", "texts") as bar:
        path = prune.pruned_draft(draft_model.path, vocab, progress=bar.update, n_threads=o.threads)
    pruned = stack.enter_context(engine.Model(path, n_ctx=draft_model.n_ctx, n_threads=o.threads,
                                              n_gpu_layers=o.gpu_layers_draft, local_only=True))
    if not keep_original:
        draft_model.close()
    return pruned, prune.read_ids(path), f"draft pruned to {pruned.n_vocab} tokens ({path})"


@dataclass
class Plan:
    """What the options ask for, checked before anything loads."""

    grammar: Grammar | None
    refs: Refs
    wish: Wish  # what the options ask of drafting (drafters/builder.py decides what they get)
    prediction: str | None = None  # --prediction's text


def plan(o: Options) -> Plan:
    """Bad sampling options, a bad grammar, bad draft lengths and a --prediction file that cannot be
    read fail here, before anything loads."""
    from spectool.drafters.builder import Wish
    from spectool.options import read_text

    o.sampling()
    grammar = o.grammar_spec()
    refs = resolve_models(o)
    k_max = o.draft_max if o.draft_max is not None else refs.draft_max
    if o.draft_min > k_max:
        raise UserError("--draft-min must not exceed --draft-max", code=2)
    if (n_seq := o.parallel * tree_seqs(o.draft_tree)) > MAX_SEQ:
        raise UserError(f"--draft-tree {o.draft_tree} with --parallel {o.parallel} needs {n_seq} "
                        f"sequences: llama.cpp holds at most {MAX_SEQ}", code=2)
    prediction = (read_text(Path(o.prediction), "--prediction", "prediction")
                  if o.prediction is not None else None)
    return Plan(grammar, refs, Wish(o.spec, k_max, o.draft_min, o.draft_p_min, o.parallel,
                                    o.draft_tree > 0),
                prediction)


@dataclass
class Models:
    """The loaded models a session drafts with: the target, the draft model (pruned where asked;
    None without one) and its kept ids, the target's MTP head where it drafts, and the names to call
    them."""

    target: Model
    draft: Model | None
    ids: np.ndarray | None
    mtp: MtpContext | None
    target_name: str
    draft_name: str | None
    through_text: bool = False  # the draft's vocabulary is not the target's
    eagle3: Eagle3Context | None = None  # the EAGLE-3 head -md named, where it drafts
    dflash: DflashContext | None = None  # the DFlash head -md named, where it drafts


def head_file(ref: ModelRef | None, fetch: Callable[[ModelRef], Path | None] | None = None
              ) -> tuple[Mode, Path] | None:
    """(its kind: Mode.eagle3 or Mode.dflash, its path) where -md names a head file: on this
    machine, or on the Hub, which `fetch` (hub.ensure) downloads first to read (None: a file on the
    Hub is not looked at)."""
    from spectool.drafters import dflash, eagle3

    path = ref.path if ref is not None else None
    if ref is not None and path is None and fetch is not None:
        path = fetch(ref)
    if path is None or not path.is_file():
        return None
    return ((Mode.eagle3, path) if eagle3.is_head(path) else
            (Mode.dflash, path) if dflash.is_head(path) else None)


def load_stage(o: Options, stack: contextlib.ExitStack, refs: Refs, w: Wish, hooks: Hooks,
               notices: list[str]) -> Models:
    """The models the mode drafts with (builder.loads), loaded: the MTP heads only where they are to
    draft, a draft model that cannot be used a notice (an error when --spec draft demands it), the
    draft pruned where --draft-vocab asks; an EAGLE-3 or DFlash head (-md) beside the target
    where it drafts."""
    from spectool.drafters.builder import loads

    from spectool.models import hub
    from spectool.models.registry import RegistryError

    def fetch(ref: ModelRef) -> Path | None:  # (one that fails: load_models says so, as for any)
        try:
            return hub.ensure(ref, yes=o.yes, ask=hooks.ask)
        except (hub.HubError, RegistryError):
            return None

    # (only an -md of the user's, where a head could draft: a pair's draft model is no head)
    may_head = o.model_draft and w.n_seq == 1 and o.spec not in (Mode.none, Mode.lookup, Mode.mtp)
    kind, head = head_file(refs.draft, fetch if may_head else None) or (None, None)
    want_draft, use_mtp, use_head = loads(w, refs.draft is not None and head is None, kind)
    m = load_models(o, stack, refs if head is None else refs._replace(draft=None),
                    want_draft=want_draft, hooks=hooks, load_mtp=use_mtp)
    if m.draft_error is not None:
        if o.spec is Mode.draft:
            raise m.draft_error
        notices.append(m.draft_notice + "; using prompt lookup")
    elif m.through_text:
        notices.append(m.draft_notice)
    target, draft, ids = m.target, m.draft, None
    if draft is not None and 0 < o.draft_vocab < draft.n_vocab and not m.through_text:
        draft, ids, notice = pruned_draft(stack, draft, o.draft_vocab, o, hooks)
        notices.append(notice)
    mtp = None
    if use_mtp and target.n_nextn and target.can_rollback:
        from spectool.drafters.mtp import MtpContext

        mtp = stack.enter_context(contextlib.closing(MtpContext(target)))
    heads: dict = {}
    if head is not None and use_head and target.can_rollback:
        from spectool.drafters.dflash import DflashContext
        from spectool.drafters.eagle3 import Eagle3Context

        context = Eagle3Context if kind is Mode.eagle3 else DflashContext
        heads[str(kind)] = stack.enter_context(contextlib.closing(context(target, head)))
    draft_name = (str(m.draft_ref) if draft is not None else str(head) if heads else None)
    return Models(target, draft, ids, mtp, str(m.target_ref), draft_name, m.through_text,
                  heads.get("eagle3"), heads.get("dflash"))


def costs_stage(o: Options, m: Models, grammar: bool,
                notices: list[str]) -> tuple[Path | None, Costs]:
    """The cost table kept between runs for these models and settings, where anything may be
    drafted (a mode other than none, or a grammar's forced tokens): the file, and the table read
    from it; none where there is no usable cache folder (measured from scratch, kept nowhere)."""
    from spectool import cost_files
    from spectool.core.costs import Costs

    try:
        path = (cost_files.path_for(m.target, m.draft, o.threads, o.rpc, o.ctx_size)
                if o.spec is not Mode.none or grammar else None)
    except (OSError, RuntimeError):
        path = None
    costs, warning = cost_files.load(path, max_batch=m.target.n_ctx)
    if warning:
        notices.append(warning)
    return path, costs if costs is not None else Costs()


def save_stage(o: Options, s: Session, m: Models, costs_file: Path | None, vocab: str | None,
               say: Callable[[str], None]) -> None:
    """What a session keeps when it closes: the lookup cache (--lookup-cache) and the measured batch
    costs."""
    from spectool import cost_files

    if vocab is not None and s.corpus is not None and o.lookup_cache is not None \
            and (warning := s.corpus.save(o.lookup_cache, vocab)):
        say(warning)
    costs = s.policy.controller.costs
    if costs_file is not None and (costs.verify or costs.shapes):
        draft = str(Path(m.draft.path).resolve()) if m.draft is not None else None
        cost_files.save(costs_file, costs, {
            "target": str(Path(m.target.path).resolve()), "threads": o.threads, "ctx": o.ctx_size,
            "draft": draft})


@contextlib.contextmanager
def open_session(o: Options, hooks: Hooks = Hooks()) -> Iterator[Session]:
    """Load the models of `o` and yield a ready Session; what it measured is kept when it closes
    (save_stage)."""
    from spectool.drafters.builder import choose

    p = plan(o)
    notices: list[str] = []
    with contextlib.ExitStack() as stack:
        m = load_stage(o, stack, p.refs, p.wish, hooks, notices)
        costs_file, costs = costs_stage(o, m, p.grammar is not None, notices)
        corpus, vocab = open_corpus(o, m.target, notices)
        policy = choose(p.wish, m.target, m.draft, m.ids, m.mtp, costs, corpus, notices,
                        m.through_text, m.eagle3, m.dflash)
        if o.lookup_cache is not None and policy.corpus is None:
            notices.append(f"--lookup-cache {o.lookup_cache}: this mode does not draft by prompt "
                           "lookup; not used")
        draft_model = m.draft if policy.mode in (Mode.draft, Mode.hybrid) else None
        predicted = prediction_tokens(m.target, p.prediction)
        s = Session(generation(policy, m.target, o, p.grammar, predicted), policy,
                    m.target_name, m.draft_name, notices, draft_model)
        try:
            yield s
        finally:
            save_stage(o, s, m, costs_file, vocab, hooks.say)
