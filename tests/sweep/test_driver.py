"""The sweep on a real local Ray: a killed driver resumes without recomputing, a branch equals the run alone.
Both invocations join the tests' running Ray through RAY_ADDRESS, as a sweep on a cluster does (`ray job submit`
against `ray start --head` nodes, and a driver that starts a Ray of its own: tests/test_multinode.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import tiny_base

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, small_data) -> Path:
    spec = tiny_base(tmp_path / "results", small_data, name="branch")
    spec["sweep"]["grid"] = {"phases.clm_share": [0.5, 1.0]}
    # continued pretraining: MLM on top of the decayed CLM run, with its own schedule (the paper's clm-dec recipe), on
    # one worker (the grid's segments keep the two workers of the run alone a branch is compared with); two lengths
    # of it share their first steps as any two runs do (tests/planning/test_plan.py, the beyond study)
    spec["sweep"]["runs"] = [{"model.init_from": "@tiny-clm-8", "phases.steps": 6, "phases.clm_share": 0.0,
                              "optim.warmup_steps": 1, "optim.decay_steps": 1, "resources.num_workers": 1}]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _sweep(spec: Path, env=None, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "raybiphase.sweep", str(spec)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **kwargs)


@pytest.fixture(scope="module")
def finished_sweep(ray_cluster, small_data, tmp_path_factory):
    """Run the sweep, kill the driver (Ray ends its job's fits) once the shared CLM segment is done, run it again."""
    import ray

    tmp = tmp_path_factory.mktemp("sweep")
    spec = _spec(tmp, small_data)
    root = tmp / "results" / "branch"
    # a cluster's Ray as the driver finds it under `ray job submit` (no preemption watcher: no autoscaler drains it)
    env = {**os.environ, "RAYBIPHASE_PROGRESS_S": "1", "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
    proc = _sweep(spec, env=env)
    first = None
    deadline = time.time() + 420
    while time.time() < deadline and proc.poll() is None:
        done = list((root / "runs").glob("tiny-clm-0-4-*/step-00000004/meta.json"))
        if done:
            first = done[0]
            break
        time.sleep(1)
    assert first is not None, proc.communicate()[0][-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    stamp = first.stat().st_mtime_ns
    # the segments done when the driver died; another segment may have been under way, and a dead driver's workers
    # are ended by Ray only moments later: that one may be done too by the time the sweep resumes
    done = sorted("-".join(d.name.split("-")[:4]) for d in (root / "runs").iterdir()
                  if (d / f"step-{int(d.name.split('-')[3]):08d}" / "meta.json").exists())
    rerun = _sweep(spec, env=env)
    try:
        output = rerun.communicate(timeout=900)[0]
    except subprocess.TimeoutExpired:  # never leave a stuck sweep behind: kill it, show its output
        os.killpg(rerun.pid, signal.SIGKILL)
        pytest.fail(f"the resumed sweep did not finish within 900 s:\n{rerun.communicate()[0][-3000:]}")
    assert rerun.returncode == 0, output[-3000:]
    return {"spec": spec, "root": root, "first": first, "stamp": stamp, "output": output, "done": done}


def test_resumed_sweep_skips_the_finished_segment_and_writes_each_row_once(finished_sweep):
    from raybiphase.results.store import read_rows

    order = ["tiny-clm-0-4", "tiny-clm-4-8", "tiny-mlm40-0-6", "tiny-mlm40-4-8"]
    assert finished_sweep["done"] in (order[:1], sorted(order[:2])), finished_sweep["done"]
    skipped = re.search(r"^pretraining: (\d)/4 segments already done$", finished_sweep["output"], re.M)
    assert skipped, finished_sweep["output"][:3000]
    done = int(skipped[1])  # the shared CLM segment, and the one after it if it ended before its workers did
    assert len(finished_sweep["done"]) <= done <= 2, finished_sweep["output"][:3000]
    assert "Ray dashboard: http://127.0.0.1:" in finished_sweep["output"]  # printed at start: where to watch
    # live progress: each running segment's step, loss and throughput, and where it ended
    progress = re.findall(r"^pretraining: (tiny-\S+) step (\d+)/(\d+), (?:clm|mlm) loss [\d.]+, [\d.]+k? tok/s",
                          finished_sweep["output"], re.M)
    ended = {name for name, step, end in progress if step == end}
    assert len(ended) == 4 - done, finished_sweep["output"][-3000:]  # the segments this invocation ran
    # one slot: segments start by the longest remaining chain, not in waves: the CLM branch (the continued run
    # hangs below it), then the continued run, 6 steps on one worker, before the MLM branch, 4 steps on two (in
    # waves the MLM branch ran beside the CLM branch, before anything continued from it)
    started = re.findall(r"^pretraining: starting (tiny-\S+) \(1 running\)", finished_sweep["output"], re.M)
    assert ["-".join(s.split("-")[:4]) for s in started] == order[done:], started
    last = finished_sweep["output"].strip().splitlines()[-1]  # where the time went, stage by stage
    assert last.startswith("time: ") and f"{4 - done} segment(s), at most" in last and "in optimizer steps" in last
    assert finished_sweep["first"].stat().st_mtime_ns == finished_sweep["stamp"]  # not recomputed
    from raybiphase.checkpoint_meta import read_meta

    shared = read_meta(finished_sweep["first"].parent)  # the CLM prefix says whose weights it holds: both grid runs
    assert len(shared.serves) == 2 and all(name.startswith("tiny-clm-") for name in shared.serves)
    rows = read_rows(finished_sweep["root"] / "pretrain.parquet")
    assert not rows.duplicated(["run", "step"]).any()
    # every run's final export carries its model card, under the run's own name
    cards = [p.read_text() for p in finished_sweep["root"].glob("runs/*/step-*/hf/README.md")]
    assert sorted(c.split("\n# ", 1)[1].split("\n", 1)[0] for c in cards) == sorted(rows["run"].unique())
    steps = rows.groupby("run")["step"].apply(sorted)
    assert sorted(steps.tolist()) == [list(range(1, 7))] + [list(range(1, 9))] * 2


def test_every_column_the_sweep_wrote_is_named_on_the_results_page(finished_sweep):
    from tests.test_docs import undocumented_columns

    assert undocumented_columns(finished_sweep["root"]) == {"pretrain.parquet": []}


def test_continued_run_starts_from_the_decayed_source_with_its_own_schedule(finished_sweep):
    from raybiphase.checkpoint_meta import read_meta

    (source,) = (finished_sweep["root"] / "runs").glob("tiny-clm-4-8-*/step-00000008")
    source = read_meta(source)
    (meta,) = (finished_sweep["root"] / "runs").glob("tiny-mlm40-0-6-*/step-00000006")
    meta = read_meta(meta)
    assert source.decayed and meta.data_start == source.data_end  # continues the stream, no repeated samples
    assert meta.run["model"]["init_from"].endswith("step-00000008") and meta.step == 6
    assert meta.metrics["val/mlm_loss"] < source.metrics["val/mlm_loss"]  # MLM on top of CLM helps MLM loss


def test_a_branch_ends_with_the_weights_of_the_run_alone(finished_sweep, tiny_run):
    (branch,) = (finished_sweep["root"] / "runs").glob("tiny-mlm40-4-8-*/step-00000008/hf/model.safetensors")
    alone = Path(tiny_run.checkpoint.path) / "hf" / "model.safetensors"
    a, b = load_file(str(branch)), load_file(str(alone))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
