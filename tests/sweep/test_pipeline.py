"""Fine-tuning beside pretraining, on a real local Ray: a sweep of two runs that share nothing, one short and one
long; the short run's checkpoint is ready early, and its trials start as soon as a slot is free, beside the long
segment still training; a public encoder's (finetune.baselines) trial runs from the sweep's start, beside both. The
sweep's own records tell: a trial's record is written as it ends and holds its seconds, and the long segment's
progress beat (every second) says it trained on after both trials ended, its last checkpoint not yet committed; the
sweep is stopped there, its remaining steps having nothing more to show. W&B (offline here) sees the short segment
while it trains: its rank-0 worker's run, with its lineage, curves against tokens and its checkpoints by reference,
and the short run's whole curve once its segment ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from raybiphase import storage
from tests.conftest import tiny_base

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
SHORT_STEPS, LONG_STEPS = 4, 240


def _spec(tmp_path: Path, small_data) -> Path:
    from tests.finetune.test_encoders import make_tiny_bert

    spec = tiny_base(tmp_path / "results", small_data, name="pipeline")
    spec["sweep"]["wandb_project"] = "raybiphase-test"  # offline here: folders kept in <sweep>/wandb
    spec["resources"] = {"num_workers": 1, "cpus_per_worker": 0.4, "max_concurrent": 2}
    spec["train"] = {**spec["train"], "eval_every": 1000}  # the long segment's steps, not its evaluations
    spec["data"]["max_epochs"] = 1000  # the long run may read the small corpus again
    spec["phases"] = {"steps": SHORT_STEPS, "clm_share": 0.5}
    spec["optim"] = {"warmup_steps": 1, "decay_steps": 1}
    # another seed from step 0: two segments, each its own fit, started together
    spec["sweep"]["runs"] = [{}, {"phases.steps": LONG_STEPS, "train.seed": 1}]
    spec["finetune"] = {"tasks": ["tweets"], "lrs": [1e-3], "seeds": [0], "asha": False, "control": False,
                        "batch_size": 8, "max_steps": 2, "eval_every": 2, "max_examples": 32,
                        "max_eval_examples": 32, "max_len": 64, "cpus_per_trial": 0.1,
                        "baselines": [str(make_tiny_bert(tmp_path / "bert"))]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_ready_checkpoints_trials_start_and_end_while_a_long_segment_still_trains(ray_cluster, small_data, tmp_path):
    import ray

    spec = _spec(tmp_path, small_data)
    root = tmp_path / "results" / "pipeline"
    # the driver joins the tests' running Ray through RAY_ADDRESS, as a sweep on a cluster does (no preemption
    # watcher: no autoscaler drains it)
    env = {**os.environ, "WANDB_MODE": "offline", "RAYBIPHASE_PROGRESS_S": "1", "WANDB_DIR": str(tmp_path),
           "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "raybiphase.sweep", str(spec)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    trial = baseline = long_end = beat = None
    short_trials = f"finetune/records/tiny-clm-*-{SHORT_STEPS}-*__{SHORT_STEPS}__*.json"  # under root
    baseline_trials = "*/bert@local-*/trials/records/*.json"  # under the public encoders' cache

    def trained_after(*records: Path | None) -> bool:  # the long segment's progress beat, newer than the records
        return all(records) and beat is not None and beat.stat().st_mtime > max(r.stat().st_mtime for r in records)

    try:  # until the short run's trial and the public encoder's ended and the long segment trained on, or it ended
        deadline = time.time() + 420
        while time.time() < deadline and proc.poll() is None and long_end is None and not trained_after(trial,
                                                                                                        baseline):
            trial = next(root.glob(short_trials), None)
            baseline = next((root.parent / "hub-baselines").glob(baseline_trials), None)
            beat = next(root.glob(f"runs/tiny-*-{LONG_STEPS}-*/{storage.PROGRESS_FILE}"), None)
            long_end = next(root.glob(f"runs/tiny-*-{LONG_STEPS}-*/{storage.checkpoint_name(LONG_STEPS)}/"
                                      f"{storage.META}"), None)
            time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
    shown = output[-4000:]
    # both trials ended while the long segment trained: it reported a step after both and had not committed its
    # end (the sweep is stopped there: the rest of its steps would show nothing more)
    assert long_end is None and trained_after(trial, baseline), shown
    short_end = next(root.glob(f"runs/tiny-*-{SHORT_STEPS}-*/{storage.checkpoint_name(SHORT_STEPS)}/{storage.META}"))
    records = list(root.glob(short_trials))
    assert len(records) == 1, shown  # the short run's one trial
    ended = records[0].stat().st_mtime
    began = ended - json.loads(records[0].read_text())["seconds"]
    assert short_end.stat().st_mtime <= began < ended, shown
    assert any(line.startswith("fine-tuning: batch ") and f"-{SHORT_STEPS}-" in line
               and line.endswith("(1 segment(s) still training)") for line in output.splitlines()), shown
    # the public encoder's one trial (kept in its cache for later sweeps) ended while the long segment trained: above
    assert len(list((root.parent / "hub-baselines").glob(baseline_trials))) == 1, shown
    # W&B: the short segment was logged live by its rank-0 worker (its run's folder reaches <sweep>/wandb as it
    # finishes), and the short run's whole curve by the driver as its segment ended
    from raybiphase.results.store import read_rows
    from raybiphase.telemetry.wandb import stable_id
    from raybiphase.telemetry.wandb_files import logged

    short = short_end.parent.parent.name
    rows = read_rows(root / "pretrain.parquet")
    found = {f["run"].run_id: f for f in (logged(p) for p in sorted((root / "wandb").glob("offline-run-*")))}
    (short_run,) = rows[rows["segment"] == short]["run"].unique()
    assert stable_id("pipeline", "pretrain", short_run) in found, sorted(found)
    segment = found.get(stable_id("pipeline", "segment", short))
    assert segment is not None and segment["run"].job_type == "segment", sorted(found)
    assert segment["config"]["lineage.segment"] == short and segment["config"]["lineage.parent"] == ""
    assert segment["config"]["lineage.serves"] == [short_run]
    assert any(m.step_metric == "tokens_seen" for m in segment["metrics"])
    assert [h["tokens_seen"] for h in segment["history"] if "train/clm_loss" in h or "train/mlm_loss" in h]
    checkpoints = [a["metadata"]["uri"] for a in segment["artifacts"] if a["type"] == "checkpoint"]
    assert checkpoints and all(uri.startswith(str(root / "runs" / short)) for uri in checkpoints)
