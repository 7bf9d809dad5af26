"""A diverged seed counts. It scores the metric's floor and stays in its LR's mean, an LR is chosen
only over all its seeds, and the LR spread includes it."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from raybiphase.results.aggregate import best_lr, bootstrap_ci, choose_best_lr, lr_table, summarize

FLOOR = 0.5  # a balanced binary task's majority-class accuracy


def _trials(cells: dict[float, list[tuple[float, float, bool]]]) -> pd.DataFrame:
    """{lr: [(val, test, diverged) per seed]} -> one group's rows."""
    return pd.DataFrame([{"run": "r", "pretrain_step": 8, "task": "t", "lr": lr, "seed": seed, "val_score": v,
                          "test_score": t, "diverged": d, "stopped_early": False}
                         for lr, seeds in cells.items() for seed, (v, t, d) in enumerate(seeds)])


def test_an_lr_where_most_seeds_diverged_is_not_chosen_on_its_lucky_seed():
    """The issue's constructed case: 5 seeds at 0.80 against 4 diverged and one at 0.85."""
    trials = _trials({1e-5: [(0.80, 0.80, False)] * 5,
                      5e-4: [(FLOOR, FLOOR, True)] * 4 + [(0.85, 0.85, False)]})
    (row,) = summarize(trials).to_dict("records")
    assert row["best_lr"] == 1e-5 and row["test_mean"] == pytest.approx(0.80) and row["n_seeds"] == 5
    assert row["n_diverged"] == 4 and row["n_diverged_best"] == 0
    per_lr = lr_table(trials).set_index("lr")
    assert per_lr.loc[5e-4, "n_seeds"] == 5 and per_lr.loc[5e-4, "test_mean"] == pytest.approx(0.57)


def test_a_diverged_seed_stays_in_the_lr_spread():
    trials = _trials({1e-5: [(0.8, 0.8, False)] * 3, 1e-3: [(0.8, 0.8, False)] * 2 + [(FLOOR, FLOOR, True)]})
    (row,) = summarize(trials).to_dict("records")
    assert row["n_lrs_complete"] == 2 and row["lr_spread"] == pytest.approx(0.1)


def test_an_lr_with_a_seed_missing_its_score_is_not_chosen():
    """ASHA stopped one seed (no test score) of the LR with the best finished seeds: the report waits for the
    completion pass rather than choose it on the seeds that survived; the pass itself asks for the leader."""
    trials = _trials({1e-5: [(0.7, 0.7, False)] * 2, 1e-3: [(0.9, 0.9, False), (0.3, math.nan, False)]})
    trials.loc[3, "stopped_early"] = True
    lrs = lr_table(trials)
    assert list(lrs["complete"]) == [True, False]
    assert best_lr(trials) == 1e-5
    assert best_lr(trials, complete_only=False) == 1e-3


def test_no_complete_lr_gives_no_score_rather_than_a_partial_one():
    trials = _trials({1e-5: [(0.7, 0.7, False), (0.3, math.nan, False)]})
    trials.loc[1, "stopped_early"] = True
    assert choose_best_lr(lr_table(trials)) is None
    (row,) = summarize(trials).to_dict("records")
    assert math.isnan(row["test_mean"]) and row["n_seeds"] == 0


def test_the_lr_sensitivity_figure_draws_complete_cells_only_and_says_so():
    """Finding 2's figure is not drawn from ASHA's survivors."""
    from raybiphase.results import report

    trials = pd.concat([_trials({1e-5: [(0.8, 0.8, False)] * 2, 1e-3: [(0.9, 0.9, False), (0.2, math.nan, False)]})
                        .assign(run=run) for run in ("a", "b")])
    trials.loc[trials["test_score"].isna(), "stopped_early"] = True
    trials = trials.assign(source="raybiphase", family="SC", metric="accuracy", dataset="t")
    summary = summarize(trials).assign(final=True, objective="MLM", clm_share=0.0)
    section = report.lr_section(summary, trials)
    assert "1 incomplete cell(s) left out" not in section.note and "2 incomplete cell(s) left out" in section.note
    drawn = [line for axes in section.figure.axes for line in axes.get_lines()]
    assert drawn and all(list(line.get_xdata()) == [1e-5] for line in drawn)


def test_the_papers_spec_completes_every_cell():
    from raybiphase.config import SweepSpec
    from raybiphase.config.load import load

    finetune = load(SweepSpec, "sweeps/paper.yaml").finetune
    assert finetune.complete_lrs


def _with_per_example(entries: list[list], task: str, metric: str) -> pd.DataFrame:
    """One LR, a seed per entry list, the last seed diverged; scores from the entries."""
    from raybiphase.finetune.scoring import corpus_score

    trials = _trials({1e-4: [(0.9, corpus_score(metric, e), i == len(entries) - 1) for i, e in enumerate(entries)]})
    return trials.assign(task=task, metric=metric, test_per_example=entries)


@pytest.mark.parametrize("task, metric, trained, labels", [
    ("squad_v2", "f1", [1.0] * 12, [["x"], [], ["y"], []] * 3),
    ("squad_bio", "entity_f1", [[1, 1, 1], [2, 2, 2], [0, 0, 0], [1, 1, 1]] * 3, [1, 2, 0, 1] * 3),
])
def test_a_bootstrap_counts_every_seed_a_diverged_one_at_its_floor(task, metric, trained, labels):
    """The diverged seed's floor has an entry per test example (the no-answer F1 of each question, the gold entity
    counts of each sentence), so the bootstrap interval is over all three seeds: around their mean, below the
    interval of the two that trained."""
    from raybiphase.finetune.baselines import floor_of
    from raybiphase.finetune.tasks import TaskSplits, get_task

    if metric == "f1":
        test = [{"id": str(i), "question": "q", "context": "c", "answers": {"text": a, "answer_start": [0] * len(a)}}
                for i, a in enumerate(labels)]
    else:
        test = [{"words": ["w"] * max(n, 1), "tags": ["B-ANS"] * n + ["O"] * (n == 0)} for n in labels]
    floor = floor_of(get_task(task), TaskSplits(train=[], val=test, test=test))
    (row,) = summarize(_with_per_example([trained, trained, floor["test_per_example"]], task, metric),
                       bootstrap=True).to_dict("records")
    assert row["n_seeds"] == 3 and row["n_diverged_best"] == 1
    assert row["test_boot_low"] - 1e-9 <= row["test_mean"] <= row["test_boot_high"] + 1e-9
    assert row["test_boot_high"] < bootstrap_ci([trained, trained], metric=metric)[0]  # the trained seeds alone


def test_a_seed_without_per_example_scores_leaves_the_bootstrap_out_rather_than_the_seed():
    """Rows recorded before a diverged trial kept its floor's entries: no interval over the seeds that have some."""
    trials = _with_per_example([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], []], "squad_v2", "f1")
    trials.loc[2, "test_score"] = 0.0
    (row,) = summarize(trials, bootstrap=True).to_dict("records")
    assert row["n_seeds"] == 3 and math.isnan(row.get("test_boot_low", math.nan))
