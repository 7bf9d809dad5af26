"""A run's metrics history: every report of rank 0, kept beside its checkpoints (<run dir>/history.json) by rank 0
itself as it reports, its journal. Rank 0's training function also returns it whole (the fit's value: how a sweep
gets a segment's rows); the sweep reads the file back only to recover (a segment an earlier invocation finished but
did not record, a fit that returned no reports), as do `raybiphase repair` and the benchmarks.

Rank 0 writes it, not Ray Train's controller: the controller collects a worker's reports when it next polls it, so a
worker lost in between took its last reports with it (seen: a step whose checkpoint was committed had no row, as
its group restarted after that checkpoint)."""

from __future__ import annotations

from raybiphase import storage
from raybiphase.errors import DamagedFile

RESUME_POINT = "resume_point"
"""Marks a report made only because a preemption notice asked for a checkpoint at that step: a place to resume
from, not a result (a run never interrupted has no report there, so the results tables leave it out)."""


def read_history(run_dir: str) -> list[dict]:
    """Every metrics report of a run (rank 0's), one dict per step, in step order."""
    return storage.read_json(storage.join(run_dir, storage.HISTORY)) or []


def checkpoint_reports(run_dir: str, known: set[int] = frozenset()) -> list[dict]:
    """The report each committed checkpoint of a run folder holds in its meta (`metrics`), with its location, in
    step order, the steps in `known` not read: what a damaged history is rebuilt from, and what a history lacks
    when a worker died between a checkpoint's commit and its history."""
    reports = []
    for step in storage.checkpoint_steps(run_dir):
        if step in known:
            continue
        location = storage.join(run_dir, storage.checkpoint_name(step))
        try:
            meta = storage.read_json(storage.meta_path(location))
        except DamagedFile:
            continue
        if isinstance(meta, dict) and isinstance(meta.get("metrics"), dict) and meta["metrics"].get("step") == step:
            reports.append({**meta["metrics"], "checkpoint": location})
    return reports


def results(history: list[dict]) -> list[dict]:
    """The reports a run never interrupted would also have made: without the preemption notices' resume points."""
    return [report for report in history if not report.get(RESUME_POINT)]


class History:
    """Rank 0's history of one run folder: what an earlier attempt wrote, then every report of this one (a restart
    reports a step again; the later report wins). Each report rewrites the file whole. A history found damaged
    (cut short, emptied) is rebuilt from the reports its committed checkpoints' metas hold, said in a line: the
    steps between checkpoints lose their rows, the run goes on."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        try:
            rows = read_history(run_dir)
        except DamagedFile as err:
            rows = checkpoint_reports(run_dir)
            print(f"{err}; rebuilt from the {len(rows)} report(s) its committed checkpoints hold", flush=True)
        self.rows = {row["step"]: row for row in rows}

    def reports(self) -> list[dict]:
        """Every report held, in step order (what the file holds)."""
        return [self.rows[k] for k in sorted(self.rows)]

    def add(self, metrics: dict, checkpoint: str | None = None) -> None:
        row = dict(metrics)
        if checkpoint is not None:
            row["checkpoint"] = checkpoint
        self.rows[row["step"]] = row
        storage.write_json(storage.join(self.run_dir, storage.HISTORY), self.reports())
