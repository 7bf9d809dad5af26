"""The report's questions beyond the paper: each run with a knob is paired with the run that differs
from it only by not having it, and each question is one effect in the claim's direction with its 95% interval over
fine-tuning seeds, shown and never decided on (pretraining noise unmeasured); runs with knobs stay out of the paper's
findings."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from raybiphase.results.aggregate import t_quantile
from raybiphase.results.questions import QUESTIONS, beyond_sections, knobs, question_pairs, question_verdict
from raybiphase.results.stats.rules import NO_REPLICATES

BY_NAME = {q.name: q for q in QUESTIONS}
TASKS = (("tweets", "SC"), ("squad", "QA"))


def _row(run: str, task: str, family: str, score: float, *, ci: float = 1.0, objective: str = "MLM",
         init: str | None = None) -> dict:
    return {"source": "raybiphase", "run": run, "objective": objective, "task": task, "family": family,
            "score": score, "ci": ci, "n_seeds": 3, "budget": 800, "mask_ratio": 0.4, "pretrain_step": 800,
            "final": True, "init_from": init}


def _summary(scores: dict[str, tuple[float, float]], ci: float = 1.0) -> pd.DataFrame:
    """Rows for `run: (tweets score, squad score)`; continued runs (`-dec`) get an init_from."""
    return pd.DataFrame([
        _row(run, task, family, pair[i], ci=ci, init="@tiny-clm-800" if "-dec" in run else None)
        for run, pair in scores.items() for i, (task, family) in enumerate(TASKS)])


@pytest.mark.parametrize("run, expected", [
    ("tiny-clm-400-mlm40r-800-a1b2c3", "optimizer_reset"),
    ("tiny-mlm40to15-800-a1b2c3", "ratio_schedule"),
    ("tiny-mlmu15to60-800-a1b2c3", "uniform_rate"),
    ("tiny-clm-dec800-mntp40-1.2k-a1b2c3", "mntp"),
    ("tiny-clm-400-mlm40f1-800-a1b2c3", "frozen_layers"),
    ("tiny-clm-400-mlm40to15r-800-a1b2c3", "optimizer_reset,ratio_schedule"),
    ("tiny-clm-400-mlm40-800-a1b2c3", ""),
    ("tiny-clm-dec800-mlm40-1.2k-a1b2c3", ""),
    ("majority", ""),
])
def test_a_runs_knobs_are_read_from_its_name(run, expected):
    assert knobs(run) == expected


def test_each_question_pairs_a_run_with_the_one_that_only_lacks_its_knob():
    s = _summary({
        "tiny-clm-400-mlm40-800-aaaaaa": (60, 60), "tiny-clm-400-mlm40r-800-bbbbbb": (65, 64),  # reset: +4.5
        "tiny-mlm40-800-cccccc": (70, 70), "tiny-mlm40to15-800-dddddd": (66, 71),  # schedule: mixed/undecided
        "tiny-mlm20-800-eeeeee": (72, 50), "tiny-mlmu15to60-800-ffffff": (69, 75),  # uniform vs the best fixed
        "tiny-clm-dec800-mlm40-1.2k-111111": (62, 62), "tiny-clm-dec800-mntp40-1.2k-222222": (58, 57),
        "tiny-clm-400-mlm40f1-800-333333": (55, 55),
    })
    pairs = {q.name: question_pairs(s, q) for q in QUESTIONS}

    reset = pairs["optimizer_reset"]
    assert list(reset["counterpart"]) == ["tiny-clm-400-mlm40-800-aaaaaa"] * 2
    half = t_quantile(0.975, 8) * math.sqrt(2 * 2 * (0.5 / t_quantile(0.975, 2)) ** 2)  # 4 cells of 2 seeds' df
    assert question_verdict(reset, BY_NAME["optimizer_reset"]) == (  # seeds only: shown, never decided
        NO_REPLICATES, f"+4.50 pts [{4.5 - half:+.2f}, {4.5 + half:+.2f}] over 2 task(s), 2 pairs (fine-tuning "
        "seeds only, pretraining noise ignored)")

    schedule = pairs["ratio_schedule"]  # tweets: fixed wins; squad: overlap
    assert set(schedule["counterpart"]) == {"tiny-mlm40-800-cccccc"} and list(schedule["better"]) == ["b", "overlap"]
    assert question_verdict(schedule, BY_NAME["ratio_schedule"])[1].startswith("-")

    uniform = pairs["uniform_rate"]  # against the best fixed rate per task: 20% on tweets, 40% on squad
    assert list(uniform["counterpart"]) == ["tiny-mlm20-800-eeeeee", "tiny-mlm40-800-cccccc"]
    assert list(uniform["better"]) == ["b", "a"]
    assert question_verdict(uniform, BY_NAME["uniform_rate"])[1].startswith("+1.00 pts")  # -3 and +5, ± 0.3

    mntp = pairs["mntp"]  # continued from the same CLM checkpoint
    assert set(mntp["counterpart"]) == {"tiny-clm-dec800-mlm40-1.2k-111111"}
    assert question_verdict(mntp, BY_NAME["mntp"])[1].startswith("-")

    frozen = pairs["frozen_layers"]  # the claim is that every block training wins (side b)
    assert set(frozen["counterpart"]) == {"tiny-clm-400-mlm40-800-aaaaaa"}
    assert question_verdict(frozen, BY_NAME["frozen_layers"])[1].startswith("+")  # the claim's direction
    assert {question_verdict(p, BY_NAME[n])[0] for n, p in pairs.items()} == {NO_REPLICATES}


def test_overlapping_or_missing_intervals_leave_a_question_not_resolved():
    s = _summary({"tiny-clm-400-mlm40-800-aaaaaa": (60, 60), "tiny-clm-400-mlm40r-800-bbbbbb": (61, 59)}, ci=5.0)
    pairs = question_pairs(s, BY_NAME["optimizer_reset"])
    assert question_verdict(pairs, BY_NAME["optimizer_reset"])[0].startswith("not resolved")
    lonely = _summary({"tiny-mlmu15to60-800-ffffff": (69, 75)})  # no fixed-rate run to compare with
    assert question_pairs(lonely, BY_NAME["uniform_rate"]).empty
    assert question_verdict(question_pairs(lonely, BY_NAME["uniform_rate"]), BY_NAME["uniform_rate"]) == (
        "not resolved", "nothing to compare in this sweep")


def test_runs_with_knobs_stay_out_of_the_papers_findings():
    """A decayed-ratio MLM run scoring far above CLM would otherwise decide finding 1 (MLM beats CLM)."""
    from raybiphase.results.report import findings_section

    rows = pd.DataFrame([_row("tiny-clm-800-aaaaaa", "tweets", "SC", 60, objective="CLM"),
                         _row("tiny-mlm40to15-800-bbbbbb", "tweets", "SC", 90)])
    table = findings_section(rows.assign(knobs=rows["run"].map(knobs))).table
    assert "| 1. MLM beats CLM on sequence classification and QA (effect: MLM - CLM) | not resolved | nothing to " \
           "compare" in table


def test_the_report_has_a_section_per_question_the_sweep_answers():
    s = _summary({"tiny-clm-400-mlm40-800-aaaaaa": (60, 60), "tiny-clm-400-mlm40r-800-bbbbbb": (65, 64)})
    (section,) = beyond_sections(s)
    assert section.name == "beyond_optimizer_reset" and f"Verdict: **{NO_REPLICATES}**" in section.note
    assert "| tweets | SC | tiny-clm-400-mlm40r-800-bbbbbb | 65.00 ± 1.00 | tiny-clm-400-mlm40-800-aaaaaa |" in section.table
    assert beyond_sections(_summary({"tiny-clm-400-mlm40-800-aaaaaa": (60, 60)})) == []
