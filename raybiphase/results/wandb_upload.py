"""What the results layer sends to W&B: one run per (checkpoint, task) with its trials and best-LR summary, and the
report's tables and figures as one 'report' run (the run tracking itself is raybiphase.telemetry.wandb)."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd

from raybiphase.results.aggregate import lr_table, summarize
from raybiphase.results.rows import trial_key
from raybiphase.results.store import read_rows
from raybiphase.storage import FINETUNE_FILE, SUMMARY_FILE, join
from raybiphase.telemetry.wandb import clean_config, finish, init_run, stable_id

TRIAL_COLUMNS = ("lr", "seed", "val_score", "test_score", "steps", "steps_run", "stopped_early",
                 "completed_after_stop", "diverged", "seconds")


def group_name(row: dict) -> str:
    """The W&B run name of a fine-tuning row's (checkpoint, task): `<run>@<step>|<task>`."""
    return f"{row['run']}@{row['pretrain_step']}|{row['task']}"


def _group_config(first: dict) -> dict:
    return {k: v for k, v in first.items() if "." in k or k in ("run", "pretrain_step", "task", "family", "metric")}


def _group_run(settings: dict, first: dict):
    name = group_name(first)
    return init_run("finetune", name, settings["group"], _group_config(first), settings["project"], rank=0,
                    mode=settings.get("mode"), sync_to=settings.get("sync_to"),
                    run_id=stable_id(settings["group"], "finetune", name))


def log_finetune_group(settings: dict | None, rows: list[dict], run=None) -> str | None:
    """One W&B run per (checkpoint, task): a table of its trials (LR x seed) and, as the run's summary, the
    best LR with its test mean ± 95% CI (raybiphase.results.aggregate); `run`: the group's run when it is open
    already (`FinetuneLog`). Finishes the run and returns its id."""
    if not settings or not rows:
        return None
    if run is None:
        run = _group_run(settings, rows[0])
    else:  # opened by a trial's row: the group's settings as recorded
        run.config.update(clean_config(_group_config(rows[0])), allow_val_change=True)
    frame = pd.DataFrame(rows)
    run.log({"trials": _table(frame[[c for c in TRIAL_COLUMNS if c in frame]])})
    summary = summarize(frame)
    keep = ("best_lr", "best_val_mean", "test_mean", "test_ci95", "n_seeds", "n_trials", "n_stopped")
    run_id = run.id
    finish(run, {k: summary.iloc[0][k] for k in keep if len(summary) and k in summary})
    return run_id


class FinetuneLog:
    """Fine-tuning as it happens: `trial(rows)` logs each row of a trial that just ended to its (checkpoint, task)
    run (`trial/lr`, `trial/seed`, `trial/val_score`, ...: one point per trial), opened on its first trial;
    `groups(rows, new)` then logs each group's table and summary (`log_finetune_group`) and closes every run.
    Without settings every call is a no-op."""

    def __init__(self, settings: dict | None):
        self.settings, self.runs = settings, {}

    def trial(self, rows: list[dict]) -> None:
        if not self.settings:
            return
        for row in rows:
            name = group_name(row)
            if name not in self.runs:
                self.runs[name] = _group_run(self.settings, row)
            self.runs[name].log({f"trial/{k}": row[k] for k in TRIAL_COLUMNS
                                 if isinstance(row.get(k), (int, float))})

    def groups(self, rows: list[dict], new: set) -> None:
        """The table and summary of every group with a row in `new` (trial keys), then every run closed."""
        groups = defaultdict(list)
        for row in rows:
            groups[group_name(row)].append(row)
        for name, group in groups.items():
            if self.settings and any(trial_key(r) in new for r in group):
                log_finetune_group(self.settings, group, run=self.runs.pop(name, None))
        for run in self.runs.values():
            finish(run)
        self.runs.clear()


def _table(frame):
    """A wandb.Table; lists and other non-scalars become strings (W&B tables hold scalars)."""
    import wandb  # lazy: an optional dependency, imported only when a project is set

    frame = frame.copy()
    for column in frame.columns:
        if frame[column].map(lambda v: isinstance(v, (list, tuple, dict)) or hasattr(v, "__array__")).any():
            frame[column] = frame[column].map(str)
    return wandb.Table(dataframe=frame)


def log_report(results_dir: str | os.PathLike, project: str | None, sweep: str, *,
               entity: str | None = None) -> str | None:
    """Upload summary.parquet (and its per-LR table) and every PNG of RESULTS_DIR/report as one 'report' run, the
    same W&B run on every call (a stable id, continued); offline, its folder is copied to RESULTS_DIR/wandb/.

    Returns the run's id, or None when no project is configured. `entity`: W&B's default entity when None.
    """
    name = f"{sweep}-report"
    run = init_run("report", name, sweep, {"sweep.name": sweep}, project, rank=0,
                   sync_to=join(results_dir, "wandb"), run_id=stable_id(sweep, "report", name), entity=entity)
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
    finish(run)
    return run_id
