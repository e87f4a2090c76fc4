"""The speculative loop: a generator of Step events, draft -> verify -> accept -> observe -> emit.

Notation: x is the token history (prompt + accepted output); the target's KV cache always holds
x[:-1], so each step feeds [x[-1], d_1..d_k] in one batch and reads k+1 rows of target logits
p_0..p_k, where p_i is the target's distribution after x + d_1..d_i. q are the drafter's
distributions (see core/verify.py).

The loop takes the drafter it is given (drafters/builder.py builds one whole: grammar, corpus,
fallback) and decides nothing of it: the controller picks each step's draft length, the acceptance
rule keeps the target's distribution.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Generator, Iterator, Sequence, cast


from spectool.core.audit import HORIZON, Audit, Offer
from spectool.core.controller import Beside, Controller
from spectool.core.evidence import Evidence, Source
from spectool.core.grammar import (Constraint, Grammar, NothingAllowed, dist_under, follow,
                                   token_under)
from spectool.core.protocol import EMPTY, WIDTH, Draft, Drafter
from spectool.core.stats import Stats
from spectool.core.verify import (Dist, Random, Sampling, TokenLogprob, accept_greedy,
                                  accept_sampled, accept_tree, backend_chain, dist_at,
                                  greedy_rows, token_at, token_logprob)
from spectool.generate.plan import Offered, Plan
from spectool.generate.prompt import calibrate, freeze_startup_objects, prefill
from spectool.generate.sampler import HostChain
from spectool.generate.stream import TextStream
from spectool.llama.engine import Model
from spectool.llama.outputs import ROWS, Output
from spectool.llama.parallel import ParallelModel, Tree

@dataclass(slots=True, kw_only=True)
class Step:
    """One target pass: the tokens it made final, where its drafts came from, and what it cost."""

    tokens: list[int]  # the new final tokens: accepted drafts, then the target's own token
    drafted: int = 0
    # of the drafted tokens, before any cut at end-of-generation, the budget or a stop string
    accepted: int = 0
    source: Source = Source.none
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    text: str = ""  # what became final as text, when the generation makes text (generate_text)
    draft_chars: int = 0  # how much of `text` came from accepted drafts
    # of the drafted tokens, how many a grammar forced (Source.grammar; the rest are `source`'s)
    forced: int = 0
    # on the last step: "stop" | "length" | "context" | "interrupted"
    finish_reason: str | None = None
    notice: str | None = None  # a one-line message for the user (e.g. the draft model failed)
    # one per token of `tokens`, when GenerationConfig.logprobs asks
    logprobs: list[TokenLogprob] | None = None
    # the drafted tokens the target refused (the draft after its `accepted`)
    rejected: list[int] = field(default_factory=list)
    # a draft tree's: the siblings verified beside the chain (`drafted` counts the chain's), and
    # whether the accepted path took one
    branches: int = 0
    off_chain: bool = False


@dataclass
class GenerationConfig:
    """Everything one generation needs besides the prompt."""

    target: Model
    # built whole (drafters/builder.py); under a grammar, it drafts under it
    drafter: Drafter | None = None
    sampling: Sampling = field(default_factory=Sampling)
    controller: Controller = field(default_factory=Controller)
    max_tokens: int = 256
    seed: int | None = None
    # made from `seed` on first use and kept: a chat's turns go on drawing
    rng: Random | None = None
    grammar: Grammar | None = None  # every token follows it (core/grammar.py)
    # each token's log-probability and this many alternatives (Step.logprobs); None:
    logprobs: int | None = None
    # none, and llama.cpp's graph may sample the rows where they are (backend_chain)
    # the most tokens a step drafts, where a request sets its own (0: none); None: the controller's
    draft_max: int | None = None
    # the most siblings a step's draft tree may verify beside its chain (0: chains only); trees
    # need a target with a unified KV cache and a spare sequence for each leaf (llama/parallel.py),
    # and no logprobs or penalties
    draft_tree: int = 0

    def random(self) -> Random:
        if self.rng is None:
            self.rng = Random(self.seed)
        return self.rng


def never() -> bool:
    return False


def speculative_generate(g: GenerationConfig, prompt: Sequence[int], stats: Stats | None = None,
                         interrupted: Callable[[], bool] = never,
                         stop: Sequence[str] | None = None,
                         on_prefill: Callable[[int, int], None] | None = None) -> Iterator[Step]:
    """The loop: a Step per target pass. `interrupted()` is asked between steps (true: a last step,
    finish reason "interrupted", with any text held back for a stop string) and between the
    prefill's batches (true: it raises KeyboardInterrupt there). `stop`: the steps carry their text,
    cut at the first of these strings (None: no text is made). `on_prefill` hears (done, total)
    while the prompt is processed. `stats`, where given, is written here and nowhere else: a
    generation that ends otherwise than by a last step (an error, a Ctrl-C, the generator closed)
    is "interrupted"."""
    try:
        t0 = time.perf_counter()  # prompt processing: everything before the first step
        freeze_startup_objects()
        x = list(prompt)
        # before the prefill: it may fail
        constraint = g.grammar.matcher(g.target) if g.grammar is not None else None
        n_prefilled = prefill(g.target, x, interrupted, on_prefill)
        # what llama.cpp samples inside its graph (ids, top-k or rows); a grammar's mask and
        # logprobs need whole rows
        on_graph = backend_chain(g.sampling) if constraint is None and g.logprobs is None else ROWS
        notice = None
        if g.drafter is not None:
            calibrate(g.target, x, g.controller, on_graph)
            # a draft model's prompt is prompt processing, not drafting
            notice = g.drafter.start(x, constraint)
        if stats is not None:
            stats.n_prompt_tokens, stats.n_prefilled = len(x), n_prefilled
            stats.prompt_seconds = time.perf_counter() - t0
        stream = None if stop is None else TextStream(g.target, stop)
        yield from Loop(g, x, on_graph, stats, stream, constraint, notice).steps(interrupted)
    finally:
        if stats is not None and stats.finish_reason is None:
            stats.finish_reason = "interrupted"


def generate_text(g: GenerationConfig, prompt: Sequence[int], stop: Sequence[str] = (),
                  stats: Stats | None = None, interrupted: Callable[[], bool] = never,
                  on_prefill: Callable[[int, int], None] | None = None
                  ) -> Generator[tuple[str, Step], None, None]:
    """Yield (text, step) pairs: the text that became final at each step (its first
    `step.draft_chars` characters came from accepted drafts), up to the first stop string; see
    speculative_generate."""
    for step in speculative_generate(g, prompt, stats, interrupted, stop, on_prefill):
        yield step.text, step



class Loop:
    """One generation's state between steps: the history x, the tokens made so far, what the user is
    to be told. A step is plan -> the target's pass over batch(plan) -> accept -> settle; `steps`
    drives one sequence through them, generate/batch.py many at once."""

    def __init__(self, g: GenerationConfig, x: list[int], on_graph: Output, stats: Stats | None,
                 stream: TextStream | None, constraint: Constraint | None, notice: str | None):
        self.g = g
        self.x = x
        self.target = g.target
        self.drafter = g.drafter
        self.ctl = g.controller
        self.sampling = g.sampling
        self.rng = g.random()
        self.on_graph = on_graph
        self.stats = stats
        self.stream = stream
        self.constraint = constraint
        self.notice = notice
        # acceptance is learnt per temperature
        self.temp = 0.0 if g.sampling.greedy else g.sampling.temp
        self.n_new = 0
        # a greedy generation's adaptive picks checked against fixed lengths (core/audit.py)
        # (not under a floor the user set: --draft-min is a policy of its own; not sampled: there
        # the controller leads every fixed length, and the audit's one-draw counts cost 1.2%)
        self.audit = (Audit() if g.sampling.greedy and self.ctl.adaptive and self.ctl.audit
                      and not self.ctl.k_min and g.drafter is not None else None)
        # the most siblings a draft tree may have here (0: chains; logprobs and penalties read a
        # chain's rows; a head that follows the target's decodes hears no tree's)
        tree = (isinstance(g.target, ParallelModel) and g.target.kv_unified
                and g.logprobs is None and not g.sampling.window and not g.target.listened)
        # (a spare sequence for each leaf: the siblings' and the chain's end)
        self.tree_cap = max(0, min(g.draft_tree, g.target.n_seq_max - 2)) if tree else 0
        # the target's own sampled tokens drawn by llama.cpp's chain on the host where it is the
        # whole rule (no penalties, no grammar), with this generation's numbers (sampler.py)
        self.host = (HostChain(g.sampling, self.rng)
                     if not g.sampling.greedy and not g.sampling.window and constraint is None
                     else None)

    def worth(self, key: Evidence) -> float:
        """What the controller makes of a drafter's greedy key at this generation's temperature."""
        return self.ctl.worth(key, self.temp)

    def drawer(self, rows) -> Callable[[int], int] | None:
        """The target's own token from row i of `rows`, drawn on the host by llama.cpp's chain,
        where there is one and the rows are whole; else None (verify.py draws)."""
        host = self.host
        if host is None or rows.output is not ROWS:
            return None
        return lambda i: host.draw(rows, i)

    def steps(self, interrupted: Callable[[], bool]) -> Iterator[Step]:
        x, target = self.x, self.target
        try:
            while (p := self.plan(target.n_ctx)) is not None:
                t0 = time.perf_counter()
                if p.tree is not None:
                    cast(ParallelModel, target).eval_tree(p.tree)
                else:
                    target.eval([x[-1], *p.draft.tokens], logits="all", output=self.on_graph)
                self.accept(target, p)
                step = self.settle(p, target, t0)
                yield step
                if step.finish_reason:
                    return
                if interrupted():
                    yield from self.interrupt()
                    return
            yield self.last("context")
        finally:
            # whatever happened, the cache holds x[:-1] and nothing drafted
            target.rollback(len(x) - 1)
            if self.tree_cap:  # (nor a draft tree's leaves)
                cast(ParallelModel, target).drop_tree()
            self.finish()

    def finish(self) -> None:
        """The generation ended: its drafter hears the whole history."""
        if self.drafter is not None:
            self.drafter.finish(self.x)

    def plan(self, n_ctx: int, share: int | None = None) -> Plan | None:
        """The step's drafts: the drafter's offer (`offer`), of which the controller picks within
        every bound; None where the context has no room left."""
        o = self.offer(n_ctx, share)
        if o is None:
            return None
        # plain decoding has nothing for the controller to pick from
        return self.draft(o, self.ctl.pick(o.keys, self.temp, o.limit)
                          if self.drafter is not None else [])

    def offer(self, n_ctx: int, share: int | None = None) -> Offered | None:
        """What the drafter offers this step, and the most the step may draft: the room the
        context of `n_ctx` tokens has for the batch [x[-1], d_1..d_k], a batch's `share` of drafts
        per sequence, the token budget, the request's draft_max; None where the context has no room
        left."""
        room = n_ctx - len(self.x)
        if room < 0:
            return None
        t0 = time.perf_counter()
        limit = min(room, self.g.max_tokens - self.n_new - 1)
        for bound in (share, self.g.draft_max):
            limit = limit if bound is None else min(limit, bound)
        if self.drafter is None:
            return Offered(iter(()), 0, t0)
        return Offered(self.drafter.peek(self.x, self.ctl.k_max, self.worth), limit, t0)

    def draft(self, o: Offered, keys: list[Evidence], audited: bool = True,
              tree: bool = True) -> Plan:
        """The plan for the controller's `keys` of offer `o`: where the audit (`audited`: the
        decode is this sequence's alone) finds a fixed length faster on this text, that length;
        then the drafter's tokens, and a tree where siblings pay (`tree`: a batch grows its own)."""
        if self.drafter is None:
            return Plan([], EMPTY, 0.0)
        if self.audit is not None and audited and hasattr(o.keys, "take"):  # lookup's: known
            known = cast(Offer, o.keys)
            k, theirs = self.audit.choose(len(keys), known, o.limit, self.x)
            if theirs is not None:  # llama-lookup's rule drafts, and the controller learns nothing
                return Plan([], self.ended(Draft(theirs, None, Source.lookup), []),
                            time.perf_counter() - o.t0)
            keys = known.keys[:k]
        drawn = self.drafter.propose(self.x, len(keys), self.sampling, self.rng) if keys else EMPTY
        d = self.ended(drawn, keys)
        if d.notice:
            self.notice = d.notice
        p = Plan(keys, d, 0.0, drawn=len(drawn.tokens))
        if tree and self.tree_cap:  # (a cell for each node in the KV buffer: it holds len(x) - 1)
            self.grow(p, cast(ParallelModel, self.target).n_ctx_total - len(self.x) - len(d.tokens))
        p.draft_seconds = time.perf_counter() - o.t0
        return p

    def ended(self, d: Draft, keys: Sequence[Evidence]) -> Draft:
        """`d` (drafted under `keys`) up to where the generation would end, were it accepted: its
        first end-of-generation token, or the token that completes a stop string. What follows
        would be cut from the output, so it is not verified."""
        n = min(len(d.tokens), self.target.first_eog(d.tokens) + 1)
        if self.stream is not None:
            n = self.stream.ending(d.tokens[:n])
        if n == len(d.tokens):
            return d
        # (a grammar's forced tokens, under its key, may take turns with lookup's)
        forced = sum(key.source is Source.grammar for key in keys[:n]) if d.forced else 0
        return replace(d, tokens=d.tokens[:n], q=None if d.q is None else d.q[:n], forced=forced)

    def grow(self, p: Plan, room: int, beside: Beside | None = None) -> None:
        """The chain `p` drafted made the draft tree the controller prices above it (p.tree and its
        siblings, p.branches; none where the chain is best): at most `room` siblings, each a leaf
        after the chain's node before it; `beside`: the rest of the decode, where other sequences
        share it."""
        d, cap = p.draft, min(self.tree_cap, room)
        if cap <= 0 or not d.tokens or not p.keys:
            return
        assert self.drafter is not None
        k, keys = len(d.tokens), p.chain_keys
        depths = self.ctl.branching(keys, cap, beside)  # (where no sibling could pay, none asked)
        offered = self.drafter.branches(self.x, d.tokens[:depths], WIDTH) if depths else []
        p.branches = self.ctl.branch(keys, offered, cap, beside) if offered else []
        if p.branches:
            p.tree = Tree([self.x[-1], *d.tokens, *(b.token for b in p.branches)],
                          [-1, *range(k), *(b.depth for b in p.branches)])

    def batch(self, p: Plan) -> list[int] | Tree:
        """What the target's pass decodes for this sequence: [x[-1], d_1..d_k], or its tree."""
        return p.tree if p.tree is not None else [self.x[-1], *p.draft.tokens]

    def accept(self, rows, p: Plan) -> None:
        """What the pass's rows p_0..p_k (the target's, or one sequence's rows of a batch: `rows`
        reads them as verify.py reads a model's) make of the drafts: the acceptance rule, then the
        new tokens' logprobs where asked, all read before any roll-back (which drops the decode's
        outputs)."""
        try:
            if p.tree is not None or (self.tree_cap and not self.sampling.greedy):
                return self.accept_tree(rows, p)  # (a chain too: draws no tree's shape moves)
            p.n_acc, p.token = self.acceptance(rows, p.draft)
        except NothingAllowed:
            p.token = -1
            return
        if self.g.logprobs is not None:
            t0 = time.perf_counter()
            p.logprobs = self.logprobs([*p.draft.tokens[: p.n_acc], p.token], rows)
            p.logprob_seconds = time.perf_counter() - t0

    def accept_tree(self, rows, p: Plan) -> None:
        """Acceptance on the draft tree's rows, or a chain's where trees are on (verify.accept_tree:
        deterministic siblings, a chain drawn from q by rejection sampling): the path taken, kept
        in the cache. Each deterministic token is then one draw from its row, however the steps
        were shaped: a seeded sample is the same beside any other sequences' trees. Under a
        grammar each node's row is masked by its state after the node's path, and it then holds x,
        the path and the target's token."""
        s, q, k, c = self.sampling, p.draft.q or [], len(p.draft.tokens), self.constraint
        tree = p.tree or Tree([self.x[-1], *p.draft.tokens], [-1, *range(k)])
        held: list[int] = []  # the path whose tokens the grammar holds (the root's left out)

        def row(i: int, plain, under):  # node i's row, masked by the grammar after its path
            if c is None:
                return plain(rows, i, s)
            held[:] = follow(c, tree, held, i)
            return under(rows, i, s, (), c)

        draw = self.drawer(rows)  # (none under a grammar: no host chain there)

        def token_of(i: int) -> int:
            if s.greedy:
                return row(i, token_at, token_under)
            return draw(i) if draw is not None else row(i, dist_at, dist_under).sample(self.rng)

        def drawn(i: int) -> tuple[int, Dist, Dist] | None:  # (chain node i's child is node i + 1)
            q_i = q[i] if i < min(k, len(q)) else None
            return None if q_i is None else (i + 1, row(i, dist_at, dist_under), q_i)

        path, p.token = accept_tree(token_of, tree.tokens, tree.parents, drawn, self.rng)
        if c is not None:  # (it then holds x, the path and the target's token)
            follow(c, tree, held, path[-1])
            if not c.push([p.token]):
                raise NothingAllowed("the grammar admits no token here")
        if p.tree is not None:
            p.path = path
            rows.keep_path(path)
        p.n_acc = len(path) - 1

    def settle(self, p: Plan, rows, t0: float, alone: bool = True) -> Step:
        """The step after accept: the cache (`rows`) rolled back to x and the accepted drafts (the
        target's token is fed next step), what the controller learns (the pass's cost since `t0`
        where it was this sequence's `alone`), and the Step, cut and recorded."""
        if p.token < 0:
            return self.last("stop")
        rows.rollback(len(self.x) + p.n_acc)
        seconds = time.perf_counter() - t0
        self.observe(p, seconds - p.logprob_seconds if alone else None)
        step = self.emit(p, seconds)
        if self.audit is not None:
            self.audit.judge(self.x, self.ctl.costs.verify_costs(HORIZON + 1))
        return step

    def interrupt(self) -> Iterator[Step]:
        """The end of an interrupted generation: a last step with the text held back for a stop
        string, if any."""
        held = self.stream.flush() if self.stream is not None else ""
        step = self.last("interrupted", held)
        if held:
            yield step

    def acceptance(self, rows, d: Draft) -> tuple[int, int]:
        """The acceptance rule on the verification's rows p_0..p_k: how many drafts are accepted,
        and the target's own next token."""
        s, tokens = self.sampling, d.tokens
        recent = self.x[-s.window:] if s.window else []  # p_i's penalties see x + d_1..d_i
        if self.constraint is not None:
            return self.accept_under(rows, d, recent, self.constraint)
        if s.greedy:
            return accept_greedy(greedy_rows(rows, s, recent, tokens), tokens)
        return accept_sampled(lambda i: dist_at(rows, i, s, recent + tokens[:i]), d.q, tokens,
                              self.rng, self.drawer(rows))

    def accept_under(self, rows, d: Draft, recent: list[int], c: Constraint) -> tuple[int, int]:
        """The acceptance rule under a grammar: p_i is the target's row after x + d_1..d_i masked by
        the grammar in that state (the drafts were cut to what it accepts), so the grammar advances
        over each draft as its row is reached; it then holds x, the accepted drafts and the target's
        token."""
        s, tokens = self.sampling, d.tokens

        def row(i: int, under):
            if i:
                c.push(tokens[i - 1 : i])
            return under(rows, i, s, recent + tokens[:i], c)

        if s.greedy:
            n_acc, t = accept_greedy((row(i, token_under) for i in range(len(tokens) + 1)), tokens)
        else:
            n_acc, t = accept_sampled(lambda i: row(i, dist_under), d.q, tokens, self.rng)
        if not c.push([t]):
            raise NothingAllowed("the grammar admits no token here")
        return n_acc, t

    def logprobs(self, new: list[int], rows) -> list[TokenLogprob]:
        """Each new token's TokenLogprob from the verification's own rows: token i of the step was
        chosen on row i (the target after x + d_1..d_i), accepted drafts and the target's token
        alike."""
        n = self.g.logprobs or 0
        return [token_logprob(rows.logits(i), token, n) for i, token in enumerate(new)]

    def observe(self, p: Plan, verify_seconds: float | None) -> None:
        """What the controller learns from a step: the batch's cost (None: the decode was shared
        with other sequences, generate/batch.py, and says nothing of it), the draft's cost and how
        far it was accepted. Plain decoding (no drafter) has nothing to decide, so nothing to learn.
        Catching up is not per token."""
        if self.drafter is None:
            return
        d = p.draft
        if verify_seconds is not None and p.tree is None:  # (a tree's decode does more than rows)
            self.ctl.observe_verify(p.rows, verify_seconds)
        if d.tokens and p.keys:  # (the audit's own drafts have no keys: core/audit.py)
            # (the drafter's time went into every token it drew, also those cut: Loop.ended)
            self.ctl.observe_draft(p.keys[: max(p.drawn, len(d.tokens))],
                                   p.draft_seconds - d.catch_up_seconds)
            self.ctl.observe_accept(p.keys, len(d.tokens), p.chain_acc)
        shares: dict[Source, float] = {}
        for b in p.branches:
            if b.depth == p.chain_acc:  # (the chain refused there)
                shares[b.source] = shares.get(b.source, 0.0) + b.share
        if shares:
            self.ctl.observe_siblings(shares, p.taken.source if p.taken is not None else None)

    def emit(self, p: Plan, verify_seconds: float) -> Step:
        """The step, its tokens cut at end-of-generation, the token budget or a stop string, then
        recorded."""
        d, n_acc = p.draft, p.n_acc
        new, finish = self.cut([*p.accepted_tokens, p.token])
        text, draft_chars = "", 0
        if self.stream is not None:
            new, finish, text, draft_chars = self.stream.step(new, finish, n_acc)
        self.x.extend(new)
        self.n_new += len(new)
        logprobs = None if self.g.logprobs is None else (p.logprobs or [])[: len(new)]
        step = Step(tokens=new, drafted=len(d.tokens), accepted=n_acc,
                    source=d.source, draft_seconds=p.draft_seconds,
                    verify_seconds=verify_seconds, text=text, draft_chars=draft_chars,
                    finish_reason=finish, notice=self.notice, forced=d.forced, logprobs=logprobs,
                    rejected=list(d.tokens[p.chain_acc :]), branches=p.siblings,
                    off_chain=p.chain_acc < n_acc)
        self.notice = None
        if self.stats is not None:
            self.stats.add_step(step)
            self.stats.finish_reason = finish
            self.stats.stop_string = self.stream.stopped if self.stream is not None else None
        return step

    def cut(self, new: list[int]) -> tuple[list[int], str | None]:
        """`new` up to the first end-of-generation token ("stop") or the token budget ("length")."""
        end = self.target.first_eog(new)
        if end < len(new):
            return new[:end], "stop"
        if self.n_new + len(new) >= self.g.max_tokens:
            return new[: self.g.max_tokens - self.n_new], "length"
        # nothing but end-of-generation can follow
        if self.constraint is not None and self.constraint.complete:
            return new, "stop"
        return new, None

    def last(self, finish: str, text: str = "") -> Step:
        """A step with no pass behind it, that ends the generation."""
        if self.stats is not None:
            self.stats.finish_reason = finish
        return Step(tokens=[], text=text, finish_reason=finish)
