"""Fine-tuning pipelined with pretraining, on a real local Ray: a two-run sweep whose runs share
their CLM prefix; the short run's child segment is pretrained, exported and fine-tuned while the long run's child
still trains beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import tiny_base

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
LONG_STEPS = 100_000  # never reached here: the test ends the sweep once the short branch is fine-tuned


def _spec(tmp_path: Path, small_data) -> Path:
    spec = tiny_base(tmp_path / "results", small_data, name="pipeline")
    spec["resources"] = {"num_workers": 1, "cpus_per_worker": 0.4, "max_concurrent": 2}
    spec["data"]["max_epochs"] = 1000  # the long run may read the small corpus again (it is never reached)
    # both: 4 CLM steps, then MLM; they share everything until the short run's decay (step 6), then branch
    spec["sweep"]["runs"] = [{"phases.clm_share": 0.5},
                             {"phases.clm_share": None, "phases.clm_steps": 4, "phases.steps": LONG_STEPS}]
    spec["finetune"] = {"tasks": ["tweets"], "lrs": [1e-3], "seeds": [0], "asha": False, "control": False,
                        "batch_size": 8, "max_steps": 4, "eval_every": 2, "max_examples": 64,
                        "max_eval_examples": 64, "max_len": 64, "cpus_per_trial": 0.1}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_short_branch_is_fine_tuned_while_a_long_run_still_trains(small_data, tmp_path):
    spec = _spec(tmp_path, small_data)
    root = tmp_path / "results" / "pipeline"
    env = {**os.environ, "RAYBIPHASE_PROGRESS_S": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "raybiphase.sweep", str(spec)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    records = root / "finetune" / "records"
    deadline, fine_tuned = time.time() + 420, []
    try:
        while time.time() < deadline and proc.poll() is None and not fine_tuned:
            fine_tuned = sorted(p.name for p in records.glob("tiny-clm-4-mlm40-8-*.json")) if records.exists() else []
            time.sleep(1)
        long_run = list((root / "runs").glob("tiny-mlm40-6-100k-*"))
        long_ended = [p for p in long_run if (p / f"step-{LONG_STEPS:08d}").exists()]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the long run is never waited for
        output = proc.communicate()[0]
    lines = output.splitlines()
    shown = "\n".join(line for line in lines if "/100000, " not in line)[-4000:]  # not the long run's progress
    assert len(fine_tuned) == 1, shown  # the short run's final checkpoint
    assert len(long_run) == 1 and not long_ended, shown
    ready = [line for line in lines if line.startswith("fine-tuning: batch 1, 1 checkpoint(s) ready: tiny-clm-4-mlm40-8-")]
    assert len(ready) == 1 and ready[0].endswith("(1 segment(s) still training)"), shown
    assert not any(line.startswith("pretraining: 3/3 segments") for line in lines), shown
