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


def feed(audit: Audit, offers, text: list[int], picked: int, costs: list[float] = COSTS) -> list[int]:
    """Steps over `text` (one token a step), each offering `offers(pos)`; the lengths the audit drafted."""
    drafted = []
    for pos in range(len(text) - 20):
        offer = offers(pos)
        drafted.append(audit.length(picked, offer, 16, pos))
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


def test_a_step_is_judged_only_once_the_text_has_passed_it():
    audit = Audit()
    audit.length(0, [1, 2, 3], 16, 0)
    audit.judge([1, 2], COSTS)  # 2 of 3 known, all right so far: not yet judged
    assert audit.steps == 0
    audit.judge([1, 2, 3], COSTS)
    assert audit.steps == 1 and audit.made[3] == 4 and audit.made[1] == 2 and audit.ours == [1.0, COSTS[1]]
    audit.length(0, [7, 8], 16, 3)
    audit.judge([1, 2, 3, 5], COSTS)  # wrong at once: judged as soon as that shows
    assert audit.steps == 1.0 * audit.decay + 1


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
