"""Elastic segments in the config (no Ray): `resources.num_workers: [min, max]` is read, checked against the global
batch, left out of a run's identity, and planned and billed at its max."""

from __future__ import annotations

import io

import pytest

from raybiphase.config import ConfigError, SweepSpec, from_dict, load, run_hash, to_dict
from raybiphase.config.estimates import segment_gpus
from raybiphase.naming import run_name
from raybiphase.planning.plan import make_plan
from raybiphase.planning.preflight import plan_sweep
from raybiphase.telemetry.console import Console

TWO_MICRO_BATCHES = ["train.micro_batch_size=8"]  # the quickstart's 2,048-token batch as 2 micro-batches of 8 x 128


def test_a_range_reads_as_min_and_max_and_round_trips():
    spec = load(SweepSpec, "sweeps/quickstart.yaml", [*TWO_MICRO_BATCHES, "resources.num_workers=[1, 2]",
                                                     "resources.resize_check_s=5"])
    res = spec.run.resources
    assert res.num_workers == (1, 2) and list(res.worker_counts) == [1, 2] and res.max_workers == 2
    assert res.resize_check_s == 5.0
    assert from_dict(SweepSpec, to_dict(spec)) == spec
    fixed = load(SweepSpec, "sweeps/quickstart.yaml").run.resources
    assert fixed.num_workers == 1 and list(fixed.worker_counts) == [1] and fixed.max_workers == 1  # as before


@pytest.mark.parametrize(("value", "message"), [
    ("[2, 1]", "resources.num_workers: [2, 1]: the minimum is above the maximum; allowed: [min, max] with 1 <= min"),
    ("[0, 2]", "resources.num_workers: [0, 2]: the minimum 0 is out of range; allowed: [min, max] with 1 <= min"),
    ("[1, 2, 3]", "resources.num_workers: expected 2 values, got 3"),
    ("0", "resources.num_workers: 0 is out of range"),
    ("many", "resources.num_workers: 'many' is not allowed; allowed: an int or a list of 2 values"),
    ("[1, 3]", "resources.num_workers: [1, 3]: the global batch is 2 micro-batches (train.global_batch_tokens / "
               "(micro_batch_size x seq_len)), which 3 worker(s) cannot share evenly; allowed: a range whose every "
               "size divides 2"),
])
def test_a_bad_range_is_one_line_naming_it(value, message):
    with pytest.raises(ConfigError) as err:
        load(SweepSpec, "sweeps/quickstart.yaml", [*TWO_MICRO_BATCHES, f"resources.num_workers={value}"])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_every_size_of_the_range_must_share_the_batch_not_only_its_ends():
    """[2, 4] over 4 micro-batches: 2 and 4 divide it, 3 (which Ray Train may place) does not."""
    with pytest.raises(ConfigError, match=r"^resources.num_workers: \[2, 4\]: .* which 3 worker\(s\) cannot share"):
        load(SweepSpec, "sweeps/quickstart.yaml", ["train.micro_batch_size=4", "resources.num_workers=[2, 4]"])
    load(SweepSpec, "sweeps/quickstart.yaml", ["train.micro_batch_size=4", "resources.num_workers=[4, 4]"])


def test_the_range_changes_no_run_name_and_no_shared_segment():
    fixed, elastic = (load(SweepSpec, "sweeps/paper_mini.yaml", [*TWO_MICRO_BATCHES, f"resources.num_workers={n}"])
                      for n in ("2", "[1, 2]"))
    assert run_hash(fixed.run) == run_hash(elastic.run) and run_name(fixed.run) == run_name(elastic.run)
    plans = make_plan(fixed), make_plan(elastic)
    layout = [{name: run.segments for name, run in plan.runs.items()} for plan in plans]
    assert layout[0] == layout[1] and list(plans[0].segments) == list(plans[1].segments) != []


def _dry_run(overrides: list[str]) -> list[str]:
    out = io.StringIO()
    plan_sweep(load(SweepSpec, "sweeps/paper.yaml", overrides), dry_run=True, console=Console(out))
    return out.getvalue().splitlines()


def test_the_estimates_and_the_bill_plan_for_the_max():
    """The paper's dry run at [1, 2] workers per segment is its dry run at 2, word for word, but for the line that
    states the range: GPU-hours, wall-clock, bill and checkpoint advice are all planned with 2."""
    at_max = _dry_run(["resources.num_workers=2"])
    elastic = _dry_run(["resources.num_workers=[1, 2]"])
    assert segment_gpus(load(SweepSpec, "sweeps/paper.yaml", ["resources.num_workers=[1, 2]"]).run) == 2
    differ = [(a, b) for a, b in zip(at_max, elastic) if a != b]
    assert len(at_max) == len(elastic) and len(differ) == 1, differ
    assert differ[0][0].startswith("resources: each pretraining segment holds 2 Train worker(s)")
    assert differ[0][1].startswith("resources: each pretraining segment holds 1 to 2 Train worker(s)")
    assert any(line.startswith("bill: pretraining") for line in elastic)


def test_a_sweep_switched_to_a_range_appends_to_the_same_result_files(tmp_path):
    """The rows' resources.num_workers column stays a number (the range's max), so a sweep that ran with 2 workers
    and goes on with [1, 2] appends to its pretrain.parquet; `workers` holds the count that trained each step."""
    from raybiphase.results.rows import PRETRAIN_KEY, pretrain_row
    from raybiphase.results.store import append_rows, read_rows

    path = tmp_path / "pretrain.parquet"
    for step, value, trained in ((10, "2", 2), (20, "[1, 2]", 1)):
        run = load(SweepSpec, "sweeps/quickstart.yaml", [*TWO_MICRO_BATCHES, f"resources.num_workers={value}"]).run
        row = pretrain_row("r", run, sweep="s", segment="g", report={"step": step, "workers": trained})
        append_rows(path, [row.record()], key=PRETRAIN_KEY)
    rows = read_rows(path)
    assert rows["resources.num_workers"].tolist() == [2, 2] and rows["workers"].tolist() == [2, 1]
