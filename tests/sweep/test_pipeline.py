"""Fine-tuning beside pretraining, on a real local Ray: a sweep of two runs that share nothing, one short and one
long; the short run's checkpoint is ready early, and its trials start as soon as a slot is free, beside the long
segment still training. The sweep's own records tell: a trial's record is written as it ends and holds its
seconds, and the long segment's last checkpoint is committed as it ends."""

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
    spec = tiny_base(tmp_path / "results", small_data, name="pipeline")
    spec["resources"] = {"num_workers": 1, "cpus_per_worker": 0.4, "max_concurrent": 2}
    spec["train"] = {**spec["train"], "eval_every": 1000}  # the long segment's steps, not its evaluations
    spec["data"]["max_epochs"] = 1000  # the long run may read the small corpus again
    spec["phases"] = {"steps": SHORT_STEPS, "clm_share": 0.5}
    spec["optim"] = {"warmup_steps": 1, "decay_steps": 1}
    # another seed from step 0: two segments, each its own fit, started together
    spec["sweep"]["runs"] = [{}, {"phases.steps": LONG_STEPS, "train.seed": 1}]
    spec["finetune"] = {"tasks": ["tweets"], "lrs": [1e-3], "seeds": [0], "asha": False, "control": False,
                        "batch_size": 8, "max_steps": 2, "eval_every": 2, "max_examples": 32,
                        "max_eval_examples": 32, "max_len": 64, "cpus_per_trial": 0.1}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_ready_checkpoints_trials_start_and_end_while_a_long_segment_still_trains(small_data, tmp_path):
    spec = _spec(tmp_path, small_data)
    root = tmp_path / "results" / "pipeline"
    proc = subprocess.Popen([sys.executable, "-m", "raybiphase.sweep", str(spec)], cwd=REPO, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    long_end = None
    try:  # until the long segment's last checkpoint is committed; its own trials are not waited for
        deadline = time.time() + 420
        while time.time() < deadline and proc.poll() is None and long_end is None:
            long_end = next(root.glob(f"runs/tiny-*-{LONG_STEPS}-*/{storage.checkpoint_name(LONG_STEPS)}/"
                                      f"{storage.META}"), None)
            time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
    shown = output[-4000:]
    assert long_end is not None, shown
    short_end = next(root.glob(f"runs/tiny-*-{SHORT_STEPS}-*/{storage.checkpoint_name(SHORT_STEPS)}/{storage.META}"))
    records = list((root / "finetune" / "records").glob(f"tiny-clm-*-{SHORT_STEPS}-*__{SHORT_STEPS}__*.json"))
    assert len(records) == 1, shown  # the short run's one trial
    ended = records[0].stat().st_mtime
    began = ended - json.loads(records[0].read_text())["seconds"]
    assert short_end.stat().st_mtime <= began < ended < long_end.stat().st_mtime, shown
    assert any(line.startswith("fine-tuning: batch 1, 1 checkpoint(s) ready:")
               and line.endswith("(1 segment(s) still training)") for line in output.splitlines()), shown
