"""The dry run's bill: on-demand and spot cost with the rework preemptions add, and the checkpoint interval that
loses least on spot (raybiphase.planning.bill)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from raybiphase.config import ConfigError, SweepSpec, load
from raybiphase.config.estimates import best_interval_hours, segment_nodes
from raybiphase.planning.bill import bill_lines, finetuning_rework, overhead, pretraining_rework
from raybiphase.planning.plan import make_plan


@pytest.mark.parametrize("stall_s, restart_min, mtbf_h", [(4.5, 5, 6.25), (30, 10, 25), (1, 1, 100)])
def test_youngs_interval_is_where_the_expected_overhead_is_lowest(stall_s, restart_min, mtbf_h):
    stall, restart = stall_s / 3600, restart_min / 60
    best = best_interval_hours(stall, mtbf_h)
    grid = np.geomspace(best / 20, best * 20, 4001)
    numeric = grid[np.argmin([overhead(i, stall, restart, mtbf_h).overhead for i in grid])]
    assert numeric == pytest.approx(best, rel=5e-3)
    # at the optimum the stall and the half-interval of rework weigh the same: C / I = I / (2 M)
    at = overhead(best, stall, restart, mtbf_h)
    assert at.stall == pytest.approx(best / 2 / mtbf_h)


def test_without_preemptions_spot_costs_its_gpu_hours_and_no_interval_is_advised():
    spec = load(SweepSpec, "sweeps/paper.yaml", ["sweep.preemptions_per_node_hour=0"])
    plan = make_plan(spec)
    assert pretraining_rework(plan, spec) == 0 and finetuning_rework(plan, spec) == 0
    assert math.isinf(best_interval_hours(1.0, math.inf))
    lines = bill_lines(plan, spec)
    hours = plan.gpu_hours(spec)
    assert f"on spot ($1.60) ${hours * 1.6:,.0f} with 0.00 GPU-hours of expected rework" in lines[0]
    assert all("lowest with one checkpoint at the segment's end" in line for line in lines if
               line.startswith("checkpoints"))


def test_the_rework_grows_with_the_preemption_rate_and_the_nodes_a_segment_spans():
    def rework(*overrides):
        spec = load(SweepSpec, "sweeps/split_grid.yaml", list(overrides))
        plan = make_plan(spec)
        return pretraining_rework(plan, spec), finetuning_rework(plan, spec), segment_nodes(spec.run, spec.sweep)

    once, twice = rework("sweep.preemptions_per_node_hour=0.01"), rework("sweep.preemptions_per_node_hour=0.02")
    assert twice[0] == pytest.approx(2 * once[0]) and twice[1] == pytest.approx(2 * once[1]) and once[0] > 0
    wide = rework("sweep.gpus_per_node=4")  # 32 GPUs a segment: 8 nodes instead of 4, twice the preemptions
    assert (once[2], wide[2]) == (4, 8) and wide[0] == pytest.approx(2 * once[0])


def test_the_papers_dry_run_prices_pretraining_and_fine_tuning_and_advises_each_size():
    spec = load(SweepSpec, "sweeps/paper.yaml")
    plan = make_plan(spec)
    lines = bill_lines(plan, spec)
    pretraining = re.match(r"bill: pretraining ([\d,]+) GPU-hours: \$([\d,]+) on demand", lines[0])
    assert pretraining and int(pretraining[2].replace(",", "")) == round(plan.gpu_hours(spec) * 4.0)
    assert lines[1].startswith(f"bill: fine-tuning at most {plan.finetune_gpu_hours(spec):,.0f} GPU-hours")
    sizes = [re.match(r"checkpoints \((\w+)\): every 1,000 steps", line)[1] for line in lines[3:]]
    assert sorted(sizes) == ["1b", "210m", "610m"]


def test_a_sweep_on_cpus_has_no_bill():
    spec = load(SweepSpec, "sweeps/quickstart.yaml")
    assert bill_lines(make_plan(spec), spec) == []


@pytest.mark.parametrize("override, message", [
    ("sweep.spot_gpu_hour_usd=-1", "sweep.spot_gpu_hour_usd"),
    ("sweep.preemptions_per_node_hour=-0.1", "sweep.preemptions_per_node_hour"),
    ("sweep.gpus_per_node=0", "sweep.gpus_per_node"),
    ("sweep.checkpoint_gb_per_s=0", "sweep.checkpoint_gb_per_s"),
])
def test_a_bad_price_or_rate_is_one_line_naming_it(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(SweepSpec, "sweeps/paper.yaml", [override])


def test_checkpoint_every_auto_is_each_runs_advised_interval():
    spec = load(SweepSpec, "sweeps/paper.yaml", ["train.checkpoint_every=auto"])
    plan = make_plan(spec)
    advised = {}
    for line in bill_lines(plan, spec)[3:]:
        size, every, best = re.match(r"checkpoints \((\w+)\): every ([\d,]+) steps \(auto\).*minimises it: ([\d,]+) "
                                     r"steps", line).groups()
        assert every == best  # auto is the advice
        advised[size] = int(best.replace(",", ""))
    assert len(advised) == 3 and len(set(advised.values())) == 3  # one per size: bigger models checkpoint slower
    for run in plan.runs.values():  # every run, the continued ones included, at its own size's interval
        assert run.config.train.checkpoint_every == min(advised[run.config.model.size], run.steps)


def test_checkpoint_every_auto_without_preemptions_saves_only_the_milestones():
    spec = load(SweepSpec, "sweeps/split_grid.yaml", ["train.checkpoint_every=auto",
                                                      "sweep.preemptions_per_node_hour=0"])
    assert all(run.config.train.checkpoint_every == run.steps for run in make_plan(spec).runs.values())


@pytest.mark.parametrize("overrides, message", [
    (["train.checkpoint_every=auto"], "train.checkpoint_every: auto weighs a step's GPU time against preemptions "
                                      "and needs GPU workers"),
    (["train.checkpoint_every=autp"], "train.checkpoint_every: 'autp' is not allowed; allowed: an int or 'auto'"),
])
def test_checkpoint_every_auto_on_cpus_or_misspelt_is_one_line(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_plan(load(SweepSpec, "sweeps/quickstart.yaml", overrides))


def test_the_checkpoint_stall_says_whether_its_upload_rate_was_measured_or_assumed():
    """The default rate is nobody's measurement (the committed benchmark saw 0.14 GB/s to a local disk): the lines
    call it assumed until the spec sets one, and a tenth of the rate makes each stall ten times as long."""
    from raybiphase.planning.bill import checkpoint_lines

    spec = load(SweepSpec, "sweeps/paper.yaml")
    assumed = checkpoint_lines(make_plan(spec), spec)
    assert all(" at an assumed 2 GB/s (sweep.checkpoint_gb_per_s); " in line for line in assumed)
    slow = load(SweepSpec, "sweeps/paper.yaml", ["sweep.checkpoint_gb_per_s=0.2"])
    measured = checkpoint_lines(make_plan(slow), slow)
    assert all(" at 0.2 GB/s (sweep.checkpoint_gb_per_s); " in line for line in measured)
    stall = [float(re.search(r"each stalling ([\d.]+) s", line)[1]) for line in (assumed[0], measured[0])]
    assert stall[1] == pytest.approx(10 * stall[0], rel=0.03)  # printed to a tenth of a second
