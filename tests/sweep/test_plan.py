"""The sweep planner: the paper's grid shares prefixes exactly; every committed spec loads and plans."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raybiphase.config import ConfigError, SweepSpec, from_dict, load
from raybiphase.sweep.plan import describe, expand, make_plan, signature

SWEEPS = sorted((Path(__file__).resolve().parents[2] / "sweeps").glob("*.yaml"))


def test_split_grid_plans_206k_of_380k_steps():
    spec = load(SweepSpec, "sweeps/split_grid.yaml")
    plan = make_plan(spec)
    assert len(plan.runs) == 15
    assert plan.naive_steps == 380_000
    assert plan.planned_steps == 206_000
    names = {name.rsplit("-", 1)[0] for name in plan.runs}
    assert {"610m-clm-42k", "610m-mlm40-42k", "610m-clm-10.5k-mlm40-42k", "610m-clm-5.5k-mlm40-22k"} <= names


def test_every_run_is_a_chain_of_segments_covering_its_steps():
    plan = make_plan(load(SweepSpec, "sweeps/split_grid.yaml"))
    for run in plan.runs.values():
        chain = [plan.segments[s] for s in run.segments]
        assert chain[0].start == 0 and chain[-1].end == run.steps
        assert all(a.end == b.start and b.parent == a.id for a, b in zip(chain, chain[1:]))
        for seg in chain:  # a segment's steps are identical for every run through it
            for other in seg.runs:
                assert np.array_equal(plan.runs[other].signature[seg.start:seg.end], run.signature[seg.start:seg.end])


def test_runs_diverge_where_their_schedules_differ():
    base = {"optim": {"warmup_steps": 2, "decay_steps": 2}, "train": {"global_batch_tokens": 2048}}
    a = from_dict(SweepSpec, base, {"phases.steps": 10, "phases.clm_share": 1.0})
    b = from_dict(SweepSpec, base, {"phases.steps": 20, "phases.clm_share": 1.0})
    diff = np.nonzero((signature(a) != signature(b)[:10]).any(axis=1))[0]
    assert diff[0] == 8  # the shorter run's decay starts at step 8; until then they are the same run


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_committed_specs_load_and_plan(path):
    spec = load(SweepSpec, path)
    plan = make_plan(spec)
    assert plan.planned_steps <= plan.naive_steps
    text = describe(plan, spec)
    assert "naive" in text and "GPU-hours" in text


def test_quickstart_shares_the_clm_prefix():
    plan = make_plan(load(SweepSpec, "sweeps/quickstart.yaml"))
    assert len(plan.runs) == 3 and plan.planned_steps < plan.naive_steps


def test_bad_grid_values_name_the_key():
    spec = load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.grid={phases.mask_ratio: [0.3, 1.5]}"])
    with pytest.raises(ConfigError, match=r"sweep.grid \(phases.mask_ratio=1.5\): phases.mask_ratio: 1.5 is out of range"):
        expand(spec)
    with pytest.raises(ConfigError, match="phases.mask_ration: unknown key"):
        load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.grid={phases.mask_ration: [0.3]}"])


def test_continued_pretraining_hangs_below_its_source():
    spec = load(SweepSpec, "sweeps/cpt.yaml")
    plan = make_plan(spec)
    continued = [r for r in plan.runs.values() if r.source]
    assert {r.name.rsplit("-", 1)[0] for r in continued} == {"610m-clm-dec42k-mlm40-64k", "610m-mlm40-dec42k-mlm40-64k"}
    for run in continued:
        first = plan.segments[run.segments[0]]
        assert first.after_run == run.source and first.start == 0
    with pytest.raises(ConfigError, match="'@610m-clm-12k' names no run of this sweep"):
        make_plan(load(SweepSpec, "sweeps/cpt.yaml", ["sweep.runs=[{model.init_from: '@610m-clm-12k'}]"]))


def test_retrieval_tasks_get_a_bm25_baseline_row(offline_cache):
    from raybiphase.sweep.driver import bm25_rows

    spec = load(SweepSpec, "sweeps/quickstart.yaml", ["finetune.tasks=[tweets, wiki_retrieval]", "finetune.max_examples=200"])
    (row,) = bm25_rows(spec)
    assert row["run"] == "bm25" and row["source"] == "baseline" and row["task"] == "wiki_retrieval"
    assert 0.3 < row["test_score"] <= 1.0 and len(row["test_per_example"]) > 0
