"""The command users run: `raybiphase sweep SPEC [--set k=v] [--dry-run]` (or `python -m raybiphase.sweep`).

SPEC is a sweep YAML (a base run plus `sweep.grid` / `sweep.runs`). The planner (raybiphase.sweep.plan) turns it into
a tree of shared segments; one scheduler (raybiphase.sweep.scheduler) fits every ready segment's TorchTrainer
(resuming from its parent's checkpoint) as soon as its dependencies are done and a slot is free, longest remaining
chain first, and fine-tunes the final (and requested intermediate) checkpoints of every run as their segments end,
beside the segments still training (raybiphase.sweep.finetuning names them); rows land in
<storage>/<sweep>/{pretrain,finetune,summary}.parquet and the report is drawn.

One driver holds a sweep folder at a time (raybiphase.sweep.lease): a second one on the same folder stops with one
line naming the holder, before Ray starts. Run it again after an interruption and it continues: a segment whose end
checkpoint exists is not rerun, a segment cut short resumes from its newest committed checkpoint, a fine-tuning trial
with a row is not rerun, and no row is written twice. Works the same under `ray job submit` (joins the cluster in
RAY_ADDRESS).
RAYBIPHASE_STORAGE, when set, overrides sweep.storage (the KubeRay job uses it).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

from raybiphase import outages, ray_internals, storage
from raybiphase.config import SweepSpec, flatten
from raybiphase.data import assets
from raybiphase.data.fingerprint import fingerprint
from raybiphase.data.prepare import check_data, prepare
from raybiphase.errors import ConfigError, UserError
from raybiphase.failures import FailurePolicy
from raybiphase.finetune.fanout import Fanout, check_sources
from raybiphase.finetune.heldout import evaluation_texts
from raybiphase.finetune.records import check_settings
from raybiphase.outages import outage_budget
from raybiphase.pretrain.budget import check_budget, data_budget
from raybiphase.pretrain.checkpoint import latest_committed
from raybiphase.pretrain.export import write_card
from raybiphase.pretrain.job import SegmentJob
from raybiphase.pretrain.policy import CheckpointPolicy
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
from raybiphase.sweep.finetuning import baseline_rows, control_sources, finetune_sources, say_planned, trials_done
from raybiphase.sweep.hub_baselines import hub_baseline_rows, hub_sources
from raybiphase.sweep.plan import Plan, Segment, dependencies
from raybiphase.sweep.preflight import check_room, plan_sweep
from raybiphase.sweep.scheduler import Scheduler
from raybiphase.sweep.size_gate import SizeStages
from raybiphase.sweep.space import check_space
from raybiphase.sweep.timeline import remaining_chain, simulate, wall_hours
from raybiphase.telemetry.clock import Clock, step_seconds
from raybiphase.telemetry.console import STDOUT, Console
from raybiphase.telemetry.history import checkpoint_reports, results
from raybiphase.telemetry.progress import Watch, interval
from raybiphase.telemetry.wandb import log_pretraining_run, sweep_settings
from raybiphase.telemetry.wandb_live import segment_settings


def run_sweep(spec: SweepSpec, *, dry_run: bool = False, console: Console = STDOUT, spec_path: str = "") -> Plan:
    """Plan the spec (the dry run stops there), take the sweep folder's lease (raybiphase.sweep.lease: another
    driver holding it stops this one here, before Ray starts), then prepare the data, pretrain every segment and,
    beside it, fine-tune every distinct checkpoint and the controls as they are ready, and draw the report; resumes
    where an earlier invocation stopped. An unreachable bucket is waited out for sweep.storage_outage_s, by the
    driver and by every Ray worker it starts, counted from the outage's start as the first of them saw it (one
    budget for the sweep however often Ray Train restarts a segment's workers)."""
    spec, plan = plan_sweep(spec, dry_run=dry_run, console=console)
    if dry_run:
        return plan
    policy = FailurePolicy.of(spec.sweep)
    clock = Clock()
    ctx = SweepContext(spec, plan, SweepPaths.of(spec.sweep.storage, spec.sweep.name), console=console)
    # a bucket never reached is a wrong address or missing credentials, not an outage to wait out: said in seconds,
    # before the lease's first write would wait storage's retry budget
    storage.check_reachable(spec.sweep.storage, "sweep.storage")
    with (outage_budget(policy.storage_outage_s),  # for this process and every Ray worker it starts
          lease.hold(ctx.paths.lease, spec.sweep.lease_timeout_s, console=console),  # one driver per sweep folder
          outages.sharing()):  # one outage budget for all of the sweep's processes (started once Ray is up)
        start(ctx, clock, spec_path)
        rows = run_jobs(ctx, clock)
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
    """The baselines' rows once every trial has ended (the public encoders of finetune.baselines fine-tuned
    first, or read from their cache: raybiphase.sweep.hub_baselines), and the fine-tuning counts of the time line."""
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


def run_jobs(ctx: SweepContext, clock: Clock) -> list[dict]:
    """Every segment not yet done and every fine-tuning trial without a row, on the one scheduler
    (raybiphase.sweep.scheduler): a segment as soon as its dependencies are done and a slot is free, longest
    remaining chain first, recorded and pruned as it ends with a line saying how far the sweep is; the controls'
    and each checkpoint's trials as soon as they are ready. Returns the fine-tuning rows appended."""
    plan, spec, paths = ctx.plan, ctx.spec, ctx.paths
    done = {s.id for s in plan.segments.values() if ctx.segment_done(s)}
    done_before = set(done)  # `done` grows as segments end
    todo = [s for s in plan.segments.values() if s.id not in done]
    ctx.say(f"pretraining: {len(done)}/{len(plan.segments)} segments already done")
    fanout = Fanout.of(spec) if spec.finetune.tasks else None
    if fanout:
        say_planned(ctx)
    table = paths.table(storage.FINETUNE_FILE)
    scheduler = Scheduler(fanout, slots=spec.run.resources.max_concurrent, experiment=storage.join(paths.root, "finetune"),
                          table=table, console=ctx.console, done=lambda: trials_done(table),
                          policy=FailurePolicy.of(spec.sweep))
    with Watch({}, ctx.console) as watch:  # a line per running segment every few seconds
        segments = SweepSegments(ctx, clock, todo, done, watch)
        if spec.sweep.stages == "by_size":  # a size starts once the smaller ones and their fine-tuning are done
            segments.gate = SizeStages(paths, plan, spec.sweep.decide_probability, done, console=ctx.console,
                                       finetuning_open=lambda: bool(scheduler.jobs) or scheduler.error is not None)
        try:
            rows = scheduler.run(segments if todo else None,
                                 lambda: control_sources(ctx) + finetune_sources(ctx, done))  # the controls first
        finally:
            if todo:
                clock.spans["pretraining"] = segments.last_end - segments.began
                clock.most_at_once = scheduler.most
            if fanout:
                clock.spans["fine-tuning"] = scheduler.finetuning_ended - scheduler.began
    for sid in done_before:  # rows of segments an earlier invocation finished but was interrupted before recording
        record_pretraining(ctx, plan.segments[sid])
        prune_checkpoints(ctx, plan.segments[sid])
    log_runs(ctx, done=done)  # and the W&B runs it finished but did not log
    return rows


class SweepSegments:
    """The sweep's segments as the scheduler runs them (raybiphase.sweep.scheduler.Pretraining): each try one Ray
    Train fit straight from the driver (no Tune trial stands between the driver and a segment: it would cost a
    process and the loop's imports again), its checkpoints committed in the segment's own folder, its progress
    watched, and, as it ends, recorded with the seconds of pretraining left. Each fit carries a guard
    (raybiphase.ray_internals.fit_guard) whose record, a local file of this driver's (Ray Train runs a fit's
    controller on the driver's node), says when the fit last showed a sign of life and lets a stalled fit be
    stopped."""

    def __init__(self, ctx: SweepContext, clock: Clock, todo: list[Segment], done: set[str], watch: Watch):
        self.ctx, self.clock, self.todo, self.done, self.watch = ctx, clock, todo, done, watch
        self.records = tempfile.TemporaryDirectory(prefix="raybiphase-fits-")
        self.hours = wall_hours(ctx.plan, ctx.spec)
        self.chain = remaining_chain(ctx.plan, self.hours)
        self.pace = EtaEstimator()
        self.began = self.last_end = time.perf_counter()
        self.gate: SizeStages | None = None  # sweep.stages by_size

    def ready(self, segment: Segment) -> bool:
        return (all(d in self.done for d in dependencies(segment, self.ctx.plan.runs))
                and (self.gate is None or self.gate.ready(segment)))

    def fit(self, segment: Segment, restarts: int) -> None:
        """The segment's TorchTrainer fit: Ray Train's run folder is the segment's own (<sweep>/runs/<segment>),
        where its workers commit each checkpoint and a restart resumes from the newest committed one."""
        record = self.record(segment)
        if os.path.exists(record):
            os.remove(record)  # an earlier try's
        make_trainer(segment_job(self.ctx, segment), max_failures=restarts,  # its controller runs on this node
                     callbacks=[ray_internals.fit_guard(record)]).fit()

    def record(self, segment: Segment) -> str:
        return os.path.join(self.records.name, f"{segment.id}.json")

    def committed(self, segment: Segment) -> int:
        location = latest_committed(self.ctx.paths.run_dir(segment.id))
        return -1 if location is None else storage.step_of(location)

    def last_sign(self, segment: Segment) -> float:
        """The newest of the fit's controller's signs of life (its start, a state change, a report) and rank 0's
        last progress beat (raybiphase.telemetry.progress.ProgressWriter: one every RAYBIPHASE_PROGRESS_S while it steps)."""
        seen = ray_internals.fit_record(self.record(segment)) or {}
        try:
            beat = storage.read_json(self.ctx.paths.progress(segment.id)) or {}
        except (OSError, ValueError):
            beat = {}
        return max(float(seen.get("time", 0.0)), float(beat.get("time", 0.0)))

    def stop(self, segment: Segment) -> bool:
        return ray_internals.stop_fit(self.record(segment))

    def started(self, segment: Segment, running: int) -> None:
        self.ctx.say(f"pretraining: starting {segment.id} ({running} running)")
        self.watch.locations[segment.id] = self.ctx.paths.progress(segment.id)

    def ended(self, segment: Segment, seconds: float | None, running: dict[str, float]) -> None:
        self.watch.drop(segment.id)  # its last line: where it ended
        self.last_end = time.perf_counter()
        if seconds is not None:
            self.pace.add(seconds, self.hours[segment.id])
            segment_ended(self.ctx, self.clock, segment, self.done, self.pace.eta(self.ctx, self.done, running,
                                                                                   self.hours))

    def sources(self, segments: set[str]):
        return finetune_sources(self.ctx, segments)


def segment_ended(ctx: SweepContext, clock: Clock, segment: Segment, done: set[str], eta: float | None) -> None:
    """A segment's rows, pruning, W&B curves and the sweep's progress line (with `eta`, the seconds of pretraining
    left), as soon as it ends."""
    record_pretraining(ctx, segment)
    prune_checkpoints(ctx, segment)
    clock.segments += 1
    clock.in_steps += step_seconds(ctx.history(segment), segment.start,
                                   segment.config.train.global_batch_tokens)
    log_runs(ctx, done=done)
    plan = ctx.plan
    done_steps = sum(plan.segments[s].steps for s in done)
    ctx.say(f"pretraining: {len(done)}/{len(plan.segments)} segments, {done_steps:,}/{plan.planned_steps:,} steps"
            + (f", about {eta / 60:.0f} min left (the critical path at the pace so far)" if eta else ""))


@dataclasses.dataclass
class EtaEstimator:
    """Seconds per estimated hour, measured on the segments that ended: it turns the timeline's critical path into
    an ETA."""

    seconds: float = 0.0
    hours: float = 0.0

    def add(self, seconds: float, hours: float) -> None:
        self.seconds, self.hours = self.seconds + seconds, self.hours + hours

    def eta(self, ctx: SweepContext, done: set[str], elapsed: dict[str, float], hours: dict[str, float]) -> float:
        """Seconds until the last segment ends: the simulated schedule of what is left (running segments need
        their estimate less what they ran), at this pace."""
        ratio = self.seconds / self.hours if self.hours else 0.0
        if not ratio:
            return 0.0
        left = {sid: max(0.0, hours[sid] - seconds / ratio) for sid, seconds in elapsed.items()}
        return simulate(ctx.plan, ctx.spec, done=frozenset(done), running=left).pretraining_hours * ratio


def segment_job(ctx: SweepContext, segment: Segment) -> SegmentJob:
    """Everything the workers of one segment need."""
    plan, paths = ctx.plan, ctx.paths
    run = segment.config
    source = plan.runs[segment.runs[0]].source  # continued pretraining: every segment names the source's weights
    if source:
        run = dataclasses.replace(run, model=dataclasses.replace(run.model, init_from=ctx.final_checkpoint(source)))
    parent = plan.segments[segment.parent] if segment.parent else None
    return SegmentJob(run=run, name=segment.id, run_dir=paths.run_dir(segment.id), data_dir=ctx.data_dir(run),
                      resume_from=paths.checkpoint(parent.id, parent.end) if parent else None, stop_at=segment.end,
                      exports=tuple(segment.exports),  # what every run through it fine-tunes, whichever `run` is
                      serves=tuple(segment.runs), progress_every=interval(),
                      wandb=segment_settings(ctx.spec, segment.id, parent=segment.parent, serves=segment.runs))


def checkpoint_policy(segment: Segment) -> CheckpointPolicy:
    """The segment's checkpoint policy: the one its workers train by (segment_job gives them the same config,
    end and exports), so what they saved as a milestone is what pruning keeps."""
    return CheckpointPolicy.of(segment.config, stop_at=segment.end, exports=segment.exports)


def prune_checkpoints(ctx: SweepContext, segment: Segment) -> list[int]:
    """After a segment is done, delete the checkpoints its policy does not keep (CheckpointPolicy.kept: the
    milestones and the last train.keep_checkpoints); returns the deleted steps."""
    if segment.config.train.keep_checkpoints is None or not ctx.segment_done(segment):
        return []
    steps = ctx.paths.checkpoint_steps(segment.id)
    kept = checkpoint_policy(segment).kept(steps)
    doomed = [step for step in steps if step not in kept]
    for step in doomed:
        storage.delete(ctx.paths.checkpoint(segment.id, step))
    return doomed


def record_pretraining(ctx: SweepContext, segment: Segment) -> int:
    """Rows for every run through the segment, one per report an uninterrupted run makes (a preemption notice's
    resume point is not one): (run, step) keyed, appended once."""
    paths, plan = ctx.paths, ctx.plan
    reports = {r["step"]: r for r in results(ctx.history(segment))}
    # a worker died between a checkpoint's commit and its history: the checkpoint's meta holds its report
    reports.update({r["step"]: r for r in results(checkpoint_reports(paths.run_dir(segment.id), set(reports)))})
    rows = [result_rows.pretrain_row(name, plan.runs[name].config, sweep=ctx.spec.sweep.name, segment=segment.id,
                                     report=report).record()
            for report in reports.values() if segment.start < report["step"] <= segment.end
            for name in segment.runs]
    return store.append_rows(paths.table(storage.PRETRAIN_FILE), rows, key=result_rows.PRETRAIN_KEY) if rows else 0


def log_runs(ctx: SweepContext, *, done: set[str]) -> None:
    """W&B (when sweep.wandb_project is set): one run per pretraining run whose segments are all `done`, with the
    reports of all its segments as one curve, each logged once: the runs logged are listed in the sweep's folder
    (SweepPaths.wandb_logged), so a run an interrupted invocation finished is logged by the next one, and none
    twice."""
    settings = sweep_settings(ctx.spec)
    if not settings:
        return
    logged = set(storage.read_json(ctx.paths.wandb_logged) or [])
    for run in ctx.plan.runs.values():
        if set(run.segments) <= done and run.name not in logged:
            segments = [ctx.plan.segments[s] for s in run.segments]
            history = [r for s in segments for r in results(ctx.history(s))
                       if s.start < r["step"] <= s.end]
            log_pretraining_run(settings, run.name, {**flatten(run.config), "lineage.segments": list(run.segments)},
                                history)
            logged.add(run.name)
            storage.write_json(ctx.paths.wandb_logged, sorted(logged))


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
