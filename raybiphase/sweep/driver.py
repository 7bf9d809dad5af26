"""The command users run: `raybiphase sweep SPEC [--set k=v] [--dry-run]` (or `python -m raybiphase.sweep`).

SPEC is a sweep YAML (a base run plus `sweep.grid` / `sweep.runs`). The planner (raybiphase.planning.plan) turns it into
a tree of shared segments. The driver is three steps: `start` (storage checks, Ray, the data), `run_jobs` (one
scheduler, raybiphase.sweep.scheduler, fits every ready segment's TorchTrainer as a job of its own,
raybiphase.sweep.segments, resuming from its parent's checkpoint, as soon as its dependencies are done and a slot is
free, longest remaining chain first, and fine-tunes the final and requested intermediate checkpoints of every run as
their segments end, beside the segments still training: raybiphase.sweep.finetuning names them), and `finish` (the
summary, the model cards, the report). Rows land in <storage>/<sweep>/{pretrain,finetune,summary}.parquet.

One driver holds a sweep folder at a time (raybiphase.sweep.lease): a second one on the same folder stops with one
line naming the holder, before Ray starts. Run it again after an interruption and it continues: a segment whose end
checkpoint exists is not rerun, a segment cut short resumes from its newest committed checkpoint, a fine-tuning trial
with a row is not rerun, and no row is written twice. Works the same under `ray job submit` (joins the cluster in
RAY_ADDRESS).
RAYBIPHASE_STORAGE, when set, overrides sweep.storage (the KubeRay job uses it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from raybiphase import outages, storage
from raybiphase.config import SweepSpec
from raybiphase.data import assets
from raybiphase.data.fingerprint import fingerprint
from raybiphase.data.prepare import check_data, prepare
from raybiphase.errors import ConfigError, UserError
from raybiphase.finetune.fanout import Fanout, check_sources
from raybiphase.finetune.heldout import evaluation_texts
from raybiphase.finetune.records import check_settings
from raybiphase.outages import outage_budget
from raybiphase.planning.plan import Plan
from raybiphase.planning.preflight import check_room, plan_sweep
from raybiphase.planning.space import check_space
from raybiphase.pretrain.budget import check_budget, data_budget
from raybiphase.pretrain.export import write_card
from raybiphase.pretrain.trainer import make_trainer
from raybiphase.raycluster import ensure_ray, own_machine
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from raybiphase.results import wandb_upload as results_wandb
from raybiphase.results.html import run_info
from raybiphase.results.report import write_report
from raybiphase.storage import SweepPaths
from raybiphase.sweep import lease
from raybiphase.sweep.context import SweepContext
from raybiphase.sweep.finetuning import baseline_rows, finetune_sources, first_sources, say_planned, trials_done
from raybiphase.sweep.hub_baselines import hub_baseline_rows, hub_jobs, hub_sources
from raybiphase.sweep.scheduler import Scheduler
from raybiphase.sweep.segments import SweepPretraining, recover
from raybiphase.sweep.size_gate import SizeStages
from raybiphase.telemetry.clock import Clock
from raybiphase.telemetry.console import STDOUT, Console
from raybiphase.telemetry.progress import Watch, interval


def run_sweep(spec: SweepSpec, *, dry_run: bool = False, console: Console = STDOUT, spec_path: str = "",
              make_trainer: Callable = make_trainer) -> Plan:
    """Plan the spec (the dry run stops there), take the sweep folder's lease (raybiphase.sweep.lease: another
    driver holding it stops this one here, before Ray starts), then prepare the data, pretrain every segment and,
    beside it, fine-tune every distinct checkpoint and the controls as they are ready, and draw the report; resumes
    where an earlier invocation stopped. An unreachable bucket is waited out for sweep.storage_outage_s, by the
    driver and by every Ray worker it starts, counted from the outage's start as the first of them saw it (one
    budget for the sweep however often Ray Train restarts a segment's workers). `make_trainer(job, max_failures=,
    callbacks=)` gives each segment's trainer, whose `fit()` returns a `ray.train.Result` (default: a TorchTrainer
    on a worker group of resources' shape, raybiphase.pretrain.trainer.make_trainer)."""
    spec, plan = plan_sweep(spec, dry_run=dry_run, console=console)
    if dry_run:
        return plan
    clock = Clock()
    ctx = SweepContext(spec, plan, SweepPaths.of(spec.sweep.storage, spec.sweep.name), console=console)
    # a bucket never reached is a wrong address or missing credentials, not an outage to wait out: said in seconds,
    # before the lease's first write would wait storage's retry budget
    storage.check_reachable(spec.sweep.storage, "sweep.storage")
    with (outage_budget(ctx.policy.storage_outage_s),  # for this process and every Ray worker it starts
          lease.hold(ctx.paths.lease, spec.sweep.lease_timeout_s, console=console),  # one driver per sweep folder
          outages.sharing()):  # one outage budget for all of the sweep's processes (started once Ray is up)
        start(ctx, clock, spec_path)
        rows = run_jobs(ctx, clock, make_trainer)
        if spec.finetune.tasks:
            record_baselines(ctx, clock, rows)
        with clock.span("report"):
            trained = [source for source in finetune_sources(ctx)  # a by_size sweep's skipped arms have none
                       if storage.is_checkpoint(storage.parent(source.hf_dir))]
            finish(ctx.paths, spec, console=console, cards=trained)
        ctx.say(clock.summary())
    return plan


def start(ctx: SweepContext, clock: Clock, spec_path: str) -> None:
    """Everything before the first segment: storage checks (an unreachable bucket, trials recorded under other
    fine-tuning settings), Ray, the report's header, the data of every corpus and its budget. A start refused with
    bad input (UserError, ConfigError) leaves no sweep folder it made."""
    root = ctx.paths.root  # made by this start when it holds nothing but the lease just taken
    made = not storage.is_uri(root) and not storage.list_files(root) and set(storage.list_folders(root)) <= {
        storage.LEASE_DIR}
    try:
        check_and_prepare(ctx, clock)
    except (UserError, ConfigError):
        if made:
            storage.delete(ctx.paths.root)
        raise
    storage.write_json(ctx.paths.run_info,  # the report's header, and the prior it judges unmeasured strata by
                       run_info(spec_path, ctx.spec.finetune, unmeasured_sd=ctx.spec.sweep.unmeasured_sd))


def check_and_prepare(ctx: SweepContext, clock: Clock) -> None:
    """The checks that need no Ray, Ray, the checks of what this machine's Ray has, then the data."""
    spec, paths = ctx.spec, ctx.paths
    storage.check_writable(paths.root, "sweep.storage")  # an unreachable bucket fails here, before any work
    check_space(ctx.plan, spec)  # a local disk that cannot hold the plan's checkpoints, likewise
    if spec.finetune.tasks:
        check_settings(paths.table(storage.FINETUNE_FILE), spec.finetune)
        check_sources(hub_sources(spec), spec.finetune)  # a public encoder out of reach or unloadable: said now
    interval()  # a bad RAYBIPHASE_PROGRESS_S is said now, not once segments run
    corpora = {fingerprint(run.config.data): run.config.data for run in ctx.plan.runs.values()}
    for data in corpora.values():  # a bad source or tokenizer, a missing or corrupt shard: said before Ray starts
        check_data(data, storage_root=spec.sweep.storage)
    assets.use_mirror(spec.sweep.storage)  # nodes without the offline assets copy them from the bucket
    with clock.span("Ray start"):
        ensure_ray()
    if any(storage.is_uri(at) for at in (spec.sweep.storage, *(d.dir for d in corpora.values()))):
        outages.share()  # one outage budget for the whole sweep, not one per process Ray Train restarts
    if machine := own_machine():  # the sweep's own Ray: what this machine has is all there will be
        check_room(ctx.plan, spec, machine[0], flash_attn=machine[1])
    with clock.span("data"):
        for key, data in corpora.items():
            ctx.data_dirs[key] = prepare(data, storage_root=spec.sweep.storage, evaluation_texts=evaluation_texts)
    check_budget(data_budget(ctx.plan, spec))  # again on the prepared manifests: a stated size is an estimate


def record_baselines(ctx: SweepContext, clock: Clock, rows: list[dict]) -> None:
    """The baselines' rows once every trial has ended (the public encoders of finetune.baselines, fine-tuned
    beside pretraining into their cache: raybiphase.sweep.hub_baselines), and the fine-tuning counts of the time
    line."""
    hub, baselines = hub_baseline_rows(ctx.spec, console=ctx.console), baseline_rows(ctx.spec)
    for new in (hub, baselines):
        if len(new):
            store.append_rows(ctx.paths.table(storage.FINETUNE_FILE), new, key=result_rows.FINETUNE_KEY)
    ctx.say(f"fine-tuning: {len(rows) + len(hub) + len(baselines)} rows recorded")
    ran = trials_run(rows)
    clock.trials, clock.in_trials = len(ran), sum(r.get("seconds") or 0.0 for r in ran)


def trials_run(rows: list[dict]) -> list[dict]:
    """The fan-out's rows of trials that ran: not the copies given to runs sharing a checkpoint (`trials_of`),
    which would count a trial, and its seconds, once per run."""
    return [r for r in rows if r["source"] == result_rows.OURS and not r.get("trials_of")]


def run_jobs(ctx: SweepContext, clock: Clock, make_trainer: Callable = make_trainer) -> list[dict]:
    """Every segment not yet done and every fine-tuning trial without a row, on the one scheduler
    (raybiphase.sweep.scheduler), each segment a job (raybiphase.sweep.segments) recorded and pruned as it ends with
    a line saying how far the sweep is; the controls' and each checkpoint's trials as soon as they are ready. The
    segments an earlier invocation finished but did not record are recorded first; the public encoders' trials
    (finetune.baselines) from the start, into their cache. Returns the fine-tuning rows appended to the sweep's
    table."""
    plan, spec, paths = ctx.plan, ctx.spec, ctx.paths
    done = {s.id for s in plan.segments.values() if ctx.segment_done(s)}
    ctx.say(f"pretraining: {len(done)}/{len(plan.segments)} segments already done")
    recover(ctx, done)
    fanout = Fanout.of(spec) if spec.finetune.tasks else None
    if fanout:
        say_planned(ctx)
    table = paths.table(storage.FINETUNE_FILE)
    gate = (SizeStages(paths, plan, spec.sweep.decide_probability, console=ctx.console)
            if spec.sweep.stages == "by_size" else None)  # a size starts once the smaller ones and their fine-tuning are done
    scheduler = Scheduler(fanout, slots=spec.run.resources.max_concurrent, experiment=storage.join(paths.root, "finetune"),
                          table=table, console=ctx.console, done_trials=trials_done(table) if fanout else frozenset(),
                          policy=ctx.policy, gate=gate)
    with Watch({}, ctx.console) as watch:  # a line per running segment every few seconds
        pretraining = SweepPretraining(ctx, clock, watch, make_trainer)
        todo = pretraining.jobs([s for s in plan.segments.values() if s.id not in done])
        try:
            rows = scheduler.run(todo, functools.partial(first_sources, ctx, frozenset(done)), done=done,
                                 beside=functools.partial(hub_jobs, spec))  # the public encoders, from the start
        finally:
            if todo:
                clock.spans["pretraining"] = pretraining.seconds()
                clock.most_at_once = scheduler.most
            if fanout:
                clock.spans["fine-tuning"] = scheduler.finetuning_ended - scheduler.began
    return rows


def finish(paths: SweepPaths, spec: SweepSpec, console: Console = STDOUT, cards=()) -> None:
    """summary.parquet, the model card of every export in `cards` (FinetuneSources: with their scores), the report,
    and W&B when configured."""
    if storage.exists(paths.table(storage.FINETUNE_FILE)):
        store.write_summary(paths.root)
    summary = store.read_table(paths.table(storage.SUMMARY_FILE))  # once, for every card
    for source in cards:
        write_card(source.hf_dir, storage.parent(source.hf_dir), name=source.run, summary=summary)
    path, _ = write_report(paths.root)
    results_wandb.log_report(paths.root, spec.sweep.wandb_project, spec.sweep.name)
    console.say(f"report: {path}")
