"""The benchmarks keep running: the masking one, at a toy size, prints its ratio (its figures go in the README)."""

from __future__ import annotations

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
