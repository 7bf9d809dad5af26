"""A sweep's segment as a job of the scheduler, like a fine-tuning trial: one Ray Train fit whose value carries its rows.

A segment, from the plan to its rows:
- `SegmentFit.fit` (in a thread the scheduler starts once the segments it depends on are done) builds the segment's
  `SegmentJob` (`segment_job`) and fits its TorchTrainer: each worker runs raybiphase.pretrain.loop, committing
  its checkpoints in the segment's own folder. Rank 0's training function returns every report of that folder (its
  history's, so a restarted group's rank 0 returns the lost group's reports too), and the fit's value is a
  `FitValue`: those reports and the checkpoints Ray Train registered, each with the report it came with (the fit's
  `Result`).
- The scheduler's `finished` appends `SegmentFit.rows(value)` to pretrain.parquet ((run, step) keyed, once: a row
  per run through the segment and report an uninterrupted run makes); `SegmentFit.ended` prunes the checkpoints the
  workers' own checkpoint policy does not keep, logs W&B, says the sweep's progress line, and names the checkpoints
  now ready for fine-tuning.

Rows are read back from storage only to recover: from the segment's journal (history.json) where a fit's value holds
no reports, or for a segment an earlier invocation finished but did not record (`record_pretraining`, as the sweep
starts); and from a committed checkpoint's meta where neither holds its report (a worker lost between the
checkpoint's commit and its report).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable

from raybiphase import ray_internals, storage
from raybiphase.config import flatten
from raybiphase.finetune.spec import FinetuneSource
from raybiphase.planning.plan import Segment, dependencies
from raybiphase.planning.timeline import remaining_chain, simulate, wall_hours
from raybiphase.pretrain.checkpoint import latest_committed
from raybiphase.pretrain.job import SegmentJob
from raybiphase.pretrain.policy import CheckpointPolicy
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from raybiphase.sweep.context import SweepContext
from raybiphase.sweep.finetuning import finetune_sources
from raybiphase.telemetry.clock import Clock, step_seconds
from raybiphase.telemetry.history import checkpoint_reports, results
from raybiphase.telemetry.progress import Watch, interval
from raybiphase.telemetry.wandb import log_pretraining_run, sweep_settings
from raybiphase.telemetry.wandb_live import segment_settings


@dataclasses.dataclass(frozen=True)
class FitValue:
    """What a segment's successful fit hands back: its reports and its registered checkpoints."""

    reports: list[dict] | None
    """Every report rank 0 held at the fit's end, in step order (raybiphase.pretrain.loop.train_loop's return);
    None: the training function returned none."""
    checkpoints: dict[int, dict] = dataclasses.field(default_factory=dict)
    """step -> the report each checkpoint Ray Train registered was reported with."""

    @classmethod
    def of(cls, result) -> FitValue:
        """The value of a `ray.train.Result`: its `return_value`, and its `best_checkpoints` (every checkpoint of the
        run: the trainer keeps them all)."""
        checkpoints = {}
        for checkpoint, metrics in getattr(result, "best_checkpoints", None) or []:
            step = storage.step_of(checkpoint.path)
            if step is not None and isinstance(metrics, dict) and metrics.get("step") == step:
                checkpoints[step] = dict(metrics)
        reports = result.return_value
        return cls(list(reports) if isinstance(reports, list) else None, checkpoints)


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


def segment_reports(ctx: SweepContext, segment: Segment, value: FitValue | None = None) -> list[dict]:
    """The segment's reports, one per step: the fit's `value`'s (recovery: without a value, or a value holding no
    reports, the segment's journal, ctx.history), then the report of each checkpoint the value registered that
    they lack and, read from its meta, of each committed checkpoint still missing."""
    journal = value.reports if value is not None and value.reports is not None else ctx.history(segment)
    reports = {r["step"]: r for r in journal}
    run_dir = ctx.paths.run_dir(segment.id)
    for step, report in (value.checkpoints.items() if value is not None else ()):
        reports.setdefault(step, {**report, "checkpoint": storage.join(run_dir, storage.checkpoint_name(step))})
    # a worker lost between a checkpoint's commit and its report: the checkpoint's meta holds the report
    reports.update({r["step"]: r for r in checkpoint_reports(run_dir, set(reports))})
    return [reports[step] for step in sorted(reports)]


def pretrain_rows(ctx: SweepContext, segment: Segment, reports: list[dict]) -> list[dict]:
    """Rows for every run through the segment, one per report an uninterrupted run makes (a preemption notice's
    resume point is not one), within the segment's steps."""
    plan = ctx.plan
    return [result_rows.pretrain_row(name, plan.runs[name].config, sweep=ctx.spec.sweep.name, segment=segment.id,
                                     report=report).record()
            for report in results(reports) if segment.start < report["step"] <= segment.end
            for name in segment.runs]


def record_pretraining(ctx: SweepContext, segment: Segment) -> int:
    """The recovery path: a done segment's rows from its journal (and its committed checkpoints' metas), appended
    to pretrain.parquet, (run, step) keyed, once; returns how many of them were there already."""
    rows = pretrain_rows(ctx, segment, segment_reports(ctx, segment))
    return store.append_rows(ctx.paths.table(storage.PRETRAIN_FILE), rows, key=result_rows.PRETRAIN_KEY) if rows else 0


def prune_checkpoints(ctx: SweepContext, segment: Segment, policy: CheckpointPolicy) -> list[int]:
    """After a segment is done, delete the checkpoints `policy` (the one its workers saved by: its SegmentJob's)
    does not keep (CheckpointPolicy.kept: the milestones and the last train.keep_checkpoints); returns the deleted
    steps."""
    if segment.config.train.keep_checkpoints is None or not ctx.segment_done(segment):
        return []
    steps = ctx.paths.checkpoint_steps(segment.id)
    kept = policy.kept(steps)
    doomed = [step for step in steps if step not in kept]
    for step in doomed:
        storage.delete(ctx.paths.checkpoint(segment.id, step))
    return doomed


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


def recover(ctx: SweepContext, done: set[str]) -> None:
    """As the sweep starts: the rows and pruning of the `done` segments an earlier invocation finished but was
    interrupted before recording (each row once: appending again writes nothing), and the W&B runs it finished but
    did not log."""
    for sid in done:
        segment = ctx.plan.segments[sid]
        record_pretraining(ctx, segment)
        prune_checkpoints(ctx, segment, segment_job(ctx, segment).policy())
    log_runs(ctx, done=done)


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


class SweepPretraining:
    """What the sweep's segment jobs share: the watch of their progress lines, the pace that makes the ETA, the
    clock's counts, and the folder of their fit guards' records. `jobs` makes a `SegmentFit` per segment;
    `make_trainer` builds each fit's trainer (raybiphase.pretrain.trainer.make_trainer)."""

    def __init__(self, ctx: SweepContext, clock: Clock, watch: Watch, make_trainer: Callable):
        self.ctx, self.clock, self.watch, self.make_trainer = ctx, clock, watch, make_trainer
        self.records = tempfile.TemporaryDirectory(prefix="raybiphase-fits-")
        self.hours = wall_hours(ctx.plan, ctx.spec)
        self.chain = remaining_chain(ctx.plan, self.hours)
        self.pace = EtaEstimator()
        self.began = self.last_end = time.perf_counter()

    def jobs(self, segments: list[Segment]) -> list[SegmentFit]:
        return [SegmentFit(self, segment) for segment in segments]

    def seconds(self) -> float:
        """Wall seconds from the first segment's start to the last one's end."""
        return self.last_end - self.began


class SegmentFit:
    """One segment as the scheduler's job (module docstring): `after` (the segments it waits on), `chain` (its
    remaining critical path: the longest starts first), one fit per try, and its record once it ends. Each fit
    carries a guard (raybiphase.ray_internals.fit_guard) whose record, a local file of this driver's (Ray Train runs
    a fit's controller on the driver's node), says when the fit last showed a sign of life and lets a stalled fit be
    stopped."""

    def __init__(self, pretraining: SweepPretraining, segment: Segment):
        ctx = pretraining.ctx
        self.pretraining, self.ctx, self.segment, self.id = pretraining, ctx, segment, segment.id
        self.job = segment_job(ctx, segment)
        self.after = frozenset(dependencies(segment, ctx.plan.runs))
        self.chain = pretraining.chain[segment.id]
        self.table, self.key = ctx.paths.table(storage.PRETRAIN_FILE), result_rows.PRETRAIN_KEY
        self.record = os.path.join(pretraining.records.name, f"{segment.id}.json")

    def fit(self, restarts: int) -> FitValue:
        """One try: the segment's TorchTrainer fit, restarted by Ray Train at most `restarts` times. Ray Train's
        run folder is the segment's own (<sweep>/runs/<segment>), where its workers commit each checkpoint and a
        restart resumes from the newest committed one."""
        if os.path.exists(self.record):
            os.remove(self.record)  # an earlier try's
        trainer = self.pretraining.make_trainer(self.job, max_failures=restarts,  # its controller runs on this node
                                                callbacks=[ray_internals.fit_guard(self.record)])
        return FitValue.of(trainer.fit())

    def committed(self) -> int:
        """The step of the segment's newest committed checkpoint (-1: none): a failed fit's progress."""
        location = latest_committed(self.job.run_dir)
        return -1 if location is None else storage.step_of(location)

    def last_sign(self) -> float:
        """The newest of the fit's controller's signs of life (its start, a state change, a report) and rank 0's
        last progress beat (raybiphase.telemetry.progress.ProgressWriter: one every RAYBIPHASE_PROGRESS_S while it
        steps); 0.0: none seen."""
        seen = ray_internals.fit_record(self.record) or {}
        try:
            beat = storage.read_json(self.job.progress) or {}
        except (OSError, ValueError):
            beat = {}
        return max(float(seen.get("time", 0.0)), float(beat.get("time", 0.0)))

    def stop(self) -> bool:
        """Stop the running fit so that it raises; False when it cannot be stopped."""
        return ray_internals.stop_fit(self.record)

    def started(self, running: int) -> None:
        self.ctx.say(f"pretraining: starting {self.id} ({running} running)")
        self.pretraining.watch.locations[self.id] = self.job.progress

    def rows(self, value: FitValue) -> list[dict]:
        """The segment's pretrain.parquet rows from its fit's value (`segment_reports`); the reports are kept as the
        segment's history (ctx.history: the time summary and W&B read them, not the journal)."""
        reports = segment_reports(self.ctx, self.segment, value)
        if value.reports is not None:
            self.ctx.histories[self.id] = value.reports
        return pretrain_rows(self.ctx, self.segment, reports)

    def ended(self, seconds: float, running: dict[str, float], done: set[str]) -> None:
        """Once its rows are recorded (`done` includes it; `running`: how long each running segment has run): its
        pruning, W&B curves and the sweep's progress line (with the seconds of pretraining left at the pace so
        far)."""
        ctx, segment, shared = self.ctx, self.segment, self.pretraining
        self.try_over()
        prune_checkpoints(ctx, segment, self.job.policy())
        shared.clock.segments += 1
        shared.clock.in_steps += step_seconds(ctx.history(segment), segment.start,
                                              segment.config.train.global_batch_tokens)
        log_runs(ctx, done=done)
        shared.pace.add(seconds, shared.hours[self.id])
        eta = shared.pace.eta(ctx, done, running, shared.hours)
        plan = ctx.plan
        done_steps = sum(plan.segments[s].steps for s in done)
        ctx.say(f"pretraining: {len(done)}/{len(plan.segments)} segments, {done_steps:,}/{plan.planned_steps:,} steps"
                + (f", about {eta / 60:.0f} min left (the critical path at the pace so far)" if eta else ""))

    def sources(self) -> list[FinetuneSource]:
        """The checkpoints it holds, to fine-tune once it has ended."""
        return finetune_sources(self.ctx, {self.id})

    def try_over(self) -> None:
        """Its last try ended (it is done, or it failed for good): the watch says where it stopped, and pretraining's
        span ends here for now."""
        self.pretraining.watch.drop(self.id)
        self.pretraining.last_end = time.perf_counter()
