"""The command users run: `raybiphase sweep SPEC [--set k=v] [--dry-run]` (or `python -m raybiphase.sweep`).

SPEC is a sweep YAML (a base run plus `sweep.grid` / `sweep.runs`). The planner (raybiphase.sweep.plan) turns it into
a tree of shared segments; the driver fits every ready segment's TorchTrainer (resuming from its parent's
checkpoint), wave after wave in dependency order; the final (and requested
intermediate) checkpoints of every run then go to the fine-tuning fan-out; rows land in
<storage>/<sweep>/{pretrain,finetune,summary}.parquet and the report is drawn.

Run it again after an interruption and it continues: a segment whose end checkpoint exists is not rerun, a
segment cut short resumes from its latest checkpoint (Ray Train, same run name), a fine-tuning trial with a row is
not rerun, and no row is written twice. Works the same under `ray job submit` (joins the cluster in RAY_ADDRESS).
RAYBIPHASE_STORAGE, when set, overrides sweep.storage (the KubeRay job uses it).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

from raybiphase import storage
from raybiphase.errors import UserError
from raybiphase.config import SweepSpec, to_dict
from raybiphase.results import rows as result_rows
from raybiphase.storage import SweepPaths, join
from raybiphase.sweep.budget import check_budget, data_budget
from raybiphase.sweep.preflight import plan_sweep
from raybiphase.telemetry.clock import step_seconds
from raybiphase.sweep.plan import Plan, Segment, dependencies
from raybiphase.telemetry.progress import PROGRESS_FILE, Watch
from raybiphase.data.prepare import fingerprint, prepare
from raybiphase.config import RunConfig, flatten, from_dict
from raybiphase.pretrain.trainer import make_trainer
from raybiphase.pretrain.schedule import Schedule
from raybiphase.pretrain.checkpoint import read_meta
from raybiphase.telemetry.history import read_history
from raybiphase.results import store, wandb as wandb_log
from raybiphase.telemetry.wandb import log_pretraining_run, sweep_settings
from raybiphase.finetune.tasks import get_task
from raybiphase.raycluster import ensure_ray
from raybiphase.data import assets
from raybiphase.telemetry.clock import Clock
from raybiphase.results.html import RUN_INFO, run_info
from raybiphase.finetune.fanout import check_settings, plan_trials, run_fanout
from raybiphase.finetune.baselines import bm25_baseline, majority_baseline
from raybiphase.pretrain.export import write_card
from raybiphase.results.store import read_table
from raybiphase.results.report import write_report
from raybiphase.pretrain.loop import export_initial


def segment_done(paths: SweepPaths, segment: Segment) -> bool:
    return storage.is_checkpoint(paths.checkpoint(segment.id, segment.end))


def final_checkpoint(plan: Plan, paths: SweepPaths, run: str) -> str:
    last = plan.segments[plan.runs[run].segments[-1]]
    return paths.checkpoint(last.id, last.end)


def segment_job(plan: Plan, segment: Segment, paths: SweepPaths, data_dirs: dict[str, str],
                spec: SweepSpec) -> dict:
    """Everything the fit of one segment needs (plain data)."""

    run = to_dict(segment.config)
    source = plan.runs[segment.runs[0]].source  # continued pretraining: every segment names the source's weights
    if source:
        run["model"]["init_from"] = final_checkpoint(plan, paths, source)
    parent = plan.segments[segment.parent] if segment.parent else None
    return {
        "segment": segment.id,
        "run": run,
        "data_dir": data_dirs[fingerprint(segment.config.data)],
        "resume_from": paths.checkpoint(parent.id, parent.end) if parent else None,
        "stop_at": segment.end,
        "exports": segment.exports,  # what every run through it fine-tunes, whichever run `config` is
        "serves": segment.runs,
        "root": paths.root,
        "wandb": None,  # W&B gets one run per pretraining run from the driver (log_runs), not one per segment
    }


def fit_segment(job: dict) -> None:
    """Fit one segment's TorchTrainer from this process (its controller runs on this node; a failure raises)."""

    make_trainer(from_dict(RunConfig, job["run"]), name=job["segment"], paths=SweepPaths(job["root"]),
                 data_dir=job["data_dir"], resume_from=job["resume_from"], stop_at=job["stop_at"],
                 exports=job["exports"], serves=job["serves"], wandb=job["wandb"], max_failures=2).fit()


def run_wave(plan: Plan, wave: list[Segment], paths: SweepPaths, data_dirs: dict[str, str], spec: SweepSpec) -> None:
    """Fit the wave's segments, `resources.max_concurrent` at a time, straight from the driver: one thread per
    running segment when several run at once (Ray Train drives a fit from any thread). No Tune trial stands between
    the driver and a segment: each would cost a process and the loop's imports again (seconds per wave)."""
    jobs = [segment_job(plan, s, paths, data_dirs, spec) for s in wave]
    errors: dict[str, BaseException] = {}

    def fit(job: dict) -> None:
        try:
            fit_segment(job)
        except Exception as err:  # reported once every running segment has ended
            errors[job["segment"]] = err

    limit = spec.resources.max_concurrent
    if limit == 1 or len(jobs) == 1:
        for job in jobs:  # the main thread: Ray Train's Ctrl-C handler aborts the run gracefully
            fit(job)
    else:
        pending, running = list(jobs), []
        while pending or running:
            while pending and len(running) < limit:
                running.append(threading.Thread(target=fit, args=(pending.pop(0),), daemon=True))
                running[-1].start()
            running[0].join(timeout=0.5)  # short joins: Ctrl-C still reaches this thread
            running = [t for t in running if t.is_alive()]
    if errors:
        first = next(job["segment"] for job in jobs if job["segment"] in errors)
        message = (str(errors[first]).strip().splitlines() or [type(errors[first]).__name__])[0]
        raise UserError(f"sweep: {len(errors)} segment(s) failed, first: {first}: {message}")


def kept_steps(plan: Plan, segment: Segment) -> set[int]:
    """The steps of a segment whose checkpoints are always kept: its end (a resume or a child segment starts
    there), and for every run through it the phase boundaries, the decay start and the HF exports."""

    keep = {segment.end}
    for name in segment.runs:
        config = plan.runs[name].config
        schedule = Schedule.from_config(config)
        keep |= {*schedule.boundaries, schedule.decay_start, *config.train.export_steps}
    return {step for step in keep if segment.start < step <= segment.end}


def prune_checkpoints(plan: Plan, segment: Segment, paths: SweepPaths) -> list[int]:
    """After a segment is done, delete the periodic checkpoints beyond train.keep_checkpoints (the last N are
    kept, and every one of `kept_steps`); returns the deleted steps."""
    keep_last = segment.config.train.keep_checkpoints
    if keep_last is None or not segment_done(paths, segment):
        return []
    folder = paths.run_dir(segment.id)
    steps = sorted(int(name.rsplit("-", 1)[1]) for name in storage.list_folders(folder)
                   if name.startswith("step-") and name.rsplit("-", 1)[1].isdigit())
    protected = kept_steps(plan, segment) | set(steps[len(steps) - keep_last:] if keep_last else [])
    doomed = [step for step in steps if step not in protected]
    for step in doomed:
        storage.delete(paths.checkpoint(segment.id, step))
    return doomed


def record_pretraining(plan: Plan, segment: Segment, paths: SweepPaths, spec: SweepSpec) -> int:
    """Rows for every run through the segment, one per report: (run, step) keyed, appended once."""

    reports = {r["step"]: r for r in read_history(paths.run_dir(segment.id))}
    end = paths.checkpoint(segment.id, segment.end)
    if segment.end not in reports and storage.is_checkpoint(end):  # the driver died between checkpoint and history
        reports[segment.end] = {**read_meta(end).metrics, "checkpoint": end}
    rows = [result_rows.pretrain_row(name, plan.runs[name].config, sweep=spec.sweep.name, segment=segment.id,
                                     report=report).record()
            for report in reports.values() if segment.start < report["step"] <= segment.end
            for name in segment.runs]
    return store.append_rows(paths.table(storage.PRETRAIN_FILE), rows, key=result_rows.PRETRAIN_KEY) if rows else 0


def log_runs(plan: Plan, paths: SweepPaths, spec: SweepSpec, *, finished: set[str], done: set[str]) -> None:
    """W&B (when sweep.wandb_project is set): one run per pretraining run that `finished` completed, with the
    reports of all its segments as one curve."""

    settings = sweep_settings(spec)
    for run in plan.runs.values() if settings else ():
        if set(run.segments) <= done and finished & set(run.segments):
            segments = [plan.segments[s] for s in run.segments]
            history = [r for s in segments for r in read_history(paths.run_dir(s.id)) if s.start < r["step"] <= s.end]
            log_pretraining_run(settings, run.name, flatten(run.config), history)


def run_sweep(spec: SweepSpec, *, dry_run: bool = False, out=sys.stdout, spec_path: str = "") -> Plan:
    spec, plan = plan_sweep(spec, dry_run=dry_run, out=out)
    if dry_run:
        return plan
    clock = Clock()
    paths = SweepPaths.of(spec.sweep.storage, spec.sweep.name)
    storage.check_writable(paths.root, "sweep.storage")  # an unreachable bucket fails here, before any work
    if spec.finetune.tasks:  # trials recorded under other fine-tuning settings: here too

        check_settings(paths.table(storage.FINETUNE_FILE), spec.finetune)
    assets.use_mirror(spec.sweep.storage)  # nodes without the offline assets copy them from the bucket
    with clock.span("Ray start"):
        ensure_ray()

    # the report's header: spec, code, hardware, the fine-tuning protocol's choices
    storage.write_json(join(paths.root, RUN_INFO), run_info(spec_path, spec.finetune))
    data_dirs = {}
    with clock.span("data"):
        for run in plan.runs.values():
            key = fingerprint(run.config.data)
            if key not in data_dirs:
                data_dirs[key] = prepare(run.config.data, storage_root=spec.sweep.storage)
    check_budget(data_budget(plan, spec))  # again on the prepared manifests: a stated size is an estimate
    done = {s.id for s in plan.segments.values() if segment_done(paths, s)}
    todo = [s for s in plan.segments.values() if s.id not in done]
    total_steps, done_steps = plan.planned_steps, sum(plan.segments[s].steps for s in done)
    started, steps_now = time.time(), 0
    print(f"pretraining: {len(done)}/{len(plan.segments)} segments already done", file=out)
    while todo:
        wave = [s for s in todo if all(d in done for d in dependencies(s, plan.runs))]
        print(f"pretraining: running {len(wave)} segment(s): {', '.join(s.id for s in wave)}", file=out, flush=True)
        watched = {s.id: join(paths.run_dir(s.id), PROGRESS_FILE) for s in wave}
        with clock.span("pretraining"), Watch(watched, out=out):  # a line per running segment every few seconds
            run_wave(plan, wave, paths, data_dirs, spec)
        clock.waves += 1
        for s in wave:
            record_pretraining(plan, s, paths, spec)
            prune_checkpoints(plan, s, paths)
            clock.segments += 1
            clock.in_steps += step_seconds(read_history(paths.run_dir(s.id)), s.start, s.config.train.global_batch_tokens)
            done.add(s.id)
            done_steps += s.steps
            steps_now += s.steps
        todo = [s for s in todo if s.id not in done]
        log_runs(plan, paths, spec, finished={s.id for s in wave}, done=done)
        eta = (time.time() - started) / steps_now * (total_steps - done_steps)
        print(f"pretraining: {len(done)}/{len(plan.segments)} segments, {done_steps:,}/{total_steps:,} steps"
              + (f", about {eta / 60:.0f} min left" if todo else ""), file=out, flush=True)
    for s in plan.segments.values():  # rows of segments finished by an earlier, interrupted invocation
        record_pretraining(plan, s, paths, spec)
        prune_checkpoints(plan, s, paths)
    if spec.finetune.tasks:
        with clock.span("fine-tuning"):
            rows = run_finetuning(plan, paths, spec, out=out, data_dirs=data_dirs)
        clock.trials = sum(r["source"] == result_rows.OURS for r in rows)
        clock.in_trials = sum(r.get("seconds") or 0.0 for r in rows if r["source"] == result_rows.OURS)
    with clock.span("report"):
        finish(paths, spec, out=out, cards=finetune_sources(plan, paths))
    print(clock.summary(), file=out, flush=True)
    return plan


def finetune_sources(plan: Plan, paths: SweepPaths) -> list[result_rows.FinetuneSource]:
    """One source per distinct checkpoint (plan.checkpoints: every run's final and train.export_steps ones), under
    the first run whose weights it holds; the other runs sharing it ride along in `shared_by` (their rows are
    copies: shared weights are fine-tuned once)."""
    out = []
    for (segment, step), names in plan.checkpoints().items():
        hf = storage.hf_dir(paths.checkpoint(segment, step))
        first, *others = (result_rows.FinetuneSource(name, step, hf, result_rows.config_columns(plan.runs[name].config))
                          for name in names)
        out.append(dataclasses.replace(first, shared_by=tuple(others)))
    return out


def control_sources(plan: Plan, paths: SweepPaths, data_dirs: dict) -> list[result_rows.FinetuneSource]:
    """The untrained controls (plan.controls): each one's step-0 weights exported once, under
    <sweep>/controls/<name>/hf (an `exported.json` beside it marks a finished export), as a source at step 0."""

    out = []
    for control in plan.controls.values():
        folder = join(paths.root, "controls", control.name)
        if not storage.exists(join(folder, "exported.json")):

            storage.delete(join(folder, "hf"))  # an export cut short, if any
            export_initial(control.config, data_dirs[fingerprint(control.config.data)], join(folder, "hf"))
            storage.write_json(join(folder, "exported.json"), {"runs": control.runs})
        out.append(result_rows.FinetuneSource(control.name, 0, join(folder, "hf"),
                                              result_rows.control_columns(control.config)))
    return out


def run_finetuning(plan: Plan, paths: SweepPaths, spec: SweepSpec, out=sys.stdout,
                   data_dirs: dict | None = None) -> list[dict]:
    """The fan-out over every checkpoint (the untrained controls too) x task x LR x seed; rows appended once to
    finetune.parquet (and returned)."""

    path = paths.table(storage.FINETUNE_FILE)
    done = {key[:-1] for key in store.done_keys(path, result_rows.FINETUNE_KEY) if key[-1] == result_rows.OURS}
    sources = control_sources(plan, paths, data_dirs or {}) + finetune_sources(plan, paths)
    planned = {t.key for t in plan_trials(sources, spec.finetune)}  # one set per distinct checkpoint
    already = planned & {result_rows.trial_key(dict(zip(result_rows.TRIAL_KEY, key))) for key in done}
    print(f"fine-tuning: {len(already)}/{len(planned)} trials already done; running the rest "
          f"({'ASHA' if spec.finetune.asha else 'full grid'})", file=out, flush=True)
    rows = run_fanout(sources, spec, storage=paths.root, name="finetune", done=done, out=out)
    rows += baseline_rows(spec)
    store.append_rows(path, rows, key=result_rows.FINETUNE_KEY) if rows else None
    print(f"fine-tuning: {len(rows)} trials recorded", file=out, flush=True)
    return rows


def baseline_rows(spec: SweepSpec) -> list[dict]:
    """Baseline rows on the same test splits (each appended once: its key is fixed): BM25 for every retrieval task
    (run "bm25"), the majority class for every sequence-classification task (run "majority")."""

    rows, caps = [], {"max_examples": spec.finetune.max_examples, "max_eval_examples": spec.finetune.max_eval_examples}
    for name in spec.finetune.tasks:
        family = get_task(name).family
        if family == "IR":
            rows.append(result_rows.baseline_row(bm25_baseline(name, **caps), run="bm25", family=family,
                                                 sweep=spec.sweep.name).record())
        elif family == "SC":
            rows.append(result_rows.baseline_row(majority_baseline(name, **caps), run="majority",
                                                 family=family, sweep=spec.sweep.name).record())
    return rows


def finish(paths: SweepPaths, spec: SweepSpec, out=sys.stdout, cards=()) -> None:
    """summary.parquet, the model card of every export in `cards` (FinetuneSources: with their scores), the report,
    and W&B when configured."""

    if storage.exists(paths.table(storage.FINETUNE_FILE)):
        store.write_summary(paths.root)
    summary = read_table(paths.table(storage.SUMMARY_FILE))  # once, for every card
    for source in cards:
        write_card(source.hf_dir, source.hf_dir.rstrip("/").rsplit("/", 1)[0], name=source.run, summary=summary)
    path, _ = write_report(paths.root)
    wandb_log.log_report(paths.root, spec.sweep.wandb_project, spec.sweep.name)
    print(f"report: {path}", file=out)
