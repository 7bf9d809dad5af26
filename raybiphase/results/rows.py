"""Result rows, built here and nowhere else: one per pretraining report, one per fine-tuning trial or baseline.

Every row carries the run's settings as dotted columns (`config_columns`: `phases.mask_ratio`, `model.size`, ...),
with the phases resolved: `phases.clm_share` and `phases.clm_steps` hold the run's actual CLM share and steps
whichever way its phases were written. (run, pretrain_step) stay two fields from the planner to the Parquet file.

    pretrain   run, sweep, segment, step, tokens_seen, phase, objective, train/{clm,mlm}_loss, val/{clm,mlm}_loss,
               lr, tokens_per_s, mfu (GPU), checkpoint ("" when none), the dotted settings      key PRETRAIN_KEY
    finetune   run, pretrain_step, sweep, source, checkpoint, task, family, dataset, metric, lr, seed, val_score,
               test_score, steps, stopped_early, seconds, test_per_example, secondary_metric, test_secondary,
               steps_run, completed_after_stop, the dotted settings                            key FINETUNE_KEY
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from raybiphase.config import RunConfig, flatten

PRETRAIN_KEY = ("run", "step")
FINETUNE_KEY = ("run", "pretrain_step", "task", "lr", "seed", "source")
TRIAL_KEY = ("run", "pretrain_step", "task", "lr", "seed")
OURS, PAPER, BASELINE = "raybiphase", "paper", "baseline"
"""Values of the `source` column: our trials, the authors' imported ones, baselines (BM25)."""


def config_columns(run: RunConfig) -> dict[str, Any]:
    """The run's settings as dotted columns (lists as text), the phases resolved."""
    columns = {k: (str(v) if isinstance(v, (list, dict)) else v) for k, v in flatten(run).items()}
    phases = run.phases.resolved()
    columns["phases.clm_share"] = run.clm_share
    columns["phases.clm_steps"] = sum(p.steps for p in phases if p.objective == "clm")
    return columns


def pretrain_row(run: str, config: RunConfig, *, sweep: str, segment: str, report: dict[str, Any]) -> dict[str, Any]:
    """A run's row for one report of a segment it passes through."""
    row = {"run": run, "sweep": sweep, "segment": segment, **config_columns(config)}
    row.update({k: v for k, v in report.items() if not isinstance(v, (dict, list))})
    row.setdefault("checkpoint", "")
    return row


@dataclass(frozen=True)
class FinetuneSource:
    """A checkpoint to fine-tune: run `run` at step `pretrain_step`, its HF folder, its dotted settings."""

    run: str
    pretrain_step: int
    hf_dir: str
    columns: dict[str, Any] = field(default_factory=dict)


def trial_row(source: FinetuneSource, *, task, lr: float, seed: int, sweep: str) -> dict[str, Any]:
    """The planned part of a trial's row (raybiphase.finetune.tasks.Task `task`): what it will be known by."""
    return {"run": source.run, "pretrain_step": int(source.pretrain_step), "sweep": sweep, "source": OURS,
            "checkpoint": source.hf_dir, "task": task.name, "family": task.family, "dataset": task.dataset,
            "metric": task.metric, "secondary_metric": task.secondary_metric, "lr": float(lr), "seed": int(seed),
            **source.columns}


def trial_key(row: dict[str, Any]) -> tuple:
    return (str(row["run"]), int(row["pretrain_step"]), str(row["task"]), float(row["lr"]), int(row["seed"]))


def finished_row(planned: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """A trial that ran to its end (raybiphase.finetune.trial.run_trial's result)."""
    return {**planned, **result, "stopped_early": False, "steps_run": result["steps"], "completed_after_stop": False}


def stopped_row(planned: dict[str, Any], *, val_score: float, step: int, seconds: float) -> dict[str, Any]:
    """A trial ASHA stopped at `step`: its last validation score, no test score."""
    return {**planned, "val_score": val_score, "test_score": math.nan, "steps": step, "seconds": seconds,
            "test_per_example": [], "test_secondary": math.nan, "stopped_early": True, "steps_run": step,
            "completed_after_stop": False}


def completed_row(stopped: dict[str, Any], rerun: dict[str, Any]) -> dict[str, Any]:
    """A stopped trial run again to its end: the second run's scores, the work of both attempts."""
    return {**rerun, "steps_run": stopped["steps_run"] + rerun["steps"],
            "seconds": stopped["seconds"] + rerun["seconds"], "completed_after_stop": True}


def baseline_row(scores: dict[str, Any], *, run: str, family: str, sweep: str) -> dict[str, Any]:
    """A baseline's row (BM25: `run="bm25"`) on a task's test split; its key is fixed, so it is appended once."""
    return {**scores, "run": run, "pretrain_step": 0, "lr": 0.0, "seed": 0, "family": family, "source": BASELINE,
            "sweep": sweep, "val_score": math.nan, "steps": 0, "stopped_early": False, "seconds": 0.0,
            "checkpoint": ""}
