"""What a sweep does before it starts anything, and all a dry run does: check the task names, plan the runs, print
the plan and stop on a data budget that would repeat data (one line naming the run). Light on purpose: the dry run
imports neither Ray nor the training loop."""

from __future__ import annotations

import dataclasses

from raybiphase import storage
from raybiphase.checkpoint_meta import check_blocks
from raybiphase.config import ConfigError, SweepSpec
from raybiphase.config.resources import check_fits
from raybiphase.config.resources import check_room as check_run_room
from raybiphase.finetune.heldout import check_held_out_tasks
from raybiphase.finetune.tasks import get_task
from raybiphase.planning.bill import bill_lines
from raybiphase.planning.plan import Plan, describe, make_plan
from raybiphase.planning.power_lines import power_lines
from raybiphase.planning.stage_forecast import stage_lines
from raybiphase.planning.timeline import timeline_lines
from raybiphase.pretrain.budget import check_budget, data_budget
from raybiphase.telemetry.console import STDOUT, Console


def plan_sweep(spec: SweepSpec, *, dry_run: bool = False, console: Console = STDOUT) -> tuple[SweepSpec, Plan]:
    """The spec with its storage made absolute (trials run in other directories and on other nodes) and its plan;
    prints the whole plan on a dry run, its first line and step counts otherwise."""
    for task in spec.finetune.tasks:  # an unknown name fails here, dry run included, before anything runs
        get_task(task)
    data = spec.run.data  # an unreachable or missing bucket: one line within seconds, before the plan reads it
    for key, location in (("sweep.storage", spec.sweep.storage), ("data.dir", data.dir), ("data.source", data.source)):
        if location:
            storage.check_reachable(location, key)
    where = storage.absolute(spec.sweep.storage)
    spec = dataclasses.replace(spec, sweep=dataclasses.replace(spec.sweep, storage=where))
    plan = make_plan(spec)
    for run in plan.runs.values():
        check_held_out_tasks(run.config.data)
    check_finetune_length(plan, spec)
    text = "\n".join([describe(plan, spec), *timeline_lines(plan, spec), *bill_lines(plan, spec),
                      *(power_lines(plan, spec) if dry_run else []), *(stage_lines(plan, spec) if dry_run else [])])
    lines = text.splitlines()
    console.say(text if dry_run else "\n".join([lines[0], *(x for x in lines if x.startswith("steps:"))]))
    check_budget(data_budget(plan, spec))  # a run that would repeat data stops here, dry run included
    for run in plan.runs.values():  # frozen_layers against a decoder's own depth, read from model.init_from
        check_blocks(run.config)
    return spec, plan


def check_finetune_length(plan: Plan, spec: SweepSpec) -> None:
    """No checkpoint is fine-tuned on sequences longer than its run pretrained on (its exports have that many
    positions); said before anything runs, not by every trial."""
    if not spec.finetune.tasks:
        return
    for run in plan.runs.values():
        if spec.finetune.max_len > run.config.data.seq_len:
            raise ConfigError(f"finetune.max_len: {spec.finetune.max_len} exceeds the {run.config.data.seq_len}-token "
                              f"blocks run {run.name} pretrains on; set finetune.max_len <= {run.config.data.seq_len}")


def check_room(plan: Plan, spec: SweepSpec, available: dict[str, float], *, flash_attn: bool) -> None:
    """On the sweep's own local Ray (one machine, no autoscaler to add a node), every run's worker group
    (raybiphase.config.resources.check_room) and a fine-tuning trial must fit in `available`, Ray's total
    resources: a trial that asks for more would wait for it forever. One line naming the setting instead, before
    any data is prepared or anything written."""
    for run in plan.runs.values():
        check_run_room(run.config.resources, run.config.model.attn_implementation, available,
                       flash_attn=flash_attn, who=f"a segment of run {run.name}")
    ft = spec.finetune
    if ft.tasks:
        for key, need, kind in (("cpus_per_trial", ft.cpus_per_trial, "CPU"),
                                ("gpus_per_trial", ft.gpus_per_trial, "GPU")):
            check_fits(f"finetune.{key}", need, kind, available, f"a trial asks for {need:g}")
