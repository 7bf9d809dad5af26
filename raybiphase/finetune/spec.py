"""What fine-tuning is given: a checkpoint to fine-tune (`FinetuneSource`) and one trial (`TrialSpec`).

A `TrialSpec` is a trial's whole input, typed: its checkpoint, its `Task` object, LR, seed, record path, whether its
group's ASHA compares it, and its riders (the tasks tested on the model it trains, each with its own record). It
is built once when the fan-out plans its trials and is the argument of `run_trial`; Tune's config carries it as
plain data (`to_config` / `from_config`, the only place it crosses a process boundary), which Tune's loggers can
write. Its rows are built from it and a trial's typed result (`finished`, `stopped`) when they are written, and only
then.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from raybiphase.config import FinetuneGrid
from raybiphase.finetune.tasks import Task, get_task
from raybiphase.results.rows import OURS, FinetuneRow


@dataclass(frozen=True)
class FinetuneSource:
    """A checkpoint to fine-tune: run `run` at step `pretrain_step`, its HF folder, its dotted settings."""

    run: str
    pretrain_step: int
    hf_dir: str
    columns: dict[str, Any] = field(default_factory=dict)
    shared_by: tuple[FinetuneSource, ...] = ()
    """Other runs whose weights these are at this step (an export inside a shared prefix): fine-tuned once, under
    `run`; their rows are copies (`shared_row`)."""
    grid: FinetuneGrid | None = None
    """The tasks x LRs x seeds it is fine-tuned on (the sweep's plan gives an intermediate checkpoint the grid of
    finetune.exports); None: finetune's full grid."""
    row_source: str = OURS
    """Its rows' `source`: raybiphase for ours, hub for a public encoder (finetune.baselines)."""


@dataclass(frozen=True)
class TrialSpec:
    """One fine-tuning trial: `task` trained on `checkpoint` at `lr` with `seed`; its record at `record`."""

    run: str
    pretrain_step: int
    checkpoint: str
    """The HF folder fine-tuned (local, or in a bucket: copied to the trial's node)."""
    task: Task
    lr: float
    seed: int
    record: str
    """Where the trial's row is kept once it has one (raybiphase.finetune.records)."""
    sweep: str = ""
    columns: dict[str, Any] = field(default_factory=dict)
    """The pretrained run's dotted settings, carried into its rows."""
    asha: bool = True
    """Compared by its group's ASHA (a completion-pass rerun, or finetune.asha off: never stopped)."""
    riders: tuple[TrialSpec, ...] = ()
    """The tasks tested on the model this trial trains (the rest of its training group), each with its record."""
    row_source: str = OURS
    """Its rows' `source` (`FinetuneSource.row_source`)."""

    @property
    def key(self) -> tuple:
        """rows.TRIAL_KEY: what the trial is known by across reruns."""
        return (self.run, self.pretrain_step, self.task.name, self.lr, self.seed)

    @property
    def group(self) -> tuple:
        """The trials one ASHA compares, and one best LR is picked among: one checkpoint, one task."""
        return (self.run, self.pretrain_step, self.task.name)

    @property
    def also_test(self) -> tuple[Task, ...]:
        return tuple(rider.task for rider in self.riders)

    def planned(self) -> FinetuneRow:
        """The trial's row before it ran: what it will be known by (no scores)."""
        task = self.task
        return FinetuneRow(run=self.run, pretrain_step=self.pretrain_step, task=task.name, lr=self.lr, seed=self.seed,
                           sweep=self.sweep, checkpoint=self.checkpoint, family=task.family, dataset=task.dataset,
                           metric=task.metric, secondary_metric=task.secondary_metric, settings=dict(self.columns),
                           source=self.row_source)

    def finished(self, result) -> FinetuneRow:
        """The row of the trial run to its end (run_trial's TrialResult)."""
        return dataclasses.replace(self.planned(), val_score=result.val_score, test_score=result.test_score,
                                   test_secondary=result.test_secondary, test_per_example=list(result.test_per_example),
                                   steps=result.steps, steps_run=result.steps, seconds=result.seconds,
                                   diverged=result.diverged, dataset_revisions=result.dataset_revisions or None)

    def stopped(self, *, val_score: float, step: int, seconds: float) -> FinetuneRow:
        """The row of a trial ASHA stopped at `step`: its last validation score, no test score."""
        return dataclasses.replace(self.planned(), val_score=val_score, steps=step, steps_run=step, seconds=seconds,
                                   stopped_early=True)

    def to_config(self) -> dict:
        """The spec as plain data for Tune's config (read back by `from_config` in the trial's process)."""
        plain = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("task", "riders")}
        return {**plain, "task": self.task.name, "riders": [r.to_config() for r in self.riders]}

    @classmethod
    def from_config(cls, config: dict) -> TrialSpec:
        return cls(**{**config, "task": get_task(config["task"]),
                      "riders": tuple(cls.from_config(r) for r in config["riders"])})

    @classmethod
    def plain(cls, checkpoint, task: str, *, lr: float, seed: int, also_test: tuple[str, ...] = ()) -> TrialSpec:
        """A trial outside any fan-out (a benchmark, a test): no run, no record."""
        base = cls("", 0, str(checkpoint), get_task(task), float(lr), int(seed), "")
        return dataclasses.replace(base, riders=tuple(dataclasses.replace(base, task=get_task(name))
                                                      for name in also_test))
