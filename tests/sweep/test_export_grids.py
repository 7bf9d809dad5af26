"""Intermediate checkpoints on a part of the grid (finetune.exports): the plan counts and prices each checkpoint's own
grid, the fan-out runs exactly that grid, final checkpoints and controls keep the full one, and a step no run
exports is a one-line error. The fan-out's Tune launch is a recorder here (no Ray): what is asserted is what gets
launched."""

from __future__ import annotations

import dataclasses

import pytest

from raybiphase.config import ConfigError, FinetuneGrid, SweepSpec, load
from raybiphase.finetune import records
from raybiphase.planning.cost import checkpoint_finetune_gpu_hours
from raybiphase.planning.grids import grid_lines
from raybiphase.planning.plan import make_plan
from tests.finetune.test_finetune import make_tiny_checkpoint

EXPORTS = "finetune.exports=[{steps: [200, 400], tasks: [nq, sst2], lrs: [2.0e-3]}, {steps: [600], seeds: [0]}]"
SMALL = ["train.export_steps=[200, 400, 600]", "finetune.tasks=[sst2, msmarco, nq, mldr]",
         "finetune.lrs=[1.0e-4, 2.0e-3]", "finetune.seeds=[0, 1, 2]"]


def _small(*more: str) -> SweepSpec:
    """The quickstart's three runs (MLM, CLM then MLM from 400, CLM; 800 steps, decay from 720) exporting 200, 400
    and 600: 10 checkpoints (the CLM prefix's 200 and 400 are shared by two runs) and one control."""
    return load(SweepSpec, "sweeps/quickstart.yaml", [*SMALL, *more])


def test_the_plan_counts_each_intermediate_checkpoints_own_grid():
    spec, full = _small(EXPORTS), _small()
    plan = make_plan(spec)
    steps = sorted(step for _, step in plan.checkpoints())
    assert steps == [200, 200, 400, 400, 600, 600, 600, 800, 800, 800] and len(plan.controls) == 1
    # full grid: sst2 and msmarco train (nq, mldr ride on msmarco) x 2 LRs x 3 seeds = 12 a checkpoint, 24 apart
    assert make_plan(full).finetune_trials(full) == 11 * 12
    assert make_plan(full).finetune_trials(full, distinct=False) == (12 + 1) * 24
    # 200, 400: sst2 and nq (nq trains itself: msmarco is not asked for) x 1 LR x 3 seeds = 6 (4 checkpoints);
    # 600: the four tasks x 2 LRs x seed 0 = 4 trained, 8 apart (3 checkpoints); 800 and the control: 12, 24 apart
    assert plan.finetune_trials(spec) == 4 * 6 + 3 * 4 + (3 + 1) * 12 == 84
    assert plan.finetune_trials(spec, distinct=False) == 6 * 6 + 3 * 8 + (3 + 1) * 24 == 156  # 6 run checkpoints at 200, 400
    grids = plan.grids(spec)
    assert {grids[k] for k in grids if k[1] in (200, 400)} == {FinetuneGrid(("sst2", "nq"), (2e-3,), (0, 1, 2))}
    assert {grids[k] for k in grids if k[1] == 800} == {spec.finetune.grid()}  # finals: the full grid
    assert grid_lines(plan, spec) == [  # the dry run's lines, under its fine-tuning line
        "finetune.exports.0: 4 intermediate checkpoint(s) at steps 200, 400, each on 2 task(s) (sst2, nq) x 1 LR(s) x "
        "3 seed(s): 6 trials each, where a final checkpoint takes 12",
        "finetune.exports.1: 3 intermediate checkpoint(s) at steps 600, each on 4 task(s) (sst2, msmarco, nq, mldr) x "
        "2 LR(s) x 1 seed(s): 4 trials each, where a final checkpoint takes 12"]
    assert grid_lines(make_plan(full), full) == []  # no entry: the dry run is as before


def test_the_training_cost_follows_the_trials_and_the_timeline_each_checkpoints_grid():
    from raybiphase.planning.timeline import _finetune_hours

    spec, full = _small(EXPORTS), _small()
    plan, full_plan = make_plan(spec), make_plan(full)
    training = lambda p, s: p.finetune_gpu_hours(s) - p.finetune_gpu_hours(s, evaluation_only=True)  # noqa: E731
    assert training(plan, spec) / training(full_plan, full) == pytest.approx(84 / 132)
    # the MLM run is a segment of its own holding its 200, 400, 600 and 800: each at its own grid's price
    (mlm,) = [s for s in plan.segments.values() if s.id.startswith("tiny-mlm40-0-")]
    cost = lambda step: checkpoint_finetune_gpu_hours("tiny", spec, spec.finetune.grid(step))  # noqa: E731
    assert _finetune_hours(plan, spec)[mlm.id] == pytest.approx(cost(200) + cost(400) + cost(600) + cost(None))
    assert max(cost(200), cost(600)) < cost(None)


def test_a_step_no_run_exports_before_its_end_is_one_line():
    with pytest.raises(ConfigError) as err:
        make_plan(_small("finetune.exports=[{steps: [200]}, {steps: [300], tasks: [sst2]}]"))
    assert str(err.value) == ("finetune.exports.1.steps.0: no run exports step 300 before its end (the runs' "
                              "train.export_steps: 200, 400, 600)")
    with pytest.raises(ConfigError, match="finetune.exports.0.steps.0: no run exports step 800 before its end"):
        make_plan(_small("finetune.exports=[{steps: [800], tasks: [sst2]}]"))  # the final step: always the full grid


@pytest.fixture(scope="module")
def checkpoint(offline_cache, tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("grids") / "hf")


def _recording(launched: list):
    """Records the trials launched and writes their rows and their riders'."""
    from raybiphase.finetune.fanout import ROWS
    from tests.finetune.recording import recording

    def outcome(spec) -> dict:
        launched.append(spec.key)
        rows = [dataclasses.replace(member.planned(), val_score=0.5, test_score=0.5, steps=9, steps_run=9)
                for member in [spec, *spec.riders]]
        for member, row in zip([spec, *spec.riders], rows):
            records.write_record(member.record, row)
        return {"step": 9, ROWS: [row.record() for row in rows]}
    return recording([], outcome)


def test_the_fanout_runs_exactly_the_named_grid_at_an_intermediate_checkpoint(checkpoint, tmp_path, monkeypatch):
    from raybiphase.finetune import fanout
    from raybiphase.storage import SweepPaths
    from raybiphase.sweep.context import SweepContext
    from raybiphase.sweep.finetuning import finetune_sources
    from raybiphase.sweep.scheduler import finetune_checkpoints

    spec = _small(EXPORTS)
    sources = finetune_sources(SweepContext(spec, make_plan(spec), SweepPaths.of(str(tmp_path), "small")))
    early = next(s for s in sources if s.pretrain_step == 200 and s.shared_by)  # the CLM prefix: two runs
    final = next(s for s in sources if s.pretrain_step == 800)
    assert early.grid == FinetuneGrid(("sst2", "nq"), (2e-3,), (0, 1, 2)) and final.grid == spec.finetune.grid()
    picked = [dataclasses.replace(s, hf_dir=str(checkpoint)) for s in (early, final)]
    launched = []
    rows = finetune_checkpoints(picked, fanout.Fanout.of(spec), storage=str(tmp_path), name="ft",
                                trials=_recording(launched))
    at_200 = sorted((task, lr, seed) for run, step, task, lr, seed in launched if step == 200)
    assert at_200 == sorted((task, 2e-3, seed) for task in ("sst2", "nq") for seed in (0, 1, 2))  # nq trains itself
    at_800 = {(task, lr, seed) for run, step, task, lr, seed in launched if step == 800}
    assert at_800 == {(task, lr, seed) for task in ("sst2", "msmarco") for lr in (1e-4, 2e-3) for seed in (0, 1, 2)}
    assert len(launched) == 6 + 12
    early_rows = [r for r in rows if r["pretrain_step"] == 200]
    assert len(early_rows) == 2 * 6 and {r["task"] for r in early_rows} == {"sst2", "nq"}  # its two runs' rows
    assert len([r for r in rows if r["pretrain_step"] == 800]) == 24  # nq and mldr ride on msmarco's trials
    assert len(fanout.plan_trials(picked, spec.finetune)) == 6 + 12  # what the stream counts as planned
