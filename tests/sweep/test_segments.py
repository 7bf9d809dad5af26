"""A segment as a job of the scheduler, without Ray: its fit's value (Ray Train's `Result`: rank 0's reports and the
checkpoints it registered) becomes its rows, appended once for every run through it by the loop's one `finished`;
its job prunes by its workers' checkpoint policy and says the sweep's progress line; only a value without reports
sends it back to its journal. The trainer here returns a real `ray.train.Result` without training;
tests/sweep/test_driver.py and test_faults.py fit real ones."""

from __future__ import annotations

import io
import json
from pathlib import Path

from raybiphase.config import SweepSpec, load
from raybiphase.planning.plan import make_plan


class _AnyData(dict):
    def __missing__(self, key):
        return "data"


class _Trainer:
    """What make_trainer returns, reduced to the `fit` a segment job calls: `result` at once."""

    def __init__(self, result, jobs: list):
        self.result, self.jobs = result, jobs

    def __call__(self, job, **kwargs):
        self.jobs.append((job, kwargs))
        return self

    def fit(self):
        return self.result


def _result(reports, registered, last=None):
    """A Ray Train Result as a fit returns it (`registered`: its checkpoints, step -> report), or one that lists
    none and names only a last checkpoint (`last`: its step)."""
    from ray.train import Checkpoint
    from ray.train.v2.api.result import Result

    def at(step):
        return Checkpoint(f"/somewhere/runs/segment/step-{step:08d}")

    if last is not None:
        return Result(metrics=registered[last], checkpoint=at(last), error=None, path=None, return_value=reports)
    return Result(metrics=None, checkpoint=None, error=None, path=None, return_value=reports,
                  best_checkpoints=[(at(step), report) for step, report in registered.items()])


def _sweep(tmp_path, *overrides):
    from raybiphase.storage import SweepPaths
    from raybiphase.sweep.context import SweepContext
    from raybiphase.telemetry.console import Console

    spec = load(SweepSpec, "sweeps/quickstart.yaml", [f"sweep.storage={tmp_path}", *overrides])
    plan, out = make_plan(spec), io.StringIO()
    ctx = SweepContext(spec, plan, SweepPaths.of(spec.sweep.storage, spec.sweep.name), _AnyData(),
                       console=Console(out))
    prefix = next(s for s in plan.segments.values() if s.start == 0 and len(s.runs) == 2)  # the shared CLM prefix
    return ctx, prefix, out


def _commit(ctx, segment, step, metrics=None):
    folder = Path(ctx.paths.checkpoint(segment.id, step))
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"step": step, **({"metrics": metrics} if metrics else {})}))


def _train(ctx, segment, result):
    """The segment as the one scheduler runs it (no fine-tuning), its fit returning `result`."""
    from raybiphase.sweep.scheduler import Scheduler
    from raybiphase.sweep.segments import SweepPretraining
    from raybiphase.telemetry.clock import Clock
    from raybiphase.telemetry.progress import Watch

    jobs = []
    with Watch({}, ctx.console, every_s=0) as watch:
        pretraining = SweepPretraining(ctx, Clock(), watch, _Trainer(result, jobs))
        Scheduler(None, slots=1, console=ctx.console).run(pretraining.jobs([segment]), lambda: [])
    return jobs, pretraining


def test_a_segments_rows_come_from_its_fits_value_once_for_every_run_through_it_and_it_prunes_by_its_policy(
        tmp_path, monkeypatch):
    """Rank 0's reports, less a preemption notice's resume point, and the report of a checkpoint Ray Train
    registered that rank 0's lack, become a row per run through the segment, without reading its journal; a
    committed checkpoint neither holds (a worker lost between its commit and its report) gives its row from its
    meta. The checkpoints its workers' policy does not keep are deleted; the progress line follows. The same value
    again appends nothing."""
    from raybiphase import storage
    from raybiphase.results.store import read_rows
    from raybiphase.sweep import context

    ctx, prefix, out = _sweep(tmp_path, "train.keep_checkpoints=1")
    assert (prefix.start, prefix.end) == (0, 400)
    reports = [{"step": 100, "train/clm_loss": 5.0, "val/clm_loss": 5.5, "tokens_per_s": 1000.0},
               {"step": 250, "train/clm_loss": 4.9, "resume_point": True},
               {"step": 300, "train/clm_loss": 4.5, "val/clm_loss": 5.0, "tokens_per_s": 1000.0},
               {"step": 400, "train/clm_loss": 4.0, "val/clm_loss": 4.5, "tokens_per_s": 1000.0,
                "checkpoint": ctx.paths.checkpoint(prefix.id, 400)}]
    registered = {200: {"step": 200, "train/clm_loss": 4.8, "val/clm_loss": 5.2}, 400: reports[-1]}
    for step in (200, 400):
        _commit(ctx, prefix, step)
    _commit(ctx, prefix, 350, {"step": 350, "train/clm_loss": 4.2})  # committed, then its worker was lost
    read = []
    monkeypatch.setattr(context, "read_history", lambda run_dir: read.append(run_dir) or [])
    jobs, pretraining = _train(ctx, prefix, _result(reports, registered))

    (job, kwargs), = jobs
    assert job.stop_at == 400 and kwargs["max_failures"] == 2  # the segment's SegmentJob, FailurePolicy's restarts
    rows = read_rows(ctx.paths.table(storage.PRETRAIN_FILE))
    assert sorted(set(rows["run"])) == sorted(prefix.runs)
    assert sorted(rows["step"]) == sorted([100, 200, 300, 350, 400] * 2)  # no row for the resume point
    by_step = rows.drop_duplicates("step").set_index("step")
    assert by_step.loc[200, "checkpoint"] == ctx.paths.checkpoint(prefix.id, 200)
    assert by_step.loc[350, "train/clm_loss"] == 4.2 and by_step.loc[300, "val/clm_loss"] == 5.0
    assert read == []  # the normal path reads no journal back
    assert ctx.paths.checkpoint_steps(prefix.id) == [400]  # not a milestone of the workers' policy: pruned
    assert pretraining.clock.segments == 1 and pretraining.clock.in_steps > 0
    lines = out.getvalue().splitlines()
    assert lines[0] == f"pretraining: starting {prefix.id} (1 running)"
    assert lines[-1].startswith(f"pretraining: 1/{len(ctx.plan.segments)} segments, 400/")

    _train(ctx, prefix, _result(reports, registered))
    assert len(read_rows(ctx.paths.table(storage.PRETRAIN_FILE))) == len(rows)  # appended once


def test_a_fit_without_reports_takes_its_rows_from_the_journal_and_a_committed_checkpoints_meta(tmp_path):
    """Recovery: a training function that returned no reports leaves the segment's rows to its history.json, and a
    committed checkpoint's report to its meta. A Result's last checkpoint that Ray Train did not register with its
    report gives no row."""
    from raybiphase import storage
    from raybiphase.results.store import read_rows
    from raybiphase.telemetry.history import History

    ctx, prefix, _ = _sweep(tmp_path)
    journal = History(ctx.paths.run_dir(prefix.id))
    for step in (100, 200, 300):
        journal.add({"step": step, "train/clm_loss": 5.0 - step / 1000})
    _commit(ctx, prefix, 400, {"step": 400, "train/clm_loss": 4.0})
    _train(ctx, prefix, _result(None, {350: {"step": 350, "train/clm_loss": 4.1}}, last=350))
    rows = read_rows(ctx.paths.table(storage.PRETRAIN_FILE))
    assert sorted(rows["step"]) == sorted([100, 200, 300, 400] * 2)
    assert set(rows.loc[rows["step"] == 400, "checkpoint"]) == {ctx.paths.checkpoint(prefix.id, 400)}
