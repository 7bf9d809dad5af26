"""Aggregation: best LR on validation, mean test ± t-based 95% CI, LR spread; checked by hand and on the paper."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybiphase.results.aggregate import best_lr, bootstrap_ci, lr_table, mean_ci, summarize, t_quantile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# The paper's SST-2 test accuracy (%) of four 610m models through the paper's protocol.
PAPER_SST2 = {
    "610m-mlm40-42k": (1e-4, 91.74, 0.35),
    "610m-clm-42k": (5e-5, 91.08, 0.56),
    "610m-clm-10k-mlm40-42k": (5e-5, 92.41, 0.55),
    "610m-clm-21k-mlm40-42k": (1e-4, 92.45, 0.53),
}


def _rows(run: str, lr: float, vals: list[float], tests: list[float], **extra) -> list[dict]:
    return [{"source": "raybiphase", "run": run, "pretrain_step": 100, "task": "t", "family": "SC", "lr": lr,
             "seed": seed, "val_score": v, "test_score": t, "stopped_early": math.isnan(t), **extra}
            for seed, (v, t) in enumerate(zip(vals, tests))]


@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423),
                                          (10_000, 1.9602)])
def test_t_quantile_matches_the_tables(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)


def test_t_quantile_matches_scipy_when_installed() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 3, 7, 29):
        for prob in (0.9, 0.95, 0.975, 0.995):
            assert t_quantile(prob, df) == pytest.approx(stats.t.ppf(prob, df), rel=1e-7)


def test_hand_computed_example() -> None:
    # LR 1e-4: val mean 0.82, test 0.72 ± ...; LR 1e-3: val mean 0.86 (best), test 0.90/0.92/0.94.
    # mean 0.92, std 0.02, CI = t(0.975, 2) * 0.02 / sqrt(3) = 4.302653 * 0.011547 = 0.049683.
    # LR spread: max - min = 0.92 - 0.72 = 0.20; population std of (0.72, 0.92) = 0.10.
    trials = pd.DataFrame(_rows("A", 1e-4, [0.80, 0.82, 0.84], [0.70, 0.72, 0.74])
                          + _rows("A", 1e-3, [0.85, 0.86, 0.87], [0.90, 0.92, 0.94]))
    row = summarize(trials).iloc[0]
    assert row["best_lr"] == 1e-3 and row["best_val_mean"] == pytest.approx(0.86)
    assert row["test_mean"] == pytest.approx(0.92) and row["test_std"] == pytest.approx(0.02)
    assert row["test_ci95"] == pytest.approx(0.049683, abs=1e-6)
    assert row["n_seeds"] == 3 and row["n_lrs"] == 2 and row["n_trials"] == 6
    assert row["lr_spread"] == pytest.approx(0.20) and row["lr_std"] == pytest.approx(0.10)
    assert row["family"] == "SC"


def test_asha_stopped_trials_are_left_out_of_the_means_and_their_lr_waits_for_completion() -> None:
    # LR 1e-3 lost a seed to ASHA (NaN scores): its means are over the 2 seeds that finished, and it is not chosen
    # on them: the completion pass finishes its stopped seed first, as it leads on what it has.
    trials = pd.DataFrame(_rows("A", 1e-4, [0.80, 0.80, 0.80], [0.70, 0.70, 0.70])
                          + _rows("A", 1e-3, [0.90, 0.92, math.nan], [0.91, 0.93, math.nan]))
    row = summarize(trials).iloc[0]
    assert row["best_lr"] == 1e-4 and row["n_seeds"] == 3 and row["n_stopped"] == 1
    assert row["test_mean"] == pytest.approx(0.70)
    assert best_lr(trials, complete_only=False) == 1e-3
    per_lr = lr_table(trials).set_index("lr")
    assert per_lr.loc[1e-3, "n_trials"] == 3 and per_lr.loc[1e-3, "n_seeds"] == 2
    assert per_lr.loc[1e-3, "test_mean"] == pytest.approx(0.92) and not per_lr.loc[1e-3, "complete"]


def test_a_stopped_trials_early_validation_never_picks_the_lr_and_the_fanout_agrees() -> None:
    # LR 1e-3: one finished seed (val 0.79) and one ASHA stopped at a lucky early 0.99; LR 1e-4: two finished, 0.80.
    stopped = {**_rows("A", 1e-3, [0.99], [math.nan])[0], "seed": 1}
    trials = pd.DataFrame(_rows("A", 1e-4, [0.80, 0.80], [0.70, 0.72]) + _rows("A", 1e-3, [0.79], [0.75]) + [stopped])
    assert summarize(trials).iloc[0]["best_lr"] == 1e-4
    assert best_lr(trials) == best_lr(trials.to_dict("records")) == 1e-4  # the fan-out's completion pass calls it
    assert best_lr([stopped]) is None


def test_lr_spread_rests_on_complete_cells_only() -> None:
    # 1e-5 and 1e-4: every seed finished (test 0.70 and 0.90). 1e-3: ASHA kept only its best seed (0.20): left out,
    # or the spread would say 0.70 from one lucky survivor of an LR whose other seeds were cut.
    trials = pd.DataFrame(_rows("A", 1e-5, [0.6] * 3, [0.70] * 3) + _rows("A", 1e-4, [0.8] * 3, [0.90] * 3)
                          + _rows("A", 1e-3, [0.5, math.nan, math.nan], [0.20, math.nan, math.nan]))
    row = summarize(trials).iloc[0]
    assert row["n_lrs"] == 3 and row["n_lrs_complete"] == 2
    assert row["lr_spread"] == pytest.approx(0.20) and row["lr_std"] == pytest.approx(0.10)
    one_complete = trials[trials["lr"] != 1e-5]
    assert math.isnan(summarize(one_complete).iloc[0]["lr_spread"])  # a spread needs two complete LRs


def test_ties_prefer_more_seeds_then_the_smaller_lr() -> None:
    trials = pd.DataFrame(_rows("A", 5e-4, [0.8, 0.8], [0.7, 0.7]) + _rows("A", 1e-4, [0.8, 0.8], [0.6, 0.6]))
    assert summarize(trials).iloc[0]["best_lr"] == 1e-4


def test_groups_by_source_run_checkpoint_and_task() -> None:
    trials = pd.DataFrame(_rows("A", 1e-4, [0.8, 0.8], [0.7, 0.7])
                          + _rows("A", 1e-4, [0.8, 0.8], [0.7, 0.7], pretrain_step=50)
                          + _rows("A", 1e-4, [0.8, 0.8], [0.7, 0.7], source="paper")
                          + _rows("A", 1e-4, [0.8, 0.8], [0.7, 0.7], task="u"))
    assert len(summarize(trials)) == 4


def test_single_seed_has_no_interval() -> None:
    result = mean_ci([0.9])
    assert result.mean == 0.9 and math.isnan(result.half_width) and result.n == 1
    assert mean_ci([math.nan]).n == 0


def test_the_papers_sst2_numbers() -> None:
    raw = pd.read_csv(FIXTURES / "sst2_610m.csv")
    trials = raw.rename(columns={"model": "run"}).assign(task=raw["dataset"], pretrain_step=42000, source="paper")
    summary = summarize(trials).set_index("run")
    assert set(summary.index) == set(PAPER_SST2)
    for run, (lr, mean, ci) in PAPER_SST2.items():
        row = summary.loc[run]
        assert row["best_lr"] == pytest.approx(lr)
        assert round(row["test_mean"] * 100, 2) == mean
        assert round(row["test_ci95"] * 100, 2) == ci
        assert row["n_seeds"] == 5 and row["n_lrs"] == 6
    # The paper's ordering on SST-2: biphasic > MLM > CLM.
    assert summary.loc["610m-clm-10k-mlm40-42k", "test_mean"] > summary.loc["610m-mlm40-42k", "test_mean"] \
        > summary.loc["610m-clm-42k", "test_mean"]


def test_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    rng = np.random.default_rng(0)
    per_seed = [(rng.random(872) < 0.9).astype(float) for _ in range(5)]
    low, high = bootstrap_ci(per_seed, seed=3)
    assert (low, high) == bootstrap_ci(per_seed, seed=3)
    mean = float(np.mean(per_seed))
    assert low < mean < high
    # About the binomial interval of 872 items averaged over 5 seeds: half-width near 1.96 * sqrt(.09 / 872 / 5)
    assert 0.5 * (high - low) == pytest.approx(1.96 * math.sqrt(0.09 / 872 / 5), rel=0.35)
    with pytest.raises(ValueError):
        bootstrap_ci([[1.0, 0.0], [1.0]])


def test_summary_bootstrap_columns_from_per_example_scores() -> None:
    rows = _rows("A", 1e-4, [0.8, 0.8], [0.75, 0.5])
    rows[0]["test_per_example"], rows[1]["test_per_example"] = [1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]
    row = summarize(pd.DataFrame(rows), bootstrap=True).iloc[0]
    assert row["test_boot_low"] <= row["test_mean"] <= row["test_boot_high"]


def test_token_classification_bootstraps_sentences_and_recomputes_corpus_f1() -> None:
    """Per-sentence [tp, predicted, gold] counts: the bootstrap redraws sentences and recomputes micro-F1, which is
    not the mean of per-sentence F1 (a 1-entity sentence would weigh as much as a 10-entity one)."""
    rng = np.random.default_rng(0)
    seeds = []
    for _ in range(3):
        gold = rng.integers(1, 10, 200)
        tp = rng.binomial(gold, 0.7)
        seeds.append([[int(t), int(t + rng.integers(0, 3)), int(g)] for t, g in zip(tp, gold)])
    corpus = [2 * sum(t for t, _, _ in s) / sum(p + g for _, p, g in s) for s in seeds]
    rows = [{"run": "r", "pretrain_step": 8, "task": "squad_bio", "lr": 1e-4, "seed": i, "val_score": 0.7,
             "test_score": f1, "metric": "entity_f1", "test_per_example": s} for i, (s, f1) in enumerate(zip(seeds, corpus))]
    row = summarize(pd.DataFrame(rows), bootstrap=True).iloc[0]
    assert row["test_boot_low"] < np.mean(corpus) < row["test_boot_high"] < 1.0
    perfect = [[[3, 3, 3]] * 50] * 3
    assert bootstrap_ci(perfect, metric="entity_f1") == (1.0, 1.0)
    assert bootstrap_ci(seeds, metric="entity_f1", seed=1) == bootstrap_ci(seeds, metric="entity_f1", seed=1)
