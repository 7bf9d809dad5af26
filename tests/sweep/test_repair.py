"""`raybiphase repair` on bad input (the repair itself runs on a finished study: tests/sweep/test_beyond_study.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a `raybiphase repair` process: its imports take seconds
def test_repair_of_a_sweep_that_never_ran_is_one_line_and_writes_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "raybiphase", "repair", "sweeps/quickstart.yaml", "--set",
                           f"sweep.storage={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "no sweep folder there to repair" in done.stderr
    assert str(tmp_path / "quickstart") in done.stderr
    assert not list(tmp_path.iterdir())
