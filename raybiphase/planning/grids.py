"""Which fine-tuning grid each checkpoint of a plan takes, what it counts in trials, and the dry run's line on it.

A run's final checkpoint and the untrained controls take the full grid (finetune.tasks x lrs x seeds). An
intermediate checkpoint (a train.export_steps step before its run's end) takes the grid the finetune.exports entry
naming its step gives (raybiphase.config.FinetuneConfig.grid), else the full one; one that is also some run's
final checkpoint (a run that is another's prefix, with no decay) takes the full grid for all of them. Every
checkpoint at one step takes the same grid, whichever run it belongs to, so the matched CLM and MLM checkpoints
of a learning curve are fine-tuned alike.

    plan.grids(spec)[(segment, 4000)]   # FinetuneGrid(tasks=('sst2', ...), lrs=(2e-05, ...), seeds=(0, ...))
"""

from __future__ import annotations

from raybiphase.config import ConfigError, FinetuneConfig, FinetuneGrid, SweepSpec
from raybiphase.finetune.tasks import training_groups
from raybiphase.naming import steps_label


def checkpoint_grid(runs: list, step: int, ft: FinetuneConfig) -> FinetuneGrid:
    """The grid of the checkpoint at `step` that `runs` (plan Runs) share (module docstring)."""
    return ft.grid(None if _final(runs, step) else step)


def _final(runs: list, step: int) -> bool:
    return any(run.steps == step for run in runs)


def grid_trials(grid: FinetuneGrid, *, distinct: bool = True) -> int:
    """The trials a grid trains: its trained tasks (nq and mldr ride on msmarco's trial:
    raybiphase.finetune.tasks.training_groups) x LRs x seeds; with `distinct=False`, every task apart."""
    tasks = len(training_groups(grid.tasks)) if distinct else len(grid.tasks)
    return tasks * len(grid.lrs) * len(grid.seeds)


def check_export_grids(runs: dict, ft: FinetuneConfig) -> None:
    """A step finetune.exports names is an intermediate checkpoint of some run (one of its train.export_steps
    before its last step): a step no run exports would take no grid, silently."""
    intermediate = sorted({step for run in runs.values() for step in run.finetune_steps if step < run.steps})
    for i, entry in enumerate(ft.exports):
        for j, step in enumerate(entry.steps):
            if step not in intermediate:
                raise ConfigError(f"finetune.exports.{i}.steps.{j}: no run exports step {step} before its end "
                                  f"(the runs' train.export_steps: {', '.join(map(str, intermediate)) or 'none'})")


def grid_lines(plan, spec: SweepSpec) -> list[str]:
    """The dry run's line per finetune.exports entry: the intermediate checkpoints it applies to and its trials
    each, beside a final checkpoint's (the full grid)."""
    ft = spec.finetune
    if not ft.tasks or not ft.exports:
        return []
    full = grid_trials(ft.grid())
    checkpoints = plan.checkpoints()
    lines = []
    for i, entry in enumerate(ft.exports):
        grid = ft.grid(entry.steps[0])
        taken = [step for (_, step), names in checkpoints.items()
                 if step in entry.steps and not _final([plan.runs[n] for n in names], step)]
        steps = ", ".join(steps_label(s) for s in sorted(entry.steps))
        lines.append(f"finetune.exports.{i}: {len(taken)} intermediate checkpoint(s) at steps {steps}, each on "
                     f"{len(grid.tasks)} task(s) ({', '.join(grid.tasks)}) x {len(grid.lrs)} LR(s) x "
                     f"{len(grid.seeds)} seed(s): {grid_trials(grid):,} trials each, where a final checkpoint "
                     f"takes {full:,}")
    return lines
