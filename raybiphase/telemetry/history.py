"""A run's metrics history: every report of rank 0, kept beside its checkpoints (<run dir>/history.json) by rank 0
itself as it reports, and read back by the sweep (rows, W&B curves, the time summary) and the benchmarks.

Rank 0 writes it, not Ray Train's controller: the controller collects a worker's reports when it next polls it, so a
worker lost in between took its last reports with it (seen: a step whose checkpoint was committed had no row, as
its group restarted after that checkpoint)."""

from __future__ import annotations

from raybiphase import storage


RESUME_POINT = "resume_point"
"""Marks a report made only because a preemption notice asked for a checkpoint at that step: a place to resume
from, not a result (a run never interrupted has no report there, so the results tables leave it out)."""


def read_history(run_dir: str) -> list[dict]:
    """Every metrics report of a run (rank 0's), one dict per step, in step order."""
    return storage.read_json(storage.join(run_dir, storage.HISTORY)) or []


def results(history: list[dict]) -> list[dict]:
    """The reports a run never interrupted would also have made: without the preemption notices' resume points."""
    return [report for report in history if not report.get(RESUME_POINT)]


class History:
    """Rank 0's history of one run folder: what an earlier attempt wrote, then every report of this one (a restart
    reports a step again; the later report wins). Each report rewrites the file whole."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.rows = {row["step"]: row for row in read_history(run_dir)}

    def add(self, metrics: dict, checkpoint: str | None = None) -> None:
        row = dict(metrics)
        if checkpoint is not None:
            row["checkpoint"] = checkpoint
        self.rows[row["step"]] = row
        storage.write_json(storage.join(self.run_dir, storage.HISTORY), [self.rows[k] for k in sorted(self.rows)])
