"""Shared weights are fine-tuned once. A checkpoint several runs pass through (an export inside a
shared prefix) gets one set of trials; every run that shares it gets a copy of the rows, naming the run they ran
under. The scheduler's trial runner is replaced by a recorder here (no Ray): what is asserted is what gets launched."""

from __future__ import annotations

import dataclasses

import pytest

from raybiphase.config import FinetuneGrid, SweepSpec, from_dict, load
from raybiphase.finetune import records
from raybiphase.finetune.spec import FinetuneSource
from raybiphase.planning.plan import make_plan
from tests.finetune.recording import recording
from tests.finetune.test_finetune import make_tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(offline_cache, tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("shared") / "hf")


def _recording(launched: list):
    """Each trial finishes at once with a record scored by its LR and seed, its row in its last report."""
    from raybiphase.finetune.fanout import ROWS

    def outcome(spec) -> dict:
        row = dataclasses.replace(spec.planned(), val_score=0.6 + spec.lr, test_score=0.5 + spec.seed / 10, steps=9,
                                  steps_run=9)
        records.write_record(spec.record, row)
        return {"step": 9, ROWS: [row.record()]}
    return recording(launched, outcome)


def _run(source, cfg, tmp_path, launched, done=frozenset()):
    from raybiphase.finetune.fanout import Fanout
    from raybiphase.sweep.scheduler import finetune_checkpoints

    return finetune_checkpoints([source], Fanout.of(cfg), storage=str(tmp_path), name="ft", done=done,
                                trials=_recording(launched))


def test_a_shared_checkpoint_is_fine_tuned_once_and_every_run_sharing_it_gets_its_rows(checkpoint, tmp_path,
                                                                                       monkeypatch):

    cfg = from_dict(SweepSpec, {"finetune": {"tasks": ["tweets"], "lrs": [1e-4, 2e-3], "seeds": [0, 1],
                                             "batch_size": 8, "max_steps": 9, "eval_every": 3, "max_examples": 64}})
    source = FinetuneSource("a", 8, str(checkpoint), {"phases.steps": 8},
                            shared_by=(FinetuneSource("b", 8, str(checkpoint), {"phases.steps": 16}),))
    launched = []
    rows = _run(source, cfg, tmp_path, launched)
    assert len(launched) == 4 and {spec.run for spec in launched} == {"a"}  # 2 LRs x 2 seeds, once
    by_run = {run: sorted((r["lr"], r["seed"], r["test_score"]) for r in rows if r["run"] == run) for run in "ab"}
    assert by_run["a"] == by_run["b"] and len(by_run["a"]) == 4
    assert {r["trials_of"] for r in rows if r["run"] == "b"} == {"a"}
    assert {r["trials_of"] for r in rows if r["run"] == "a"} == {""}
    assert {r["phases.steps"] for r in rows if r["run"] == "b"} == {16}  # the sharer's own settings
    from raybiphase.sweep.driver import trials_run

    assert len(trials_run(rows)) == 4  # the sweep's time line counts the trials run, not their copies
    # a rerun where only the sharer's rows are missing (say, a run added to the spec) copies them, runs nothing
    launched.clear()
    done = {(r["run"], r["pretrain_step"], r["task"], r["lr"], r["seed"]) for r in rows if r["run"] == "a"}
    again = _run(source, cfg, tmp_path, launched, done=done)
    assert launched == [] and sorted(r["run"] for r in again) == ["b"] * 4


def test_the_papers_exports_inside_shared_prefixes_are_192_checkpoints_not_252():
    spec = load(SweepSpec, "sweeps/paper.yaml")
    plan = make_plan(spec)
    checkpoints = plan.checkpoints()
    assert len(checkpoints) == 192 and sum(len(runs) for runs in checkpoints.values()) == 252
    # the CLM prefix's step-1000 export is one checkpoint for every run that starts with CLM at 610m
    assert max(len(runs) for runs in checkpoints.values()) >= 10
    final = [key for key, runs in checkpoints.items() if any(plan.runs[r].steps == key[1] for r in runs)]
    assert len(final) == len(plan.runs) == 45  # 147 intermediate checkpoints, 207 run checkpoints among them
    per_task = len(spec.finetune.lrs) * len(spec.finetune.seeds)
    # finals and controls: the full grid, nq and mldr riding on the MS MARCO trial (10 of the 12 tasks train);
    # intermediate ones: finetune.exports' 4 tasks (one per family) x 3 LRs x 5 seeds
    assert plan.finetune_trials(spec) == (45 + len(plan.controls)) * 10 * per_task + 147 * 4 * 3 * 5 == 23_820
    assert plan.finetune_trials(spec, distinct=False) == (45 + len(plan.controls)) * 12 * per_task + 207 * 60


def test_the_driver_gives_one_source_per_checkpoint_with_its_sharers(tmp_path):
    from raybiphase.storage import SweepPaths
    from raybiphase.sweep.driver import SweepContext, finetune_sources

    spec = load(SweepSpec, "sweeps/paper.yaml")
    plan = make_plan(spec)
    sources = finetune_sources(SweepContext(spec, plan, SweepPaths.of(str(tmp_path), "paper")))
    assert len(sources) == 192 and len({s.hf_dir for s in sources}) == 192
    assert sum(1 + len(s.shared_by) for s in sources) == 252
    curve = FinetuneGrid(("sst2", "conll2003", "squad", "msmarco"), (2e-5, 5e-5, 1e-4), (0, 1, 2, 3, 4))
    final = [s.pretrain_step == plan.runs[s.run].steps for s in sources]
    assert sum(final) == 45 and {s.grid for s, f in zip(sources, final) if f} == {spec.finetune.grid()}
    assert {s.grid for s, f in zip(sources, final) if not f} == {curve}  # every intermediate checkpoint
    for source in sources:
        assert all(other.hf_dir == source.hf_dir and other.run != source.run for other in source.shared_by)
