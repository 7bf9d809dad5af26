"""The decision rule behind every finding's verdict (docs/statistics.md, "The rule").

A test is two-sided at 5%, its claimed direction fixed in advance; the tests of one finding (one per size, or per
trend) are adjusted together by Holm's step-down procedure, so a finding claims an effect that is not there in at
most 5% of studies when the model's assumptions hold. tests/results/test_calibration.py checks the rate by
simulation: many studies with a known truth.
"""

from __future__ import annotations

from collections.abc import Sequence

from raybiphase.results.stats.effects import ALPHA, Effect

HELD, NOT_HELD, MIXED, UNRESOLVED = "held", "not held", "mixed", "not resolved"

NO_REPLICATES = f"{UNRESOLVED} (no replicated arm: pretraining noise not measured)"
"""The decision of a test whose interval counts fine-tuning seeds only. Such intervals ignore the spread between
pretraining runs, which at the paper's scale is larger: simulated with no true effect and 5 seeds, some finding
"held" in nearly every study (tests/results/test_calibration.py). They are shown, never decided on."""


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def holm(effects: Sequence[Effect | None], alpha: float = ALPHA) -> list[bool]:
    """Which effects are significant under Holm's step-down procedure at familywise level `alpha` (None: never)."""
    order = sorted((e.p_value, i) for i, e in enumerate(effects) if e is not None)
    significant = [False] * len(effects)
    for rank, (p, i) in enumerate(order):
        if p > alpha / (len(order) - rank):
            break
        significant[i] = True
    return significant


def holm_levels(effects: Sequence[Effect | None], alpha: float = ALPHA) -> list[float]:
    """The error level each effect's decision uses under Holm's step-down (`holm`): alpha / (m - r) for the test of
    rank r (smallest p first) up to the first that is not significant, whose level every later test keeps. An
    interval at its test's level excludes zero exactly when the test is significant, so the interval printed
    beside a decision is the one the decision uses. (None effects: alpha.)"""
    order = sorted((e.p_value, i) for i, e in enumerate(effects) if e is not None)
    levels, stopped = [alpha] * len(effects), None
    for rank, (p, i) in enumerate(order):
        level = alpha / (len(order) - rank)
        if stopped is None and p > level:
            stopped = level
        levels[i] = level if stopped is None else stopped
    return levels


def decide(effects: Sequence[Effect | None], alpha: float = ALPHA) -> list[str]:
    """Per effect (its claimed direction positive): HELD when significant and positive, NOT_HELD when significant
    and negative, UNRESOLVED otherwise; the effects are one family for Holm's adjustment."""
    return [UNRESOLVED if not s else HELD if e.estimate > 0 else NOT_HELD
            for e, s in zip(effects, holm(effects, alpha))]


def combine(decisions: Sequence[str]) -> str:
    """A finding's verdict from its tests' decisions: HELD when some test holds and none goes the other way,
    NOT_HELD the reverse, MIXED when both happen, UNRESOLVED when no test clears the rule."""
    held, against = HELD in decisions, NOT_HELD in decisions
    return MIXED if held and against else HELD if held else NOT_HELD if against else UNRESOLVED


PARTLY = "partly held"


def conjoin(parts: Sequence[str]) -> str:
    """The verdict of a claim that is two statements at once (the paper's "A and B") from each part's `combine`d
    verdict: HELD only when every part holds, NOT_HELD when some part goes the other way and none holds, MIXED
    when parts go both ways (or one is mixed), PARTLY when some hold and the rest are not resolved, UNRESOLVED
    when none is resolved."""
    if MIXED in parts or (HELD in parts and NOT_HELD in parts):
        return MIXED
    if all(p == HELD for p in parts):
        return HELD
    return NOT_HELD if NOT_HELD in parts else PARTLY if HELD in parts else UNRESOLVED
