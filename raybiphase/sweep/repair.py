"""Rebuild a sweep's tables from its journals: `raybiphase repair SPEC` (the same spec and `--set`s as the sweep).

A sweep's tables are derived: every pretraining row comes from a run's history (or, where a worker died before
writing it, from its committed checkpoints' metas) and every fine-tuning row from its trial's record. `repair`
takes the sweep folder's lease (no driver writes meanwhile), then:

1. moves every table part that is not a readable Parquet file, and every trial record that is not readable JSON,
   to `<sweep>/damaged/` (nothing is deleted: a part may still be read by hand);
2. appends, for every segment whose last checkpoint is committed, its rows missing from pretrain.parquet, and for
   every trial of a trained checkpoint or a control with a record, its rows (and the copies for the runs that share
   its weights) missing from finetune.parquet, and the baselines' rows; a row already in a table is never written
   again (the tables' keys), so repairing a sound sweep changes nothing;
3. rewrites summary.parquet from finetune.parquet.

Nothing trains and Ray does not start. What could not be rebuilt is said: trials of trained checkpoints without a
record (their rows, if a damaged part held them, are lost; the next run of the sweep trains them again) and
segments not trained yet (the sweep trains them). Redraw the report with `raybiphase report <sweep folder>`.
"""

from __future__ import annotations

import dataclasses
import io

from raybiphase import storage
from raybiphase.config import SweepSpec
from raybiphase.errors import DamagedFile, UserError
from raybiphase.finetune.fanout import CheckpointWaves, Fanout
from raybiphase.planning.preflight import plan_sweep
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from raybiphase.storage import SweepPaths
from raybiphase.sweep import lease
from raybiphase.sweep.context import SweepContext
from raybiphase.sweep.finetuning import baseline_rows, control_sources, finetune_sources, trials_done
from raybiphase.sweep.segments import record_pretraining
from raybiphase.telemetry.console import STDOUT, Console

TABLES = (storage.PRETRAIN_FILE, storage.FINETUNE_FILE, storage.SUMMARY_FILE)


@dataclasses.dataclass
class Repaired:
    """What `repair` did: the files moved aside (original -> where it now is), the rows written back per table,
    and the trials of trained checkpoints that have no record (their rows could not be rebuilt)."""

    moved: dict[str, str] = dataclasses.field(default_factory=dict)
    written: dict[str, int] = dataclasses.field(default_factory=dict)
    unrecorded: int = 0
    untrained: int = 0


def repair(spec: SweepSpec, console: Console = STDOUT) -> Repaired:
    """Rebuild the tables of the sweep `spec` names from its journals (module docstring); returns what it did."""
    spec, plan = plan_sweep(spec, console=Console(io.StringIO()))  # its plan lines are the sweep's, not repair's
    ctx = SweepContext(spec, plan, SweepPaths.of(spec.sweep.storage, spec.sweep.name), console=console)
    if not storage.exists(ctx.paths.root):
        raise UserError(f"{ctx.paths.root}: no sweep folder there to repair (sweep.storage, sweep.name)")
    done = Repaired()
    with lease.hold(ctx.paths.lease, spec.sweep.lease_timeout_s, console=console):
        for name in TABLES:
            for part in store.damaged_parts(ctx.paths.table(name)):
                done.moved[part] = _move_aside(ctx.paths, part)
        segments = [s for s in plan.segments.values() if ctx.segment_done(s)]
        done.untrained = len(plan.segments) - len(segments)
        before = {name: _rows(ctx.paths, name) for name in TABLES[:2]}
        for segment in segments:
            record_pretraining(ctx, segment)
        if spec.finetune.tasks:
            _finetune(ctx, {s.id for s in segments}, done)
            store.write_summary(ctx.paths.root)
        done.written = {name: _rows(ctx.paths, name) - count for name, count in before.items()}
    for part, where in done.moved.items():
        console.say(f"repair: {part}: damaged; moved to {where}")
    for name, count in done.written.items():
        console.say(f"repair: {name}: {count} row(s) written back from the sweep's journals")
    if done.unrecorded:
        console.say(f"repair: not rebuilt: {done.unrecorded} trial(s) of trained checkpoints have no record; "
                    "the next run of the sweep fine-tunes them again")
    if done.untrained:
        console.say(f"repair: {done.untrained} segment(s) not trained yet; the next run of the sweep trains them")
    console.say(f"repair: done; draw the report with: raybiphase report {ctx.paths.root}")
    return done


def _finetune(ctx: SweepContext, segments: set[str], done: Repaired) -> None:
    """finetune.parquet's rows from the records of the trained checkpoints' and exported controls' trials."""
    table = ctx.paths.table(storage.FINETUNE_FILE)
    experiment = storage.join(ctx.paths.root, "finetune")
    fanout = dataclasses.replace(Fanout.of(ctx.spec), wandb=None)  # W&B gets its runs from the sweep, not here
    sources = control_sources(ctx, export=False) + finetune_sources(ctx, segments)
    records = storage.join(experiment, storage.RECORDS)
    for name in storage.list_files(records) if storage.exists(records) else []:
        try:
            storage.read_json(storage.join(records, name))
        except DamagedFile as err:  # moved aside: its trial is one without a record
            done.moved[err.location] = _move_aside(ctx.paths, err.location)
    waves = CheckpointWaves(sources, fanout, experiment=experiment, done=trials_done(table))
    done.unrecorded = sum(record is None for record in waves.records.values())
    for rows in (waves.rows(), baseline_rows(ctx.spec)):
        if rows:
            store.append_rows(table, rows, key=result_rows.FINETUNE_KEY)


def _rows(paths: SweepPaths, name: str) -> int:
    key = result_rows.PRETRAIN_KEY if name == storage.PRETRAIN_FILE else result_rows.FINETUNE_KEY
    return len(store.done_keys(paths.table(name), key))


def _move_aside(paths: SweepPaths, location: str) -> str:
    """`location` (a file inside the sweep folder) moved under <sweep>/damaged/ at the same relative path."""
    relative = location[len(paths.root):].lstrip("/")
    where = storage.join(paths.damaged, relative)
    storage.write_bytes(where, storage.read_bytes(location))
    storage.delete_file(location)
    return where

