"""A t-interval never passes the metric's range: three seeds at 100, 100 and 70 give 90 ± 43, and the summary,
the printed cells and the drawn bars stop at 100 (the t-interval clipped to [0, 100] points)."""

from __future__ import annotations

import pandas as pd
import pytest

from raybiphase.results.aggregate import lr_table, summarize
from raybiphase.results.tables import error_bars, mean_ci


def _trials() -> pd.DataFrame:
    """Two runs, two LRs, three seeds each: at every LR 1.0, 1.0 and 0.7 on the test split."""
    return pd.DataFrame([{"source": "raybiphase", "run": run, "pretrain_step": 8, "task": "tweets", "family": "SC",
                          "metric": "accuracy", "dataset": "t", "lr": lr, "seed": seed, "val_score": 0.8 + lr,
                          "test_score": test, "stopped_early": False, "diverged": False}
                         for run in ("a", "b") for lr in (1e-5, 1e-3) for seed, test in enumerate((1.0, 1.0, 0.7))])


def test_the_summary_clips_the_interval_to_the_metrics_range():
    (row, _) = summarize(_trials()).to_dict("records")
    assert row["test_mean"] == pytest.approx(0.9) and row["test_mean"] + row["test_ci95"] > 1.3
    assert row["test_ci_high"] == 1.0 and row["test_ci_low"] == pytest.approx(row["test_mean"] - row["test_ci95"])
    per_lr = lr_table(_trials())
    assert (per_lr["test_ci_high"] == 1.0).all()


def test_a_printed_interval_past_the_range_shows_its_clipped_ends():
    assert mean_ci(91.74, 0.35, 5) == "91.74 ± 0.35"  # inside: the paper's own form
    assert mean_ci(90.0, 43.0, 3) == "90.00 [47.00, 100.00]"
    assert mean_ci(4.0, 6.5, 3) == "4.00 [0.00, 10.50]"


def test_a_drawn_bar_stops_at_100():
    below, above = error_bars(pd.Series([90.0, 50.0, 60.0]), pd.Series([43.0, 5.0, float("nan")]))
    assert below == pytest.approx([43.0, 5.0, 0.0]) and above == pytest.approx([10.0, 5.0, 0.0])
    from raybiphase.results import report

    summary = summarize(_trials()).assign(final=True, objective="MLM", clm_share=0.0)
    figure = report.lr_section(summary, _trials()).figure
    tops = [max(y for segment in bars.get_segments() for _, y in segment)
            for axes in figure.axes for container in axes.containers for bars in container.lines[2]]
    assert tops and max(tops) == pytest.approx(100.0)
