"""The benchmarks keep running: the masking one, at a toy size, prints its ratio (docs/benchmarking.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_masking_benchmark_runs_what_the_stream_runs_and_prints_the_ratio(offline_cache):
    proc = subprocess.run([sys.executable, "benchmarks/bench_masking.py", "--blocks", "16", "--length", "64",
                           "--batch-size", "8", "--repeats", "1"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "raybiphase make_inputs" in proc.stdout
    ratios = [line for line in proc.stdout.splitlines() if line.startswith("masking+collation")]
    assert len(ratios) == 2 and all(line.rstrip().endswith("x") for line in ratios)


@pytest.mark.slow
@pytest.mark.ray
def test_parity_benchmark_trains_both_sides_and_clm_equals_the_trainer_when_both_read_the_same_order(
        offline_cache, ray_cluster, tmp_path):
    """bench_parity.py at a toy size (4 steps, one seed): the project's run and transformers' Trainer, scored by
    one evaluation; it prints the difference line and writes a strict JSON record. CLM has no masking draw: given
    the project's block order, the Trainer (its AdamW groups, clipping, token-weighted accumulation over two
    micro-batches, causal loss) and the project's loop end on the same held-out loss, so what the benchmark measures
    beyond seed noise is the data order (and for MLM the masks)."""
    import ray

    record = tmp_path / "parity.json"
    # the benchmark joins the tests' running Ray through RAY_ADDRESS, as a run on a cluster does (no preemption
    # watcher: no autoscaler drains it)
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
    proc = subprocess.run([sys.executable, "benchmarks/bench_parity.py", "--seeds", "0", "--steps", "4",
                           "--objectives", "mlm", "clm", "--peer-order", "ours", "--ours-order", "stream", "--threads",
                           "1", "--set", "train.micro_batch_size=8", "--json", str(record)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mlm seed 0: held-out loss ours" in proc.stdout
    assert "difference (ours - Trainer)" in proc.stdout
    data = json.loads(record.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in the record"))
    assert sorted(result["objective"] for result in data["results"]) == ["clm", "mlm"]
    assert all(result["seeds"] == [0] for result in data["results"])
    runs = {run["objective"]: run for run in data["runs"]}
    assert 0 < runs["mlm"]["ours"] < 10 and 0 < runs["mlm"]["peer"] < 10  # both trained a little from ln(4096)
    assert runs["mlm"]["diff"] == pytest.approx(runs["mlm"]["ours"] - runs["mlm"]["peer"])
    clm = runs["clm"]
    assert clm["peer_order"] == "ours" and clm["ours"] < 8.3
    assert clm["peer"] == pytest.approx(clm["ours"], abs=1e-5)


@pytest.mark.slow
def test_checkpoint_benchmark_times_the_save_and_the_upload_and_prices_the_stall_at_the_papers_sizes(tmp_path):
    """bench_checkpoint.py at the smallest size: a DCP save and an upload timed, their ratio printed, and each
    paper size's stall as a share of its advised interval, in a valid record."""
    out = tmp_path / "checkpoint.json"
    proc = subprocess.run([sys.executable, "benchmarks/bench_checkpoint.py", "--sizes", "tiny", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"tiny: [\d.]+ GB; save [\d.]+ s \+ upload [\d.]+ s = stall .* \([\d.]+x\)", proc.stdout)
    record = json.loads(out.read_text())
    (tiny,) = record["sizes"]
    assert tiny["sync_stall_s"] == pytest.approx(tiny["save_s"] + tiny["upload_s"]) and tiny["gb"] > 0
    assert {p["size"] for p in record["paper"]} == {"210m", "610m", "1b"}
    for p in record["paper"]:  # the share stalled at Young's interval is the checkpoint's cost over that interval
        for mode in ("sync", "background"):
            m = p[mode]
            assert m["stalled_share"] == pytest.approx(m["stall_s"] / 3600 / m["interval_hours"])
        assert p["background"]["stalled_share"] <= p["sync"]["stalled_share"]


def test_the_quickstart_record_keeps_the_drivers_time_line_and_says_what_shared_the_machine():
    """The driver's last line (the sweep's Clock) becomes the record's `time`, stage by stage, and the README's line
    says the time, the stages and what else ran; without a log the record and the line say it was not measured."""
    import importlib

    from raybiphase.telemetry.clock import Clock

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        quickstart_time = importlib.import_module("quickstart_time")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    clock = Clock()
    clock.spans = {"Ray start": 3.2, "data": 12.0, "pretraining": 158.4, "fine-tuning": 345.0, "report": 4.0}
    clock.segments, clock.most_at_once, clock.in_steps, clock.trials, clock.in_trials = 3, 2, 70.0, 48, 540.0
    log = "fine-tuning: 48 trial row(s) recorded\n" + clock.summary().replace(clock.summary().split(" in all")[0],
                                                                              "time: 5m55s") + "\n"
    took = quickstart_time.timing(log)
    assert took == {"total_s": 355, "stages_s": {"Ray start": 3, "data": 12, "pretraining": 158, "fine-tuning": 345,
                                                 "report": 4}, "line": "time: 5m55s in all"}
    line = quickstart_time.time_line({"machine": {"cores": 2, "shared": "a test suite"}, "time": took})
    assert line.startswith("On 2 cores, beside other work (a test suite), it took 5m55s: its last line read `time: "
                           "5m55s in all`, of which Ray start 3s, data 12s, pretraining 2m38s, fine-tuning 5m45s")
    assert "not measured" in quickstart_time.time_line({"machine": {"cores": 2}, "time": "not measured"})


def test_the_environment_check_names_the_locks_digest_and_every_package_that_differs(monkeypatch, capsys):
    """`python benchmarks/environment.py check` ends on the committed lock's sha256 (what a record names) and exits 0
    only when no package differs from the lock, each one that does on a line of its own."""
    import hashlib
    import runpy

    monkeypatch.setattr(sys, "argv", ["benchmarks/environment.py", "check"])
    with pytest.raises(SystemExit) as exit_info:  # the script as `python` runs it, in this process
        runpy.run_path(str(REPO / "benchmarks" / "environment.py"), run_name="__main__")
    *differ, last = capsys.readouterr().out.splitlines()
    digest = hashlib.sha256((REPO / "benchmarks" / "requirements-cpu.lock").read_bytes()).hexdigest()
    assert last.startswith(f"benchmarks/requirements-cpu.lock sha256 {digest}: ")
    assert exit_info.value.code == (1 if differ else 0) and all(": installed " in line for line in differ)
    assert last.endswith("this environment matches it" if not differ else f"{len(differ)} package(s) differ")


@pytest.mark.parametrize("record", sorted((REPO / "benchmarks" / "results").glob("*.json")),
                         ids=lambda p: p.name)
def test_every_committed_benchmark_record_is_valid_json(record):
    """A record nothing can read back is no evidence (`python3 -m json.tool` must read it)."""
    json.loads(record.read_text())


@pytest.mark.slow
def test_plan_benchmark_measures_each_size_apart_and_compares_with_a_record(tmp_path):
    """bench_plan.py at two toy sizes writes a record; run again with that record as `--before`, it prints the
    ratios and checks the dry run printed the same text (the same code: it must)."""
    record, again = tmp_path / "plan.json", tmp_path / "again.json"
    for out, extra in ((record, []), (again, ["--before", str(record)])):
        proc = subprocess.run([sys.executable, "benchmarks/bench_plan.py", "--sizes", "20", "40", "--out", str(out),
                               *extra], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(again.read_text())
    assert [m["grid_points"] for m in data["sizes"]] == [20, 40] and not any(m["torch_loaded"] for m in data["sizes"])
    assert data["before_over_now"]["40"]["same_text"] and "grid points: before / now" in proc.stdout
    assert data["headline"].startswith("dry run of 40 grid points")
