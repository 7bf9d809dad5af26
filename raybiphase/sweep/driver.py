"""The command users run: `python -m raybiphase.sweep SPEC [--set k=v] [--dry-run]`.

SPEC is a sweep YAML (a base run plus `sweep.grid` / `sweep.runs`). The planner (raybiphase.sweep.plan) turns it into
a tree of shared segments; Ray Tune runs every ready segment as a trial that builds and fits a TorchTrainer
(resuming from its parent's checkpoint), wave after wave in dependency order; the final (and requested
intermediate) checkpoints of every run then go to the fine-tuning fan-out; rows land in
<storage>/<sweep>/{pretrain,finetune,summary}.parquet and the report is drawn.

Run it again after an interruption and it continues: a segment whose end checkpoint exists is not rerun, a
segment cut short resumes from its latest checkpoint (Ray Train, same run name), a fine-tuning trial with a row is
not rerun, and no row is written twice. Works the same under `ray job submit` (joins the cluster in RAY_ADDRESS).
RAYBIPHASE_STORAGE, when set, overrides sweep.storage (the KubeRay job uses it).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from raybiphase.cli import UserError, config_parser, run_main
from raybiphase.config import Config, load_config, to_dict
from raybiphase.sweep.plan import Plan, Segment, dependencies, describe, make_plan

CHECKPOINT = "step-{:08d}"


def _fs_exists(uri: str) -> bool:
    import pyarrow.fs

    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    return fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound


def checkpoint_uri(root: str, segment_id: str, step: int) -> str:
    return f"{root}/runs/{segment_id}/{CHECKPOINT.format(step)}"


def _read_json(uri: str) -> dict | None:
    import json

    import pyarrow.fs

    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    if fs.get_file_info(path).type == pyarrow.fs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as handle:
        return json.loads(handle.read().decode())


def segment_done(root: str, segment: Segment) -> bool:
    return _fs_exists(checkpoint_uri(root, segment.id, segment.end) + "/meta.json")


def segment_job(plan: Plan, segment: Segment, root: str, data_dirs: dict[str, str]) -> dict:
    """Everything a Tune trial needs to run one segment (plain data: it travels in Tune's param space)."""
    from raybiphase.data.prepare import fingerprint

    config = to_dict(segment.config)
    if segment.after_run:  # continued pretraining: weights of the source run's final checkpoint
        source_last = plan.segments[plan.runs[segment.after_run].segments[-1]]
        config["model"]["init_from"] = checkpoint_uri(root, source_last.id, source_last.end)
    parent = plan.segments[segment.parent] if segment.parent else None
    return {
        "segment": segment.id,
        "config": config,
        "data_dir": data_dirs[fingerprint(segment.config.data)],
        "resume_from": checkpoint_uri(root, parent.id, parent.end) if parent else None,
        "stop_at": segment.end,
        "root": root,
    }


def segment_trainable(job: dict) -> None:
    """A Tune trial: fit one segment's TorchTrainer, forwarding its reports to Tune."""
    from ray.tune.integration.ray_train import TuneReportCallback

    from raybiphase.config import config_from_dict
    from raybiphase.pretrain.trainer import make_trainer

    cfg = config_from_dict(job["config"])
    trainer = make_trainer(cfg, name=job["segment"], data_dir=job["data_dir"], resume_from=job["resume_from"],
                           max_failures=2, callbacks=[TuneReportCallback()], stop_at=job["stop_at"])
    trainer.fit()


def run_wave(plan: Plan, wave: list[Segment], root: str, data_dirs: dict[str, str], spec: Config) -> None:
    from ray import tune

    jobs = [segment_job(plan, s, root, data_dirs) for s in wave]
    tuner = tune.Tuner(
        tune.with_resources(segment_trainable, {"cpu": 0.01}),
        param_space=tune.grid_search(jobs) if len(jobs) > 1 else jobs[0],
        tune_config=tune.TuneConfig(max_concurrent_trials=spec.resources.max_concurrent,
                                    trial_dirname_creator=lambda trial: trial.config["segment"],
                                    trial_name_creator=lambda trial: trial.config["segment"]),
        run_config=tune.RunConfig(name="segments", storage_path=root + "/tune", verbose=0),
    )
    results = tuner.fit()
    failed = [r for r in results if r.error]
    if failed:
        raise UserError(f"sweep: {len(failed)} segment(s) failed, first: {failed[0].config['segment']}: "
                        f"{str(failed[0].error).splitlines()[0]}")


def record_pretraining(plan: Plan, segment: Segment, root: str, spec: Config) -> int:
    """Rows for every run through the segment, one per report: (run, step) keyed, appended once."""
    from raybiphase.results import store as results
    from raybiphase.pretrain.trainer import read_history

    reports = {r["step"]: r for r in read_history(f"{root}/runs/{segment.id}")}
    end = _read_json(checkpoint_uri(root, segment.id, segment.end) + "/meta.json")
    if end and segment.end not in reports:  # the driver died between the checkpoint and its history entry
        reports[segment.end] = {**end["metrics"], "checkpoint": checkpoint_uri(root, segment.id, segment.end)}
    rows = []
    for report in reports.values():
        if not segment.start < report["step"] <= segment.end:
            continue
        for name in segment.runs:
            run = plan.runs[name]
            row = {"run": name, "sweep": spec.sweep.name, "segment": segment.id, **_columns(run.config),
                   "clm_share": _clm_share(run.config)}
            row.update({k: v for k, v in report.items() if not isinstance(v, (dict, list))})
            row.setdefault("checkpoint", "")
            rows.append(row)
    return results.append_rows(f"{root}/pretrain.parquet", rows, key=results.PRETRAIN_KEY) if rows else 0


def _columns(cfg: Config) -> dict:
    from raybiphase.config import flatten

    return {k: (str(v) if isinstance(v, (list, dict)) else v) for k, v in flatten(cfg).items() if not k.startswith("sweep.")}


def _clm_share(cfg: Config) -> float:
    phases = cfg.phases.resolved()
    return sum(p.steps for p in phases if p.objective == "clm") / sum(p.steps for p in phases)


def run_sweep(spec: Config, *, dry_run: bool = False, out=sys.stdout) -> Plan:
    from raybiphase.config import replace

    if "://" not in spec.sweep.storage:  # trials run elsewhere (another directory, another node): pin the path
        spec = replace(spec, {"sweep.storage": str(Path(spec.sweep.storage).expanduser().resolve())})
    plan = make_plan(spec)
    text = describe(plan, spec)
    print(text if dry_run else "\n".join(text.splitlines()[:1] + text.splitlines()[-2:-1]), file=out)
    if dry_run:
        return plan
    from raybiphase.data.prepare import fingerprint, prepare
    from raybiphase.pretrain.trainer import storage_root
    from raybiphase.raycluster import ensure_ray

    root = storage_root(spec)
    ensure_ray()
    data_dirs = {}
    for run in plan.runs.values():
        key = fingerprint(run.config.data)
        if key not in data_dirs:
            data_dirs[key] = str(prepare(run.config.data))
    done = {s.id for s in plan.segments.values() if segment_done(root, s)}
    todo = [s for s in plan.segments.values() if s.id not in done]
    total_steps, done_steps = plan.planned_steps, sum(plan.segments[s].steps for s in done)
    started, steps_now = time.time(), 0
    print(f"pretraining: {len(done)}/{len(plan.segments)} segments already done", file=out)
    while todo:
        wave = [s for s in todo if all(d in done for d in dependencies(s, plan.runs))]
        print(f"pretraining: running {len(wave)} segment(s): {', '.join(s.id for s in wave)}", file=out, flush=True)
        run_wave(plan, wave, root, data_dirs, spec)
        for s in wave:
            record_pretraining(plan, s, root, spec)
            done.add(s.id)
            done_steps += s.steps
            steps_now += s.steps
        todo = [s for s in todo if s.id not in done]
        eta = (time.time() - started) / steps_now * (total_steps - done_steps)
        print(f"pretraining: {len(done)}/{len(plan.segments)} segments, {done_steps:,}/{total_steps:,} steps"
              + (f", about {eta / 60:.0f} min left" if todo else ""), file=out, flush=True)
    for s in plan.segments.values():  # rows of segments finished by an earlier, interrupted invocation
        record_pretraining(plan, s, root, spec)
    if spec.finetune.tasks:
        run_finetuning(plan, root, spec, out=out)
    finish(root, spec, out=out)
    return plan


def finetune_checkpoints(plan: Plan, root: str, spec: Config) -> list[dict]:
    """Every run's final checkpoint and its requested intermediate ones (train.export_steps), as fan-out inputs."""
    out = []
    for run in plan.runs.values():
        steps = sorted({*[s for s in run.config.train.export_steps if s < run.steps], run.steps})
        for step in steps:
            seg = next(plan.segments[s] for s in run.segments if plan.segments[s].start < step <= plan.segments[s].end)
            out.append({"run": f"{run.name}@{step}", "hf_dir": checkpoint_uri(root, seg.id, step) + "/hf",
                        "columns": {**_columns(run.config), "clm_share": _clm_share(run.config)}})
    return out


def run_finetuning(plan: Plan, root: str, spec: Config, out=sys.stdout) -> int:
    """The fan-out over every checkpoint x task x LR x seed; rows appended once to finetune.parquet."""
    from raybiphase.results import store as results
    from raybiphase.finetune.fanout import run_fanout

    path = f"{root}/{results.FINETUNE_FILE}"
    done = {(f"{run}@{step}", task, lr, seed) for run, step, task, lr, seed, source
            in results.done_keys(path, results.FINETUNE_KEY) if source == "raybiphase"}
    checkpoints = finetune_checkpoints(plan, root, spec)
    total = len(checkpoints) * len(spec.finetune.tasks) * len(spec.finetune.lrs) * len(spec.finetune.seeds)
    print(f"fine-tuning: {len(done)}/{total} trials already done; running the rest "
          f"({'ASHA' if spec.finetune.asha else 'full grid'})", file=out, flush=True)
    rows = run_fanout(checkpoints, spec, storage=root, name="finetune", done=done)
    for row in rows:
        run, step = row["run"].rsplit("@", 1)
        row.update(run=run, pretrain_step=int(step), source="raybiphase", sweep=spec.sweep.name)
    rows += bm25_rows(spec)
    results.append_rows(path, rows, key=results.FINETUNE_KEY) if rows else None
    print(f"fine-tuning: {len(rows)} trials recorded", file=out, flush=True)
    return len(rows)


def bm25_rows(spec: Config) -> list[dict]:
    """A BM25 baseline row for each retrieval task, on the same test split (appended once: its key is fixed)."""
    from raybiphase.finetune.baselines import bm25_baseline
    from raybiphase.finetune.tasks import get_task

    rows = []
    for name in spec.finetune.tasks:
        task = get_task(name)
        if task.family == "IR":
            scores = bm25_baseline(name, max_examples=spec.finetune.max_examples)
            rows.append({**scores, "run": "bm25", "pretrain_step": 0, "lr": 0.0, "seed": 0, "family": "IR",
                         "source": "baseline", "sweep": spec.sweep.name, "val_score": float("nan"), "steps": 0,
                         "stopped_early": False, "seconds": 0.0, "checkpoint": ""})
    return rows


def finish(root: str, spec: Config, out=sys.stdout) -> None:
    """summary.parquet, the report, and W&B when configured."""
    from raybiphase.results import store as results
    from raybiphase.results import wandb as wandb_log
    from raybiphase.results.report import write_report

    if "://" in root:
        print(f"results: {root} (draw the report from a local copy: python -m raybiphase report DIR)", file=out)
        return
    if _fs_exists(f"{root}/{results.FINETUNE_FILE}"):
        results.write_summary(root)
    path, _ = write_report(root)
    wandb_log.log_report(root, spec.sweep.wandb_project, spec.sweep.name)
    print(f"report: {path}", file=out)


def main() -> int:
    parser = config_parser("raybiphase sweep", "Plan and run a pretraining + fine-tuning sweep.")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (tree, steps, GPU-hours) and exit")
    args = parser.parse_args()
    overrides = list(args.overrides)
    if os.environ.get("RAYBIPHASE_STORAGE"):
        overrides.append(f"sweep.storage={os.environ['RAYBIPHASE_STORAGE']}")
    spec = load_config(args.config, overrides)
    run_sweep(spec, dry_run=args.dry_run)
    return 0


if __name__ == "__main__":
    run_main(main)
