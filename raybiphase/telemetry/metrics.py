"""One pretraining report as a typed record: every metric the loop reports at a step (raybiphase.pretrain.loop),
each a field with its docstring, by the name the history, the checkpoint meta, W&B and the pretrain.parquet column
use (`column`: the field's name, or the `column` its metadata gives, `train/clm_loss` for `train_clm_loss`).

    metrics = PretrainReport.from_columns({"step": 100, "tokens_seen": 204800, ...}).columns()

`from_columns` refuses a name no field declares, so a metric cannot be reported without a field; docs/results.md
lists every column from these fields, and `python -m raybiphase docs` stops at a field without a docstring. A metric a report does not
hold (an MLM loss at a CLM step, the evaluations between evaluation steps, MFU off GPU) is None and left out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from raybiphase.telemetry.history import RESUME_POINT


def _named(column: str) -> Any:
    return field(default=None, metadata={"column": column})


def column(spec: dataclasses.Field) -> str:
    """The name a field's metric is reported and stored under."""
    return spec.metadata.get("column", spec.name)


@dataclass(frozen=True, kw_only=True)
class PretrainReport:
    """The metrics of one report of a run at a step, in the order the loop reports them."""

    step: int
    """Optimizer steps done."""
    tokens_seen: int
    """Tokens of the global batches trained on so far: step x train.global_batch_tokens."""
    phase: int
    """The index of the step's phase in the run's resolved phases (0 first)."""
    objective: str
    """The step's objective: clm, mlm or mntp."""
    train_clm_loss: float | None = _named("train/clm_loss")
    """The step's CLM loss over every labelled token of the global batch (nats per token); CLM steps only."""
    train_mlm_loss: float | None = _named("train/mlm_loss")
    """The step's MLM loss over the masked tokens of the global batch (nats per token); MLM steps only."""
    train_mntp_loss: float | None = _named("train/mntp_loss")
    """The step's MNTP loss (MLM's masked inputs, each label one position earlier); MNTP steps only."""
    lr: float
    """The learning rate of the step (the WSD schedule's)."""
    tokens_per_s: float
    """Training tokens per second of wall time since the previous report (or the phase's start), every worker
    together."""
    workers: int
    """The Train workers that trained the step: in an elastic segment, resources.num_workers [min, max], as many as
    were placed; the global batch and its order are the same at every count."""
    data_epochs: float
    """Passes over the training blocks at this step, a continued run's source's included: above 1, repeated data."""
    mfu: float | None = None
    """Model FLOPs utilisation on GPU: FLOPs per token x tokens_per_s / (the device's peak bf16 FLOP/s x workers);
    None off GPU."""
    resume_point: bool | None = _named(RESUME_POINT)
    """True on a report made only for a preemption notice's checkpoint: a place to resume from, never a row of
    pretrain.parquet (a run never interrupted has no report there)."""
    peak_mem_gb: float | None = None
    """Rank 0's peak allocated CUDA memory so far, GB; None off CUDA."""
    val_clm_loss: float | None = _named("val/clm_loss")
    """The held-out CLM loss (nats per token) on fixed validation batches; evaluation steps only."""
    val_mlm_loss: float | None = _named("val/mlm_loss")
    """The held-out MLM loss on fixed validation batches masked at the run's ratio; evaluation steps only."""
    val_mntp_loss: float | None = _named("val/mntp_loss")
    """The held-out MNTP loss; evaluation steps of a run with an MNTP phase only."""
    unigram_entropy: float | None = None
    """The training corpus' unigram entropy (nats per token), the loss of a model that learned only token
    frequencies: the reference the held-out losses should fall below; evaluation steps only."""

    @classmethod
    def from_columns(cls, columns: dict[str, Any]) -> PretrainReport:
        """The report of `columns` (name -> value); TypeError naming a column no field declares."""
        names = {column(f): f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(columns) - set(names))
        if unknown:
            raise TypeError(f"pretraining metrics {unknown} are not fields of PretrainReport: declare each, with its "
                            "description, in raybiphase/telemetry/metrics.py")
        return cls(**{names[name]: value for name, value in columns.items()})

    def columns(self) -> dict[str, Any]:
        """The report as column -> value, in field order, without the metrics it does not hold (None)."""
        values = ((column(f), getattr(self, f.name)) for f in dataclasses.fields(self))
        return {name: value for name, value in values if value is not None}

