"""What the results layer sends to W&B: one run per (checkpoint, task) with its trials and best-LR summary, and the
report's tables and figures as one 'report' run (the run tracking itself is raybiphase.telemetry.wandb)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from raybiphase.results.aggregate import lr_table, summarize
from raybiphase.results.store import read_rows
from raybiphase.storage import FINETUNE_FILE, SUMMARY_FILE, join
from raybiphase.telemetry.wandb import finish, init_run, stable_id

TRIAL_COLUMNS = ("lr", "seed", "val_score", "test_score", "steps", "steps_run", "stopped_early",
                 "completed_after_stop", "diverged", "seconds")


def log_finetune_group(settings: dict | None, rows: list[dict]) -> str | None:
    """One W&B run per (checkpoint, task): a table of its trials (LR x seed) and, as the run's summary, the
    best LR with its test mean ± 95% CI (raybiphase.results.aggregate). Returns the run id."""
    if not settings or not rows:
        return None
    first = rows[0]
    name = f"{first['run']}@{first['pretrain_step']}|{first['task']}"
    config = {k: v for k, v in first.items() if "." in k or k in ("run", "pretrain_step", "task", "family", "metric")}
    run = init_run("finetune", name, settings["group"], config, settings["project"], rank=0,
                   mode=settings.get("mode"), sync_to=settings.get("sync_to"),
                   run_id=stable_id(settings["group"], "finetune", name))
    frame = pd.DataFrame(rows)
    run.log({"trials": _table(frame[[c for c in TRIAL_COLUMNS if c in frame]])})
    summary = summarize(frame)
    keep = ("best_lr", "best_val_mean", "test_mean", "test_ci95", "n_seeds", "n_trials", "n_stopped")
    run_id = run.id
    finish(run, {k: summary.iloc[0][k] for k in keep if len(summary) and k in summary})
    return run_id


def _table(frame):
    """A wandb.Table; lists and other non-scalars become strings (W&B tables hold scalars)."""
    import wandb  # lazy: an optional dependency, imported only when a project is set

    frame = frame.copy()
    for column in frame.columns:
        if frame[column].map(lambda v: isinstance(v, (list, tuple, dict)) or hasattr(v, "__array__")).any():
            frame[column] = frame[column].map(str)
    return wandb.Table(dataframe=frame)


def log_report(results_dir: str | os.PathLike, project: str | None, sweep: str) -> str | None:
    """Upload summary.parquet (and its per-LR table) and every PNG of RESULTS_DIR/report as one 'report' run.

    Returns the run's id, or None when no project is configured.
    """
    run = init_run("report", f"{sweep}-report", sweep, {"sweep.name": sweep}, project)
    if run is None:
        return None
    import wandb  # lazy: an optional dependency, imported only when a project is set

    payload: dict[str, Any] = {}
    summary = read_rows(join(results_dir, SUMMARY_FILE))
    if len(summary):
        payload["tables/summary"] = _table(summary)
    trials = read_rows(join(results_dir, FINETUNE_FILE))
    if len(trials):
        payload["tables/per_lr"] = _table(lr_table(trials))
    for png in sorted((Path(results_dir) / "report").glob("*.png")):
        payload[f"figures/{png.stem}"] = wandb.Image(str(png), caption=png.stem)
    if payload:
        run.log(payload)
    run_id = run.id
    run.finish()
    return run_id
