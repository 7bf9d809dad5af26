"""The command users run: `raybiphase sweep SPEC [--set k=v] [--dry-run]` (or `python -m raybiphase.sweep`).

SPEC is a sweep YAML (a base run plus `sweep.grid` / `sweep.runs`). The planner (raybiphase.sweep.plan) turns it into
a tree of shared segments; the driver fits every ready segment's TorchTrainer (resuming from its parent's
checkpoint) as soon as its dependencies are done and a slot is free, longest remaining chain first; the final (and
requested intermediate) checkpoints of every run go to the fine-tuning fan-out as their segments end, beside the
segments still training (raybiphase.sweep.finetuning); rows land in
<storage>/<sweep>/{pretrain,finetune,summary}.parquet and the report is drawn.

Run it again after an interruption and it continues: a segment whose end checkpoint exists is not rerun, a
segment cut short resumes from its latest checkpoint (Ray Train, same run name), a fine-tuning trial with a row is
not rerun, and no row is written twice. Works the same under `ray job submit` (joins the cluster in RAY_ADDRESS).
RAYBIPHASE_STORAGE, when set, overrides sweep.storage (the KubeRay job uses it).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import threading
import time

from raybiphase import storage
from raybiphase.checkpoint_meta import read_meta
from raybiphase.config import SweepSpec, flatten
from raybiphase.data import assets
from raybiphase.data.prepare import check_data, fingerprint, prepare
from raybiphase.errors import UserError
from raybiphase.finetune.heldout import evaluation_texts
from raybiphase.finetune.records import check_settings
from raybiphase.pretrain.export import write_card
from raybiphase.pretrain.job import SegmentJob
from raybiphase.pretrain.trainer import make_trainer
from raybiphase.raycluster import ensure_ray
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from raybiphase.results import wandb as results_wandb
from raybiphase.results.html import run_info
from raybiphase.results.report import write_report
from raybiphase.schedule import Schedule
from raybiphase.storage import SweepPaths
from raybiphase.pretrain.budget import check_budget, data_budget
from raybiphase.sweep.context import SweepContext
from raybiphase.sweep.finetuning import FinetuneStream, baseline_rows, finetune_sources
from raybiphase.sweep.plan import Plan, Segment, dependencies
from raybiphase.sweep.preflight import plan_sweep
from raybiphase.sweep.timeline import by_priority, remaining_chain, simulate, wall_hours
from raybiphase.telemetry.clock import Clock, step_seconds
from raybiphase.telemetry.history import read_history, results
from raybiphase.telemetry.progress import Watch, interval
from raybiphase.telemetry.wandb import log_pretraining_run, sweep_settings


def run_sweep(spec: SweepSpec, *, dry_run: bool = False, out=sys.stdout, spec_path: str = "") -> Plan:
    """Plan the spec (the dry run stops there), then prepare the data, pretrain every segment and, beside it,
    fine-tune every distinct checkpoint and the controls as they are ready, and draw the report; resumes where an
    earlier invocation stopped."""
    spec, plan = plan_sweep(spec, dry_run=dry_run, out=out)
    if dry_run:
        return plan
    clock = Clock()
    ctx = SweepContext(spec, plan, SweepPaths.of(spec.sweep.storage, spec.sweep.name), out=out)
    start(ctx, clock, spec_path)
    if spec.finetune.tasks:
        ctx.finetuning = FinetuneStream(ctx)
        ctx.finetuning.start()
    try:
        pretrain_all(ctx, clock)
    except Exception:
        if ctx.finetuning:  # what was ready is still fine-tuned (its records kept), then the failure is raised
            ctx.finetuning.close()
            ctx.finetuning.join(raise_error=False)
        raise
    if ctx.finetuning:
        finish_finetuning(ctx, clock)
    with clock.span("report"):
        finish(ctx.paths, spec, out=out, cards=finetune_sources(ctx))
    ctx.say(clock.summary())
    return plan


def start(ctx: SweepContext, clock: Clock, spec_path: str) -> None:
    """Everything before the first segment: storage checks (an unreachable bucket, trials recorded under other
    fine-tuning settings), Ray, the report's header, the data of every corpus and its budget."""
    spec, paths = ctx.spec, ctx.paths
    storage.check_writable(paths.root, "sweep.storage")  # an unreachable bucket fails here, before any work
    if spec.finetune.tasks:
        check_settings(paths.table(storage.FINETUNE_FILE), spec.finetune)
    interval()  # a bad RAYBIPHASE_PROGRESS_S is said now, not once segments run
    corpora = {fingerprint(run.config.data): run.config.data for run in ctx.plan.runs.values()}
    for data in corpora.values():  # a bad source or tokenizer, a missing or corrupt shard: said before Ray starts
        check_data(data, storage_root=spec.sweep.storage)
    assets.use_mirror(spec.sweep.storage)  # nodes without the offline assets copy them from the bucket
    with clock.span("Ray start"):
        ensure_ray()
    with clock.span("data"):
        for key, data in corpora.items():
            ctx.data_dirs[key] = prepare(data, storage_root=spec.sweep.storage, evaluation_texts=evaluation_texts)
    check_budget(data_budget(ctx.plan, spec))  # again on the prepared manifests: a stated size is an estimate
    storage.write_json(paths.run_info, run_info(spec_path, spec.finetune))  # the report's header


def finish_finetuning(ctx: SweepContext, clock: Clock) -> None:
    """Wait for the trials still running or queued once pretraining is over, then the baselines' rows."""
    stream = ctx.finetuning
    stream.close()
    rows = stream.join()
    baselines = baseline_rows(ctx.spec)
    if baselines:
        store.append_rows(ctx.paths.table(storage.FINETUNE_FILE), baselines, key=result_rows.FINETUNE_KEY)
    ctx.say(f"fine-tuning: {len(rows) + len(baselines)} rows recorded")
    clock.spans["fine-tuning"] = stream.seconds
    ran = trials_run(rows)
    clock.trials, clock.in_trials = len(ran), sum(r.get("seconds") or 0.0 for r in ran)


def trials_run(rows: list[dict]) -> list[dict]:
    """The fan-out's rows of trials that ran: not the copies given to runs sharing a checkpoint (`trials_of`),
    which would count a trial, and its seconds, once per run."""
    return [r for r in rows if r["source"] == result_rows.OURS and not r.get("trials_of")]


def pretrain_all(ctx: SweepContext, clock: Clock) -> None:
    """Every segment not yet done, each started as soon as its dependencies are done and one of
    `resources.max_concurrent` slots is free, longest remaining chain first (raybiphase.sweep.timeline); each is
    recorded and pruned as it ends, with a line saying how far the sweep is."""
    plan = ctx.plan
    done = {s.id for s in plan.segments.values() if ctx.segment_done(s)}
    todo = [s for s in plan.segments.values() if s.id not in done]
    ctx.say(f"pretraining: {len(done)}/{len(plan.segments)} segments already done")
    if ctx.finetuning:
        ctx.finetuning.segments_done(done)  # their checkpoints' trials start now
    if todo:
        with clock.span("pretraining"), Watch({}, out=ctx.out) as watch:  # a line per running segment every few s
            clock.most_at_once = run_segments(ctx, todo, done, watch,
                                              lambda segment, eta: segment_ended(ctx, clock, segment, done, eta))
    for s in plan.segments.values():  # rows of segments finished by an earlier, interrupted invocation
        record_pretraining(ctx, s)
        prune_checkpoints(ctx, s)


def segment_ended(ctx: SweepContext, clock: Clock, segment: Segment, done: set[str], eta: float | None) -> None:
    """A segment's rows, pruning, W&B curves and the sweep's progress line (with `eta`, the seconds of pretraining
    left), as soon as it ends."""
    record_pretraining(ctx, segment)
    prune_checkpoints(ctx, segment)
    if ctx.finetuning:
        ctx.finetuning.segments_done(done)  # its checkpoints' trials start beside the segments still training
    clock.segments += 1
    clock.in_steps += step_seconds(read_history(ctx.paths.run_dir(segment.id)), segment.start,
                                   segment.config.train.global_batch_tokens)
    log_runs(ctx, finished={segment.id}, done=done)
    plan = ctx.plan
    done_steps = sum(plan.segments[s].steps for s in done)
    ctx.say(f"pretraining: {len(done)}/{len(plan.segments)} segments, {done_steps:,}/{plan.planned_steps:,} steps"
            + (f", about {eta / 60:.0f} min left (the critical path at the pace so far)" if eta else ""))


def run_segments(ctx: SweepContext, todo: list[Segment], done: set[str], watch: Watch, ended) -> int:
    """Fit `todo`'s segments straight from the driver (no Tune trial stands between the driver and a segment: it
    would cost a process and the loop's imports again): a segment starts when its dependencies are in `done` and
    fewer than `resources.max_concurrent` run, longest remaining chain first, in a thread of its own when several
    may run (Ray Train drives a fit from any thread), else in this one (Ray Train's Ctrl-C handler then aborts it
    gracefully); `ended(segment, eta)` runs in this thread as each one finishes, with the seconds of pretraining
    left (`eta`). After a failure no segment starts; the first failure is raised once the running ones have ended.
    Returns how many segments ran at once at most."""
    plan, limit = ctx.plan, ctx.spec.resources.max_concurrent
    hours = wall_hours(plan, ctx.spec)
    chain = remaining_chain(plan, hours)
    errors: dict[str, BaseException] = {}
    running: dict[str, threading.Thread] = {}
    started: dict[str, float] = {}
    pending, most, pace = list(todo), 0, Pace()

    def fit(segment: Segment) -> None:
        try:
            make_trainer(segment_job(ctx, segment), max_failures=2).fit()  # its controller runs on this node
        except Exception as err:  # reported once every running segment has ended
            errors[segment.id] = err

    while pending or running:
        ready = [s for s in pending if all(d in done for d in dependencies(s, plan.runs))]
        for segment in by_priority(ready, chain)[:max(0, limit - len(running))] if not errors else ():
            ctx.say(f"pretraining: starting {segment.id} ({len(running) + 1} running)")
            watch.locations[segment.id] = ctx.paths.progress(segment.id)
            pending.remove(segment)
            running[segment.id] = threading.Thread(target=fit, args=(segment,), daemon=True)
            started[segment.id], most = time.time(), max(most, len(running))
            if ctx.finetuning:
                ctx.finetuning.segments_running(len(running))
            if limit == 1:
                fit(segment)  # the main thread
            else:
                running[segment.id].start()
        if not running:
            break  # a failure stopped the starts, and nothing runs any more
        alive = [thread for thread in running.values() if thread.is_alive()]
        if alive:
            alive[0].join(timeout=0.5)  # short joins: Ctrl-C still reaches this thread
        for sid in [sid for sid, thread in running.items() if not thread.is_alive()]:
            del running[sid]
            if ctx.finetuning:
                ctx.finetuning.segments_running(len(running))
            watch.drop(sid)  # its last line: where it ended
            if sid not in errors:
                done.add(sid)
                pace.add(time.time() - started[sid], hours[sid])
                ended(plan.segments[sid], pace.eta(ctx, done, {s: time.time() - started[s] for s in running}, hours))
    if errors:
        first = next(s.id for s in todo if s.id in errors)
        text = str(errors[first]).strip()
        ctx.say(f"pretraining: {first} failed:\n{text}")  # whole: Ray Train puts the workers' errors after line one
        lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(errors[first]).__name__]
        causes = [line for line in lines[1:] if re.match(r"^[\w.]*(Error|Exception)\b", line)]
        message = lines[0] + (f" {causes[-1]}" if causes else "")
        raise UserError(f"sweep: {len(errors)} segment(s) failed, first: {first}: {message}")
    return most


@dataclasses.dataclass
class Pace:
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
                      serves=tuple(segment.runs), progress_every=interval())
    # W&B gets one run per pretraining run from the driver (log_runs), not one per segment: no `wandb` here


def kept_steps(plan: Plan, segment: Segment) -> set[int]:
    """The steps of a segment whose checkpoints are always kept: its end (a resume or a child segment starts
    there), and for every run through it the phase boundaries, the decay start and the HF exports."""
    keep = {segment.end}
    for name in segment.runs:
        config = plan.runs[name].config
        schedule = Schedule.from_config(config)
        keep |= {*schedule.boundaries, schedule.decay_start, *config.train.export_steps}
    return {step for step in keep if segment.start < step <= segment.end}


def prune_checkpoints(ctx: SweepContext, segment: Segment) -> list[int]:
    """After a segment is done, delete the periodic checkpoints beyond train.keep_checkpoints (the last N are
    kept, and every one of `kept_steps`); returns the deleted steps."""
    keep_last = segment.config.train.keep_checkpoints
    if keep_last is None or not ctx.segment_done(segment):
        return []
    steps = ctx.paths.checkpoint_steps(segment.id)
    protected = kept_steps(ctx.plan, segment) | set(steps[len(steps) - keep_last:] if keep_last else [])
    doomed = [step for step in steps if step not in protected]
    for step in doomed:
        storage.delete(ctx.paths.checkpoint(segment.id, step))
    return doomed


def record_pretraining(ctx: SweepContext, segment: Segment) -> int:
    """Rows for every run through the segment, one per report an uninterrupted run makes (a preemption notice's
    resume point is not one): (run, step) keyed, appended once."""
    paths, plan = ctx.paths, ctx.plan
    reports = {r["step"]: r for r in results(read_history(paths.run_dir(segment.id)))}
    end = paths.checkpoint(segment.id, segment.end)
    if segment.end not in reports and storage.is_checkpoint(end):  # the driver died between checkpoint and history
        reports[segment.end] = {**read_meta(end).metrics, "checkpoint": end}
    rows = [result_rows.pretrain_row(name, plan.runs[name].config, sweep=ctx.spec.sweep.name, segment=segment.id,
                                     report=report).record()
            for report in reports.values() if segment.start < report["step"] <= segment.end
            for name in segment.runs]
    return store.append_rows(paths.table(storage.PRETRAIN_FILE), rows, key=result_rows.PRETRAIN_KEY) if rows else 0


def log_runs(ctx: SweepContext, *, finished: set[str], done: set[str]) -> None:
    """W&B (when sweep.wandb_project is set): one run per pretraining run that `finished` completed, with the
    reports of all its segments as one curve."""
    settings = sweep_settings(ctx.spec)
    for run in ctx.plan.runs.values() if settings else ():
        if set(run.segments) <= done and finished & set(run.segments):
            segments = [ctx.plan.segments[s] for s in run.segments]
            history = [r for s in segments for r in results(read_history(ctx.paths.run_dir(s.id)))
                       if s.start < r["step"] <= s.end]
            log_pretraining_run(settings, run.name, flatten(run.config), history)


def finish(paths: SweepPaths, spec: SweepSpec, out=sys.stdout, cards=()) -> None:
    """summary.parquet, the model card of every export in `cards` (FinetuneSources: with their scores), the report,
    and W&B when configured."""
    if storage.exists(paths.table(storage.FINETUNE_FILE)):
        store.write_summary(paths.root)
    summary = store.read_table(paths.table(storage.SUMMARY_FILE))  # once, for every card
    for source in cards:
        write_card(source.hf_dir, storage.parent(source.hf_dir), name=source.run, summary=summary)
    path, _ = write_report(paths.root)
    results_wandb.log_report(paths.root, spec.sweep.wandb_project, spec.sweep.name)
    print(f"report: {path}", file=out)
