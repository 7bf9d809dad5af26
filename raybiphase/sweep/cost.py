"""What the plan's work costs in GPU-hours (no Ray, no torch): a pretraining segment's steps at `sweep.mfu` of
the GPU's peak (`sweep.gpu_peak_tflops`), and one checkpoint's fine-tuning grid with its evaluations at
`sweep.finetune_mfu`, a measured trial's rate. The dry run's totals, the wall-clock simulation and the
replicates' price add these up."""

from __future__ import annotations

import math

from raybiphase.config import FinetuneGrid, SweepSpec
from raybiphase.config.estimates import step_gpu_hours
from raybiphase.config.sizes import SIZES
from raybiphase.finetune.eval_sizes import evaluation_inputs
from raybiphase.finetune.tasks import training_groups


def _finetune_hours(flops: float, spec: SweepSpec) -> float:
    return flops / (spec.sweep.gpu_peak_tflops * 1e12 * spec.sweep.finetune_mfu) / 3600


def segment_gpu_hours(item, spec: SweepSpec) -> float:
    """The GPU-hours of one segment's (or one run's) steps (raybiphase.config.estimates.step_gpu_hours)."""
    return step_gpu_hours(item.config, spec.sweep, item.steps)


def checkpoint_finetune_gpu_hours(size: str, spec: SweepSpec, grid: FinetuneGrid | None = None, *,
                                  evaluation_only: bool = False) -> float:
    """An upper bound on one checkpoint's fine-tuning of a model of `size`: every trial of its `grid` (default: the
    full grid; no ASHA stop), each finetune.max_steps steps of finetune.batch_size inputs of finetune.max_len tokens
    (no LM head), and their evaluations: every task validated ceil(max_steps / eval_every) times and tested once
    (`eval_sizes.evaluation_inputs`), each input counted at max_len tokens and a third of a training token's FLOPs
    (a forward pass: no backward), all at sweep.finetune_mfu. `evaluation_only`: the evaluations' share alone."""
    ft = spec.finetune
    grid = grid or ft.grid()
    per_task = len(grid.lrs) * len(grid.seeds)  # trials of one task
    evaluations = math.ceil(ft.max_steps / ft.eval_every)
    inputs = [evaluation_inputs(name, ft.max_eval_examples or ft.max_examples, ft.ir_corpus) for name in grid.tasks]
    evaluated = sum(evaluations * validation + test for validation, test in inputs) * ft.max_len / 3
    trained = 0 if evaluation_only else len(training_groups(grid.tasks)) * ft.max_steps * ft.batch_size * ft.max_len
    return _finetune_hours(SIZES[size].flops_per_token(0, ft.max_len) * (trained + evaluated) * per_task, spec)


def gpu_hours_text(hours: float, digits: int = 0) -> str:
    """GPU-hours as the dry run says them: `digits` decimals from 10 up, two below (a small sweep's 0.03 is not 0)."""
    return f"{hours:,.{digits}f}" if hours >= 10 else f"{hours:.2f}"


def hours_text(hours: float) -> str:
    """A wall-clock estimate: days from 48 hours, hours from one, minutes or seconds below (a one-GPU sweep's)."""
    if hours >= 48:
        return f"{hours / 24:,.1f} days"
    if round(hours * 60) >= 60:  # rounded first: 59.7 minutes say "1.0 hours", not "60 min"
        return f"{hours:,.1f} hours"
    return f"{round(hours * 60)} min" if round(hours * 3600) >= 60 else f"{round(hours * 3600)} s"
