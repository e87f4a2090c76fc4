"""The controller's audit against fixed draft lengths (core/audit.py): on its own, over offers and texts made up
to show each case; and in the loop, on the generated tiny model, where a controller whose priors are poisoned
(every lookup key believed worthless, as a bad run or a foreign table might leave them) still drafts about as well
as the best fixed length, and without the audit it does not (the negative control)."""

from spectool_lab.helpers import tokens_of

from spectool.core.audit import LENGTHS, Audit
from spectool.core.controller import Controller
from spectool.core.costs import Costs
from spectool.core.stats import Stats
from spectool.drafters.lookup import PromptLookup
from spectool.generate.loop import GenerationConfig, speculative_generate

# a batch of b tokens costs 1 + 0.2 (b - 1): a draft of k pays where more than about 0.2 k of it holds
COSTS = [0.0] + [1.0 + 0.2 * (b - 1) for b in range(1, 40)]


class Known:
    """An offer whose tokens are known (core/audit.py's Offer)."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.keys = tokens, []

    def take(self, k: int) -> list[int]:
        return self.tokens[:k]


def feed(audit: Audit, offers, text: list[int], picked: int, costs: list[float] = COSTS,
         rule: list | None = None) -> list[int]:
    """Steps over `text` (one token a step), each offering `offers(pos)`; the lengths the audit drafted (and in
    `rule`, whether llama-lookup's rule drafted them, with what)."""
    drafted = []
    for pos in range(len(text) - 20):
        k, theirs = audit.choose(picked, Known(offers(pos)), 16, text[:pos])
        drafted.append(k)
        if rule is not None:
            rule.append(theirs)
        audit.judge(text[: pos + 1], costs)
    return drafted


def test_a_fixed_length_takes_over_where_it_was_faster_and_not_before():
    text = list(range(200))
    right = feed(Audit(), lambda pos: text[pos : pos + 16], text, picked=0)  # every offer holds: drafting pays
    assert right[: Audit().min_steps] == [0] * Audit().min_steps  # not on too little evidence
    assert set(right[30:]) == {16}  # the longest: all of it was right
    wrong = feed(Audit(), lambda pos: [999] * 16, text, picked=0)  # never right: not drafting is best
    assert set(wrong) == {0}


def test_drafting_nothing_takes_over_by_its_own_small_margin():
    text = list(range(200))

    def picks(second: float, holds: int = 1, picked: int = 1) -> list[int]:
        # a batch of two costs `second` steps, each row past it one more: only the first `holds` of an offer hold
        costs = [0.0, 1.0] + [second + b for b in range(40)]
        return feed(Audit(), lambda pos: text[pos : pos + holds] + [999] * (16 - holds), text, picked, costs)

    # the controller's one-token drafts all hold: 2 tokens for 2.05 steps, 2.4% behind plain decoding: they stand
    assert set(picks(2.05)) == {1}
    # 2 for 2.1 (4.8% behind): drafting nothing, once enough steps were seen, whatever the fixed lengths made
    assert picks(2.1)[: Audit().min_steps] == [1] * Audit().min_steps and set(picks(2.1)[20:]) == {0}
    # drafts that never hold: nothing, not the fixed length 1 that also led by more than its margin
    assert set(picks(1.2, holds=0, picked=4)[20:]) == {0}
    # drafts that pay (3 of 4 hold, 4 tokens for 1.8 steps): drafting nothing never takes over
    assert 0 not in picks(0.8, holds=3, picked=4)


def test_the_controllers_own_picks_stand_where_they_are_as_good():
    text = list(range(200))
    # the controller drafts 3 where exactly 3 hold: no fixed length beats that
    drafted = feed(Audit(), lambda pos: text[pos : pos + 3] + [999] * 13, text, picked=3)
    assert set(drafted) == {3}


def test_llama_lookups_rule_takes_over_where_its_drafts_held_more():
    """A text that repeats a 10-token cycle: once it has come round, llama-lookup's rule (core/ngram_cache.py)
    drafts the cycle's next 8 tokens, all right, while lookup's offer is always wrong: the rule drafts, its own
    tokens. Where the controller drafts 16 tokens of an offer that holds in full, faster than the rule's 8, the
    rule never drafts."""
    text = list(range(10)) * 20
    rule: list = []
    drafted = feed(Audit(), lambda pos: [999] * 16, text, picked=0, rule=rule)
    late = list(zip(drafted, rule))[40:]
    assert late and all(theirs == text[pos + 40 : pos + 48] and k == 8 for pos, (k, theirs) in enumerate(late))
    assert rule[: Audit().min_steps] == [None] * Audit().min_steps  # not on too little evidence
    rule = []
    assert set(feed(Audit(), lambda pos: text[pos : pos + 16], text, picked=16, rule=rule)) == {16}
    assert set(map(str, rule)) == {"None"}
    # the control: with a margin no rate clears, the rule never drafts
    rule = []
    feed(Audit(rule_margin=100.0), lambda pos: [999] * 16, text, picked=0, rule=rule)
    assert set(map(str, rule)) == {"None"}


def test_of_several_ahead_the_furthest_less_its_margin_leads():
    """The rule a little faster than drafting nothing, both well ahead of the controller: drafting nothing leads,
    its figure being exact where the rule's is flattered (a SmolLM2 prompt drafted 8 tokens a step that all
    failed, live, on such a lead); the rule leads once it is ahead by more than the margins' difference."""
    from spectool.core.audit import RULE

    audit = Audit()
    audit.steps, audit.ours = 20.0, [1.0, 1.2]
    audit.made, audit.spent = {0: 1.0, RULE: 1.05, 4: 1.25}, {0: 1.0, RULE: 1.0, 4: 1.0}
    assert audit.leader() == 0
    audit.made[RULE] = 1.2
    assert audit.leader() == RULE
    audit.made[4] = 1.6
    assert audit.leader() == 4
    audit.ours = [1.0, 0.7]  # the controller ahead of them all
    assert audit.leader() is None


def test_a_step_is_judged_only_once_the_text_has_passed_it():
    audit = Audit()
    audit.choose(0, Known([1, 2, 3]), 16, [])
    audit.judge([1, 2], COSTS)  # 2 of 3 known, all right so far: the drafts of 1 and 2 judged, not the step
    assert audit.steps == 0 and audit.made[2] == 3 and 3 not in audit.made and audit.made[0] == 1
    audit.judge([1, 2, 3], COSTS)
    assert audit.steps == 1 and audit.made[3] == 4 and audit.made[1] == 2 and audit.ours == [1.0, COSTS[1]]
    audit.choose(0, Known([7, 8]), 16, [1, 2, 3])
    audit.judge([1, 2, 3, 5], COSTS)  # wrong at once: judged as soon as that shows
    assert audit.steps == 1.0 * audit.decay + 1


def test_an_echo_after_a_stretch_where_drafting_nothing_led_gets_its_drafts_back_before_the_longest_is_known():
    """Offers that all fail, so that drafting nothing leads and the audit drafts nothing; then the text echoes what
    lookup offers, and the controller's 4 would all hold. Each draft is judged as soon as the text passes it, so
    under plain decoding the short ones' verdicts come first, and the controller drafts again within 7-11 steps
    (measured), never to stop. Judged together when the longest (16) was known, no verdict came before 16 steps
    (19-23 to hand back: research/audit_lag.py's `Together`)."""
    text = list(range(300))
    for start in (20, 40, 60):
        drafted = feed(Audit(), lambda pos: [999] * 16 if pos < start else text[pos : pos + 16], text, picked=4)
        assert set(drafted[Audit().min_steps + 1 : start]) == {0}  # drafting nothing led
        back = next(i for i in range(start, len(drafted)) if drafted[i])
        assert back - start < 16 and drafted[back] == 4 and 0 not in drafted[back:]  # (later 16, all of it right)


def test_the_controllers_own_long_drafts_come_back_before_the_text_has_passed_them():
    """The same echo, but the controller picks 8-16 tokens, all of which would hold (Gemma's qa prompt 2 of seed
    371290, notes/2026-12-06-gemma-on-the-xeon.md). Under plain decoding its first draft in the echo is judged only
    `picked` steps in, while the failed drafts before it are known: counted at what the text has shown of them so
    far (at least held + 1 tokens for their batch's cost), its pending drafts hand it the step back within 3 steps of
    that first verdict (measured: 1-3). Counted only once judged, 3-10 (research/audit_lag.py's `Unseen`), and a
    short fixed length drafted in between."""
    text = list(range(300))
    for picked in (8, 12, 16):
        for start in (20, 40):
            drafted = feed(Audit(), lambda pos: [999] * 16 if pos < start else text[pos : pos + 16], text, picked)
            own = next(i for i in range(start, len(drafted)) if drafted[i] == picked)
            assert own - start <= picked + 3 and 0 not in drafted[own:]


def poisoned(audit: bool) -> Controller:
    """An untimed controller (costs at their priors: k hangs on tokens alone) that believes every key worthless."""
    ctl = Controller(k_max=16, timed=False, audit=audit)
    ctl.priors = {key: (0.01, 1e6) for key in ctl.priors}
    ctl.prior_other = (0.01, 1e6)
    return ctl


def priced(target, prompt: list[int], ctl: Controller) -> tuple[float, list[int]]:
    """A greedy lookup generation under `ctl`: its steps priced by the controller's (untimed) cost table, and its
    tokens."""
    st, prices = Stats(), ctl.costs.verify_costs(40)
    steps = list(speculative_generate(GenerationConfig(target, PromptLookup(), controller=ctl, max_tokens=120),
                                      prompt, st))
    return sum(prices[s.drafted + 1] for s in steps if s.tokens), [t for s in steps for t in s.tokens]


def test_poisoned_priors_draft_as_well_as_the_best_fixed_length(target):
    """A prompt that the tiny model's greedy text echoes: lookup's drafts hold and long drafts pay. A controller
    told every key is worthless drafts nearly nothing by itself; audited, it makes at least 90% of the best fixed
    length's speed (its first MIN_STEPS steps undrafted), and the text is plain decoding's either way."""
    start = target.tokenize("The quick brown fox")
    prompt = start + tokens_of(GenerationConfig(target, None, max_tokens=150), start) + start
    plain = tokens_of(GenerationConfig(target, None, max_tokens=120), prompt)
    best = min(priced(target, prompt, Controller(k_max=k, k_min=k, adaptive=False, timed=False))[0]
               for k in LENGTHS)
    audited, text = priced(target, prompt, poisoned(audit=True))
    alone, text_alone = priced(target, prompt, poisoned(audit=False))
    assert text == text_alone == plain
    assert best / audited >= 0.9, (best, audited)
    assert best / alone < 0.6, (best, alone)  # the control: without the audit the poison costs most of it


def test_sampled_an_offers_match_with_the_text_is_what_drafting_it_keeps(target, lookup_prompt):
    """The audit's count is unbiased over samples too (core/audit.py; what research/audit_sampled.py's replays over
    samples rest on): at temperature 1, where lookup's offer after lookup_prompt holds about half the time a token,
    the audit's count for a fixed length k over plain decoding's samples (no draft, so min(k, how far the offer
    matched the text) + 1) and the tokens a first step drafting k of that offer really made agree in mean over 1,500
    seeds each, within 4 standard errors. The control: the same count over the greedy text instead (what a replay
    that ignored the sample would count) is far off."""
    import statistics

    from exactness import SAMPLING

    offer = PromptLookup().lookup(lookup_prompt, 16)[0]
    greedy = tokens_of(GenerationConfig(target, None, max_tokens=16), lookup_prompt)
    seeds, k, costs = range(1500), 3, Costs()  # one table: only the first run measures batches before its step
    assert len(offer) >= k

    def counted(text: list[int]) -> float:  # the audit's count for length k on one text
        audit = Audit(lengths=(k,))
        audit.choose(0, Known(offer), 16, lookup_prompt)
        audit.judge([*lookup_prompt, *text, -1], COSTS)  # (-1: the text ends where the offer could still hold)
        return audit.made[k]

    def first_step(seed: int) -> int:  # what drafting k of the offer made, really
        g = GenerationConfig(target, PromptLookup(), SAMPLING, Controller(k_max=k, k_min=k, adaptive=False,
                                                                       costs=costs),
                             max_tokens=k + 1, seed=seed)
        return len(next(iter(speculative_generate(g, lookup_prompt))).tokens)

    replayed = [counted(tokens_of(GenerationConfig(target, None, SAMPLING, max_tokens=k + 1, seed=10_000 + seed),
                                  lookup_prompt)) for seed in seeds]
    real = [first_step(seed) for seed in seeds]
    se = (statistics.variance(replayed) / len(seeds) + statistics.variance(real) / len(seeds)) ** 0.5
    gap = abs(statistics.mean(replayed) - statistics.mean(real))
    assert gap < 4 * se, (statistics.mean(replayed), statistics.mean(real), se)
    assert abs(counted(greedy) - statistics.mean(real)) > 10 * se  # the control


def test_the_rules_drafts_in_the_loop_keep_plain_decodings_text(target, monkeypatch):
    """In a real generation (the tiny model, a prompt its greedy text echoes), an audit whose only policy that can
    lead is llama-lookup's rule: its drafts are drafted and verified as the controller's are, some hold, and the
    text is plain decoding's."""
    import functools

    from spectool.generate import loop

    start = target.tokenize("The quick brown fox")
    prompt = start + tokens_of(GenerationConfig(target, None, max_tokens=150), start) + start
    plain = tokens_of(GenerationConfig(target, None, max_tokens=120), prompt)
    monkeypatch.setattr(loop, "Audit", functools.partial(Audit, margin=100.0, plain_margin=100.0, rule_margin=-0.9))
    ctl = poisoned(audit=True)  # drafts nothing by itself
    steps = list(speculative_generate(GenerationConfig(target, PromptLookup(), controller=ctl, max_tokens=120),
                                      prompt, Stats()))
    assert [t for s in steps for t in s.tokens] == plain
    assert sum(s.drafted for s in steps) > 20 and sum(s.accepted for s in steps) > 10
