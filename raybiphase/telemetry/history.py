"""A run's metrics history: every report of rank 0, kept beside its checkpoints (<run dir>/history.json) by the Train
controller and read back by the sweep (rows, W&B curves, the time summary) and the benchmarks."""

from __future__ import annotations

from raybiphase import storage


def read_history(run_dir: str) -> list[dict]:
    """Every metrics report of a run (rank 0's), one dict per step, in step order."""
    return storage.read_json(storage.join(run_dir, storage.HISTORY)) or []


class HistoryCallback:
    """Runs in the Train controller: keeps every report in <run dir>/history.json (a restart re-reports a step,
    the later report wins). Ray Train's own Result keeps only the reports that carried a checkpoint."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.rows = {row["step"]: row for row in read_history(run_dir)}

    def after_report(self, run_context, metrics, checkpoint):
        row = dict(metrics[0])
        if checkpoint is not None:
            row["checkpoint"] = checkpoint.path
        self.rows[row["step"]] = row
        storage.write_json(storage.join(self.run_dir, storage.HISTORY), [self.rows[k] for k in sorted(self.rows)])

    def after_exception(self, run_context, worker_exceptions):
        pass
