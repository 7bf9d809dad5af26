"""Result rows as typed records: one per pretraining report, one per fine-tuning trial (built from the trial's spec
and result, raybiphase.finetune.spec) or baseline. `record()` flattens a row into the Parquet row (and the JSON
record a fine-tuning trial leaves).

Every row carries the run's settings as dotted columns (`config_columns`: `phases.mask_ratio`, `model.size`, ...),
with the phases resolved: `phases.clm_share` and `phases.clm_steps` hold the run's actual CLM share and steps
whichever way its phases were written. (run, pretrain_step) stay two fields from the planner to the Parquet file.

    pretrain   run, sweep, segment, step, tokens_seen, phase, objective, train/{clm,mlm}_loss, val/{clm,mlm}_loss,
               lr, tokens_per_s, workers, mfu (GPU), data_epochs, checkpoint ("" when none), the dotted settings
                                                                                                key PRETRAIN_KEY
    finetune   run, pretrain_step, sweep, source, checkpoint, task, family, dataset, metric, lr, seed, val_score,
               test_score, steps, stopped_early, seconds, test_per_example, secondary_metric, test_secondary,
               steps_run, completed_after_stop, trials_of, diverged, finetune_settings, train_data, the dotted
               settings                                                                         key FINETUNE_KEY
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from raybiphase.config import RunConfig, flatten

PRETRAIN_KEY = ("run", "step")
FINETUNE_KEY = ("run", "pretrain_step", "task", "lr", "seed", "source")
TRIAL_KEY = ("run", "pretrain_step", "task", "lr", "seed")
OURS, PAPER, BASELINE, HUB = "raybiphase", "paper", "baseline", "hub"
"""Values of the `source` column: our trials, the authors' imported ones, baselines (BM25)."""


def config_columns(run: RunConfig) -> dict[str, Any]:
    """The run's settings as dotted columns (lists as text), the phases resolved; an elastic `resources.num_workers`
    [min, max] as its max, so the column stays a number when a sweep switches to a range and appends to the same
    files (a pretraining row's `workers` says how many trained its step)."""
    columns = {k: (str(v) if isinstance(v, (list, dict)) else v) for k, v in flatten(run).items()}
    columns["resources.num_workers"] = run.resources.max_workers
    phases = run.phases.resolved()
    columns["phases.clm_share"] = run.clm_share
    columns["phases.clm_steps"] = sum(p.steps for p in phases if p.objective == "clm")
    return columns


@dataclass(frozen=True, kw_only=True)
class PretrainRow:
    """One report of a run at a step of a segment it passes through."""

    run: str
    """The run's name (its settings' hash ends it)."""
    sweep: str
    """The sweep's name (sweep.name)."""
    segment: str
    """The planner's shared segment that trained this step (one segment serves every run sharing those steps)."""
    step: int
    """The pretraining step of the report."""
    metrics: dict[str, Any]
    """The report's metrics (raybiphase.telemetry.metrics.PretrainReport: tokens_seen, phase, objective, train/ and
    val/ losses, lr, tokens_per_s, workers, data_epochs, ...), a column each."""
    checkpoint: str = ""
    """The checkpoint written with this report; "" when none."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The run's dotted settings (config_columns)."""

    def record(self) -> dict[str, Any]:
        metrics = {k: v for k, v in self.metrics.items() if not isinstance(v, (dict, list)) and k != "checkpoint"}
        return {"run": self.run, "sweep": self.sweep, "segment": self.segment, **self.settings, **metrics,
                "step": self.step, "checkpoint": self.checkpoint}


def pretrain_row(run: str, config: RunConfig, *, sweep: str, segment: str, report: dict[str, Any]) -> PretrainRow:
    """A run's row for one report (a history entry) of a segment it passes through."""
    return PretrainRow(run=run, sweep=sweep, segment=segment, step=int(report["step"]), metrics=report,
                       checkpoint=report.get("checkpoint", ""), settings=config_columns(config))


def control_columns(config: RunConfig) -> dict[str, Any]:
    """An untrained control's columns: its model, data and seed settings; no phases (it saw no step)."""
    columns = config_columns(config)
    for key in [k for k in columns if k.startswith(("phases.", "optim."))]:
        columns[key] = None
    columns.update({"phases.steps": 0, "phases.clm_steps": 0, "phases.clm_share": math.nan})
    return columns


@dataclass(frozen=True, kw_only=True)
class FinetuneRow:
    """One fine-tuning trial (or baseline): planned, then finished, stopped by ASHA, or completed after a stop."""

    run: str
    """The pretraining run whose checkpoint was fine-tuned (or the baseline: bm25)."""
    pretrain_step: int
    """The checkpoint's pretraining step (0 for an untrained control or a baseline)."""
    task: str
    """The fine-tuning task (raybiphase.finetune.tasks)."""
    lr: float
    """The fine-tuning learning rate."""
    seed: int
    """The fine-tuning seed."""
    source: str = OURS
    """raybiphase (our trials), paper (the authors' imported ones), baseline (BM25, the majority class) or hub (a
    public encoder fine-tuned on our protocol: finetune.baselines; run is its Hub id, checkpoint its id@commit)."""
    sweep: str = ""
    """The sweep's name (sweep.name)."""
    checkpoint: str = ""
    """The HF folder that was fine-tuned."""
    family: str = ""
    """The task's family: SC, TC, QA or IR."""
    dataset: str = ""
    """The task's dataset."""
    metric: str = ""
    """The metric val_score and test_score hold (accuracy, entity_f1, f1, ndcg@10...)."""
    secondary_metric: str | None = None
    """The metric test_secondary holds, if the task has one."""
    val_score: float = math.nan
    """The validation score the best LR is chosen on."""
    test_score: float = math.nan
    """Fractions in [0, 1]; NaN when ASHA stopped the trial (its test split is never scored)."""
    test_secondary: float = math.nan
    """The secondary metric on the test split; NaN when none."""
    test_per_example: list = field(default_factory=list)
    """One flat list of floats in every row, so one Parquet column holds every family: entity F1's per-sentence
    [true positives, predicted, gold] counts lie in it as consecutive triples (`per_example_flat`)."""
    steps: int = 0
    """Steps of the trial's last attempt (where ASHA stopped it, or its end)."""
    steps_run: int = 0
    """Steps trained over every attempt (a completed trial counts its stopped attempt too)."""
    seconds: float = 0.0
    """Wall seconds of the trial, every attempt counted."""
    stopped_early: bool = False
    """ASHA stopped the trial: no test score."""
    completed_after_stop: bool = False
    """A stopped trial run again to its end (its best LR needed every seed): the scores are the second run's."""
    trials_of: str = ""
    """The run these trials were run under when this run shares the checkpoint (same weights at this step): the
    row is a copy of that run's, never fine-tuned again; "" for a run's own trials."""
    diverged: bool = False
    """The fine-tuning loss turned NaN or inf: the trial stopped and scored the metric's floor, what a model that
    learned nothing scores (raybiphase.finetune.baselines.FLOORS), so it still counts against its LR."""
    dataset_revisions: str | None = None
    """Our trials on hub datasets: each dataset the trial read and its commit, `org/name@commit` comma-separated
    (a moving revision's name where it was read unpinned); None for offline tasks, baselines and imported rows."""
    finetune_settings: str | None = None
    """Our trials: the digest of the fine-tuning settings that shape a trial's result
    (raybiphase.finetune.records.trial_settings), one value per table; None for baselines and imported rows."""
    train_data: str | None = None
    """Imported rows (source paper): the data the trial trained on, as the authors' result tree names it (a
    retrieval folder's prefix, msmarco_pairs; else the task's dataset); None for ours."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The pretrained run's dotted settings."""

    @property
    def key(self) -> tuple:
        """TRIAL_KEY: what a trial is known by across reruns."""
        return (str(self.run), int(self.pretrain_step), str(self.task), float(self.lr), int(self.seed))

    def record(self) -> dict[str, Any]:
        plain = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "settings"}
        plain["test_per_example"] = per_example_flat(self.test_per_example)
        return {**plain, **self.settings}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> FinetuneRow:
        names = {f.name for f in dataclasses.fields(cls)} - {"settings"}
        return cls(**{k: v for k, v in record.items() if k in names},
                   settings={k: v for k, v in record.items() if k not in names})


def per_example_flat(values) -> list[float]:
    """Per-example scores as one flat list of floats: [[tp, predicted, gold], ...] -> [tp, predicted, gold, ...]."""
    values = [] if values is None else list(values)
    if values and not isinstance(values[0], (int, float)):
        return [float(x) for entry in values for x in entry]
    return [float(x) for x in values]


def trial_key(record: dict[str, Any]) -> tuple:
    """TRIAL_KEY of a row's record."""
    return (str(record["run"]), int(record["pretrain_step"]), str(record["task"]), float(record["lr"]),
            int(record["seed"]))


def completed_row(stopped: FinetuneRow, rerun: FinetuneRow) -> FinetuneRow:
    """A stopped trial run again to its end: the second run's scores, the work of both attempts."""
    return dataclasses.replace(rerun, steps_run=stopped.steps_run + rerun.steps,
                               seconds=stopped.seconds + rerun.seconds, completed_after_stop=True)


def baseline_row(scores: dict[str, Any], *, run: str, family: str, sweep: str) -> FinetuneRow:
    """A baseline's row (BM25: `run="bm25"`) on a task's test split; its key is fixed, so it is appended once."""
    return FinetuneRow(run=run, pretrain_step=0, task=scores["task"], lr=0.0, seed=0, source=BASELINE, sweep=sweep,
                       family=family, dataset=scores["dataset"], metric=scores["metric"],
                       secondary_metric=scores["secondary_metric"], test_score=scores["test_score"],
                       test_secondary=scores["test_secondary"], test_per_example=list(scores["test_per_example"]))
