"""What the plan's work costs in GPU-hours (no Ray, no torch): a pretraining segment's steps at `sweep.mfu` of
the GPU's peak (`sweep.gpu_peak_tflops`), and one checkpoint's fine-tuning grid with its evaluations: each step or
evaluation batch its FLOPs at the inputs' measured width (raybiphase.finetune.input_lengths) at
`sweep.finetune_mfu`, plus a launch-bound floor (`sweep.finetune_launch_s_per_layer`). The dry run's totals, the
wall-clock simulation and the replicates' price add these up."""

from __future__ import annotations

import math
from dataclasses import dataclass

from raybiphase.config import FinetuneGrid, SweepSpec
from raybiphase.config.estimates import step_gpu_hours
from raybiphase.config.sizes import SIZES
from raybiphase.finetune.eval_sizes import evaluation_splits, training_examples
from raybiphase.finetune.input_lengths import EVAL_BATCH, is_measured, width
from raybiphase.finetune.tasks import get_task, training_groups


def segment_gpu_hours(item, spec: SweepSpec) -> float:
    """The GPU-hours of one segment's (or one run's) steps (raybiphase.config.estimates.step_gpu_hours)."""
    return step_gpu_hours(item.config, spec.sweep, item.steps)


@dataclass(frozen=True)
class TrialCount:
    """What one trial of a training group does and costs on one GPU, in seconds."""

    steps: int
    """Training steps: finetune.max_steps, or fewer where one epoch of the training set ends first."""
    validations: int
    """Validations of each task of the group: every finetune.eval_every steps and at the last step."""
    train_s: float
    eval_s: float
    """Every validation and the one test of every task of the group."""


def _pass_s(size: str, spec: SweepSpec, inputs: float, tokens: int, batches: float, *, forward: bool) -> float:
    """GPU-seconds of `inputs` inputs padded to `tokens` in `batches` batches: their FLOPs at sweep.finetune_mfu
    plus each batch's launch-bound floor; a forward pass (evaluation) a third of both."""
    model, share = SIZES[size], 1 / 3 if forward else 1.0
    flops = model.flops_per_token(0, tokens) * inputs * tokens * share
    floor = spec.sweep.finetune_launch_s_per_layer * model.layers * batches * share
    return floor + flops / (spec.sweep.gpu_peak_tflops * 1e12 * spec.sweep.finetune_mfu)


def _evaluation_s(name: str, size: str, spec: SweepSpec, examples: int, passages: int) -> float:
    """One evaluation of task `name`: its examples (retrieval: queries, then the corpus's passages) in batches of
    EVAL_BATCH, each batch as wide as the measured high quantile."""
    ft, ir = spec.finetune, get_task(name).family == "IR"
    parts = [("eval_query", examples), ("eval_passage", passages)] if ir else [("eval", examples)]
    return sum(_pass_s(size, spec, count, width(name, part, ft.max_len), math.ceil(count / EVAL_BATCH), forward=True)
               for part, count in parts if count)


def trial_count(group: tuple[str, ...], size: str, spec: SweepSpec) -> TrialCount:
    """One trial of the training group `group` (`tasks.training_groups`: the task it trains, then the tasks scored
    on its model) at model size `size`: at most one epoch of finetune.batch_size examples a step (a retrieval step
    encodes a query and a passage per example, two passes), each task validated every finetune.eval_every steps
    and at the end, and tested once. A QA question counts as one window, as it is where max_len holds its context
    (sweeps/paper.yaml: 2,048 against SQuAD's longest, 921 tokens)."""
    ft, trained = spec.finetune, group[0]
    steps = min(ft.max_steps, math.ceil(training_examples(trained, ft.max_examples) / ft.batch_size))
    parts = ("train_query", "train_passage") if get_task(trained).family == "IR" else ("train",)
    train_s = sum(_pass_s(size, spec, steps * ft.batch_size, width(trained, part, ft.max_len,
                                                                   bucketed=ft.bucket_by_length), steps, forward=False)
                  for part in parts)
    validations = math.ceil(steps / ft.eval_every)
    eval_s = 0.0
    for name in group:
        validation, test = evaluation_splits(name, ft.max_eval_examples or ft.max_examples, ft.ir_corpus)
        eval_s += validations * _evaluation_s(name, size, spec, *validation) + _evaluation_s(name, size, spec, *test)
    return TrialCount(steps, validations, train_s, eval_s)


def checkpoint_finetune_gpu_hours(size: str, spec: SweepSpec, grid: FinetuneGrid | None = None, *,
                                  evaluation_only: bool = False) -> float:
    """An upper bound on one checkpoint's fine-tuning of a model of `size`: every trial of its `grid` (default: the
    full grid; no ASHA stop), each as `trial_count` counts it. `evaluation_only`: the evaluations' share alone."""
    grid = grid or spec.finetune.grid()
    counts = [trial_count(group, size, spec) for group in training_groups(grid.tasks).values()]
    seconds = sum(c.eval_s + (0 if evaluation_only else c.train_s) for c in counts)
    return seconds * len(grid.lrs) * len(grid.seeds) / 3600


def finetune_basis_text(spec: SweepSpec) -> str:
    """How the dry run prices fine-tuning, in a clause: which tasks' widths were measured, the MFU and the floor."""
    tasks = spec.finetune.tasks
    measured = sum(is_measured(name) for name in tasks)
    bucketed = spec.finetune.bucket_by_length
    quantile = "p98 width (training's length-bucketed: about the mean)" if bucketed else "p98 width"
    widths = f"inputs at their measured {quantile}" if measured == len(tasks) else (
        f"inputs at their measured {quantile} for {measured} of {len(tasks)} tasks, at max_len for the rest")
    return (f"{widths}; a step's FLOPs at {spec.sweep.finetune_mfu:.0%} MFU plus a launch-bound "
            f"{spec.sweep.finetune_launch_s_per_layer * 1000:g} ms a layer")


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
