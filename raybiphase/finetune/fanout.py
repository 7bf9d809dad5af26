"""The fine-tuning fan-out of checkpoints: tasks x learning rates x seeds, with ASHA stopping losers, as an object
that gives its trials wave by wave (`CheckpointWaves`); raybiphase.sweep.scheduler runs those waves on long-lived
Tuners (raybiphase.finetune.tuner) beside the sweep's segments, or alone (`raybiphase finetune`, the benchmarks).

One trial per (run, pretrain_step, task, lr, seed) of each distinct checkpoint's grid (`FinetuneSource.grid`: an
intermediate checkpoint may take fewer tasks, LRs or seeds, finetune.exports; runs sharing a checkpoint get copies
of its rows: `FinetuneSource.shared_by`), planned as a `TrialSpec` (raybiphase.finetune.spec) and fine-tuned by
`raybiphase.finetune.trial.run_trial` in a Tune trial. With `finetune.asha`, ASHA (time_attr="step",
metric="val_score", mode="max") stops weak trials at its rungs (grace_period = the first evaluation, reduction
factor 3, max_t = finetune.max_steps); each checkpoint and task gets its own ASHA, so scores of different tasks
never compete. Without it the full grid runs.

Training groups (`tasks.training_groups`): tasks that train on another's pairs are not trained again. nq and mldr
train on MS MARCO's pairs, so per checkpoint, LR and seed one trial trains (msmarco when listed, else the first of
them listed) and scores the model on each task's own validation split at every evaluation and its test split at
the end; every task gets its row, with its own validation score, so each task's best LR is chosen on its own
validation, as the authors' evaluation code does. The trial writes its riders' records before its own; ASHA sees
the trained task's validation only (a stopped trial gives every task a stopped row, each with its own last
validation score: `rider_metric`), and the completion pass reruns the trained trial for a rider's stopped row.

Stopped trials: their row keeps the last validation score and step, `stopped_early=True`, `test_score=NaN` (a
stopped trial is ended at its report, so its test split is never scored). The paper reports the test mean over
all seeds of the best LR, so a *completion pass* follows: per (run, task), the LR that leads on its finished seeds
(raybiphase.results.aggregate.best_lr with complete_only=False); its stopped seeds are run again from the start
without ASHA (their row then has `completed_after_stop=True`; `steps_run` and `seconds` count both attempts).
Repeated until the leader has no stopped seed: it is then the best complete LR, the report's choice.
`finetune.complete_lrs` completes every stopped trial instead, so the LR sensitivity rests on complete LR x seed
cells (ASHA then only orders the work).

Results are values: a finished trial's rows, built once in its process from its spec and result (`record_final`),
come back to the driver in its last report (`ROWS`, through Tune's own result); a stopped trial's are built by the
driver from that report (`trial_rows`). Nothing between a trial's end and its rows reads storage.

Resuming: every trial leaves a record `<storage>/<name>/records/<key>.json`, its rows' journal
(raybiphase.finetune.records; finished trials write theirs before their last report, the driver writes the stopped
ones as they end), named by its key and a digest of the settings that shape a trial; records are read only when a
fan-out is planned. A rerun skips the keys in `done` (rows the caller already holds) and the keys with a record
(returned as rows again, not recomputed): only the missing trials run; with ASHA off, trials ASHA stopped before
run again.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

from raybiphase import storage
from raybiphase.config import FinetuneConfig, FinetuneGrid, SweepSpec
from raybiphase.errors import UserError
from raybiphase.finetune.encoders import is_hub_id
from raybiphase.finetune.hub import parse_revisions
from raybiphase.finetune.records import read_record, record_path, trial_settings, write_record
from raybiphase.finetune.spec import FinetuneSource, TrialSpec
from raybiphase.finetune.tasks import get_task, training_groups
from raybiphase.finetune.trial import TrialResult, find_hf_dir, load_checked_tokenizer, resolve_hf_dir
from raybiphase.results import rows as result_rows
from raybiphase.results.aggregate import best_lr
from raybiphase.results.rows import FinetuneRow, trial_key
from raybiphase.results.wandb_upload import FinetuneLog
from raybiphase.telemetry.wandb import sweep_settings

REDUCTION_FACTOR = 3

Wave = list[TrialSpec]
"""Trials a fan-out needs ended before it can go on: its ASHA pass, then each completion pass."""


@dataclasses.dataclass(frozen=True)
class Fanout:
    """What the fan-out uses of a sweep, and nothing else."""

    finetune: FinetuneConfig
    sweep: str = ""
    """The rows' `sweep` column."""
    max_concurrent: int = 1
    """Trials running at once, at most (fewer beside pretraining: raybiphase.sweep.scheduler.trial_capacity)."""
    wandb: dict | None = None
    """W&B settings (raybiphase.telemetry.wandb.sweep_settings), or None."""
    grace_period: int | None = None
    """ASHA's first rung; None: the first evaluation (finetune.eval_every)."""
    reduction_factor: float = REDUCTION_FACTOR
    complete_best: bool = True
    """Run the completion pass (module docstring)."""

    @classmethod
    def of(cls, spec: SweepSpec) -> Fanout:
        return cls(spec.finetune, spec.sweep.name, spec.finetune.max_concurrent or spec.run.resources.max_concurrent,
                   sweep_settings(spec))


# ------------------------------------------------------------------------------------------------ planning


def grid_of(source: FinetuneSource, cfg: FinetuneConfig) -> FinetuneGrid:
    """What a checkpoint is fine-tuned on: its own grid (an intermediate checkpoint's, from finetune.exports), else
    the full grid."""
    return source.grid or cfg.grid()


def plan_specs(sources: list[FinetuneSource], cfg: FinetuneConfig, *, experiment: str = "",
               sweep: str = "") -> list[TrialSpec]:
    """Every planned row as a spec (no riders), one per (checkpoint, task, LR, seed) of the checkpoint's grid
    (`grid_of`), group by group (checkpoint x task), seed-major so each ASHA rung sees every LR early; its record
    under `experiment`."""
    settings = trial_settings(cfg)
    out = []
    for source in sources:
        grid = grid_of(source, cfg)
        for name, seed, lr in ((name, seed, lr) for name in grid.tasks for seed in grid.seeds for lr in grid.lrs):
            spec = TrialSpec(source.run, int(source.pretrain_step), source.hf_dir, get_task(name), float(lr),
                             int(seed), "", sweep, dict(source.columns), asha=cfg.asha, row_source=source.row_source)
            out.append(dataclasses.replace(spec, record=record_path(experiment, spec.key, settings)))
    return out


def plan_trials(sources: list[FinetuneSource], cfg: FinetuneConfig, *, experiment: str = "") -> list[TrialSpec]:
    """The trials that train, in `plan_specs`' order: one per training group of the checkpoint's tasks (checkpoint
    x trained task x LR x seed), each with its riders (the other tasks of its group)."""
    tasks = {(s.run, s.pretrain_step): grid_of(s, cfg).tasks for s in sources}
    trained = [s for s in plan_specs(sources, cfg, experiment=experiment)
               if s.task.name in training_groups(tasks[(s.run, s.pretrain_step)])]
    return _trials_for(trained, tasks, experiment, trial_settings(cfg))


def _as_task(spec: TrialSpec, task: str, experiment: str, settings: str) -> TrialSpec:
    """`spec`'s trial (checkpoint, LR, seed) for another task, with its own record and no riders."""
    other = dataclasses.replace(spec, task=get_task(task), riders=())
    return dataclasses.replace(other, record=record_path(experiment, other.key, settings))


def trained_in(spec: TrialSpec, tasks, experiment: str, settings: str) -> TrialSpec:
    """The trial that trains the model a planned spec is tested on (`tasks`: those its checkpoint is fine-tuned on),
    with its riders: the spec itself unless it rides along."""
    trained, members = next((name, members) for name, members in training_groups(tasks).items()
                            if spec.task.name in members)
    trial = spec if trained == spec.task.name else _as_task(spec, trained, experiment, settings)
    return dataclasses.replace(trial, riders=tuple(_as_task(spec, m, experiment, settings) for m in members[1:]))


def rider_metric(task: str) -> str:
    """The Tune metric holding a rider's validation score ("val_score" is the trained task's, which ASHA reads)."""
    return f"val_score:{task}"


# ------------------------------------------------------------------------------------------------ records


ROWS = "rows"
"""The key of a finished trial's last report holding its rows as plain records (FinetuneRow.record: its own, then
its riders'): the value the driver takes them from, with no read of storage."""


def record_final(spec: TrialSpec, final: TrialResult) -> dict:
    """A finished trial's rows, each built here once from the spec and the result, journaled (its riders' records
    first, its own last: a trial whose own record is on disk has every row on disk) and returned as `{ROWS: [...]}`
    for its last report. Called in the trial's process before that report, at which ASHA may end the process: a
    trial that ran to its end is never run again, whatever happens to the driver."""
    own, riders = spec.finished(final), [r.finished(final.also_tested[r.task.name]) for r in spec.riders]
    for member, row in [*zip(spec.riders, riders), (spec, own)]:
        write_record(member.record, row)
    return {ROWS: [row.record() for row in [own, *riders]]}


def journaled(spec: TrialSpec) -> tuple[dict, dict] | None:
    """The last report of a trial that already finished, rebuilt from its journal, as (its metrics as `run_trial`
    reports them, `record_final`'s value): its own record finished (written last, so its riders' are on disk too),
    or None. A trial whose process ended after `record_final` but before Tune took its last report (a lost node) is
    run again by Tune; it reports this at once and trains nothing, so a finished trial is never computed twice and
    ASHA, stopping the rerun early, cannot turn its row into a stopped one."""
    own = read_record(spec.record)
    if own is None or own.stopped_early:
        return None
    rows = [own, *(read_record(rider.record) for rider in spec.riders)]
    if any(row is None for row in rows):
        return None
    also_val = {row.task: row.val_score for row in rows[1:]}
    return {"step": own.steps_run, "val_score": own.val_score, "also_val": also_val}, {ROWS: [r.record() for r in rows]}


def trial_rows(spec: TrialSpec, metrics: dict, *, failed: bool) -> list[FinetuneRow] | None:
    """The rows of a trial Tune ended (its own, then its riders'), from its last report (`metrics`): a finished
    trial's carry them (ROWS); a trial with none was stopped by ASHA at that report and gets stopped rows, each with
    its task's last validation score. None when the trial `failed` before finishing."""
    if ROWS in metrics:
        return [FinetuneRow.from_record(record) for record in metrics[ROWS]]
    if failed:
        return None
    step, seconds = int(metrics.get("step", 0)), float(metrics.get("time_total_s", 0.0))
    return [member.stopped(val_score=metrics.get("val_score" if member is spec else rider_metric(member.task.name),
                                                 math.nan), step=step, seconds=seconds)
            for member in [spec, *spec.riders]]


# ------------------------------------------------------------------------------------------------ the fan-out


def check_sources(sources: list[FinetuneSource], cfg: FinetuneConfig) -> list[FinetuneSource]:
    """The sources with absolute HF folders (trials run in their own directories, on any node); UserError for a
    bad task name or checkpoint, before anything runs."""
    for task_name in [*cfg.tasks, *(task for source in sources for task in grid_of(source, cfg).tasks)]:
        get_task(task_name)
    sources = [s if is_hub_id(s.hf_dir) else dataclasses.replace(s, hf_dir=storage.absolute(s.hf_dir))
               for s in sources]
    for source in sources:
        if storage.is_uri(source.hf_dir):  # weights stay in the bucket until a trial's node needs them
            find_hf_dir(source.hf_dir)
        else:
            load_checked_tokenizer(resolve_hf_dir(source.hf_dir), trust_remote_code=cfg.trust_remote_code)
    return sources


class CheckpointWaves:
    """The fine-tuning of checkpoints as waves of trials: `next_wave()` gives the first (the missing grid trials),
    `next_wave(rows)`, given the rows its trials ended with (`ended`, trial by trial), the next (each completion
    pass), and None once nothing is left; `rows()` then gives one row per task, LR and seed not in `done` (keys
    rows.TRIAL_KEY) as records (FinetuneRow.record), with a copy for every run in the source's `shared_by`. Each
    checkpoint is fine-tuned on its grid (`grid_of`); a training group's tasks share one trial (module docstring).
    Bad task names or checkpoints raise UserError when it is made, before the first wave."""

    def __init__(self, sources: list[FinetuneSource], cfg: Fanout, *, experiment: str, done=frozenset()):
        sources = check_sources(sources, cfg.finetune)
        self.cfg, self.experiment = cfg, experiment
        self.done = {trial_key(dict(zip(result_rows.TRIAL_KEY, k))) for k in done}
        self.copies = {(s.run, s.pretrain_step): s.shared_by for s in sources}
        self.tasks = {(s.run, s.pretrain_step): grid_of(s, cfg.finetune).tasks for s in sources}
        self.settings = trial_settings(cfg.finetune)
        # a row is planned when it, or the row of a run sharing its checkpoint, is missing; its trial runs when it
        # has no record (the trial that trains its group's model: the whole group's rows are recorded again)
        self.plan = [s for s in plan_specs(sources, cfg.finetune, experiment=experiment, sweep=cfg.sweep)
                     if s.key not in self.done or any(k not in self.done for k in self._copy_keys(s))]
        self.records = {s.key: read_record(s.record) for s in self.plan}
        for key, record in self.records.items():
            if record is not None and record.stopped_early and not cfg.finetune.asha:
                self.records[key] = None  # the full grid was asked for: a trial ASHA stopped runs again
        self.new: set = set()  # the keys this invocation fine-tuned (W&B logs their groups)
        self.wandb = FinetuneLog(cfg.wandb)  # each trial as it ends, each group's table once all ended
        self.stage = "start"  # then "grid" (its wave out), "complete" (a completion pass out), "done"
        self.passes = 0

    def _copy_keys(self, spec: TrialSpec) -> list[tuple]:
        return [(other.run, *spec.key[1:]) for other in self.copies[(spec.run, spec.pretrain_step)]]

    def ended(self, spec: TrialSpec, metrics: dict, *, failed: bool) -> list[FinetuneRow] | None:
        """The rows of a trial of a wave Tune ended (`trial_rows`, from its last report). A stopped row is
        journaled at once, unless its task's record was on disk when the fan-out was planned (a trial that trains a
        group again for a rider's missing row keeps its own earlier record, and its row); a finished trial
        journaled its rows itself (`record_final`)."""
        rows = trial_rows(spec, metrics, failed=failed)
        if self.cfg.wandb:  # W&B: a point per trial on its (checkpoint, task) run, as it ends
            self.wandb.trial([row.record() for row in rows or []])
        for i, (member, row) in enumerate(zip([spec, *spec.riders], rows or [])):
            if row.stopped_early and self.records.get(row.key) is not None:
                rows[i] = self.records[row.key]
            elif row.stopped_early and row.key in self.records:
                write_record(member.record, row)
        return rows

    def next_wave(self, rows: list[FinetuneRow] | None = None) -> Wave | None:
        """The next trials to run, given the rows the last wave ended with; None when nothing is left."""
        if self.stage == "start":
            missing = _trials_for([s for s in self.plan if self.records[s.key] is None], self.tasks,
                                  self.experiment, self.settings)
            self.stage = "grid"
            if missing:
                return missing
        elif self.stage == "grid":
            for row in rows or []:
                self.new.add(row.key)
                if row.key in self.records:  # a trained task's row already in `done` is not planned
                    self.records[row.key] = row
        elif self.stage == "complete":
            self._completed(rows or [])
        if self.stage in ("grid", "complete") and self.cfg.complete_best:
            self.stage = "complete"
            wave = self._completion_pass()
            if wave:
                return wave
        self.stage = "done"
        return None

    def _completion_pass(self) -> Wave:
        """The next completion pass (`completion_wave`), at most one per LR."""
        if self.passes >= len(self.cfg.finetune.lrs):
            return []
        self.passes += 1
        return completion_wave(self.records, self.plan, self.cfg, self.tasks, self.experiment, self.settings)

    def _completed(self, rows: list[FinetuneRow]) -> None:
        self.new |= record_completed(self.records, self.plan, rows)

    def rows(self) -> list[dict]:
        """The rows to append, once `next_wave` has returned None (W&B gets the groups this invocation added to)."""
        rows = []
        for spec in self.plan:
            record = self.records[spec.key]
            if record is not None:
                shared = [_shared_row(record, other) for other in self.copies[(spec.run, spec.pretrain_step)]]
                rows += [dataclasses.replace(row, finetune_settings=self.settings).record()
                         for row in [record, *shared] if row.key not in self.done]
        self.wandb.groups(rows, self.new)
        return rows


def completion_wave(records: dict, plan: list[TrialSpec], cfg: Fanout, tasks: dict, experiment: str,
                    settings: str) -> Wave:
    """Rerun, without ASHA, the stopped seeds of each group's best LR (aggregate.best_lr: the report's rule); with
    `finetune.complete_lrs`, every stopped trial at once. A rider's stopped row reruns the trial that trains its
    model (its group's rows all stopped with it). Empty once the best LR of every group has no stopped seed."""
    groups = defaultdict(list)
    for row in records.values():
        if row is not None:
            groups[(row.run, row.pretrain_step, row.task)].append(row)
    complete_lrs, rerun = cfg.finetune.complete_lrs, []
    for rows in groups.values():
        lr = None if complete_lrs else best_lr([r.record() for r in rows], complete_only=False)
        rerun += [r for r in rows if r.stopped_early and (complete_lrs or r.lr == lr)]
    planned = {s.key: s for s in plan}
    trials = _trials_for([planned[r.key] for r in rerun], tasks, experiment, settings)
    return [dataclasses.replace(t, asha=False) for t in trials]


def record_completed(records: dict, plan: list[TrialSpec], rows: list[FinetuneRow]) -> set:
    """A completion pass's rows: each completes its stopped row in `records` (result_rows.completed_row) and is
    written as its trial's record; returns their keys."""
    planned, keys = {s.key: s for s in plan}, set()
    for row in rows:
        if row.key not in records:  # a trained task's row already in `done`
            continue
        row = result_rows.completed_row(records[row.key], row)
        write_record(planned[row.key].record, row)
        records[row.key] = row
        keys.add(row.key)
    return keys


def _trials_for(specs: list[TrialSpec], tasks: dict, experiment: str, settings: str) -> list[TrialSpec]:
    """The trials to run for these planned specs, each once, in their order, each with its riders."""
    trials = (trained_in(s, tasks[(s.run, s.pretrain_step)], experiment, settings) for s in specs)
    return list({trial.key: trial for trial in trials}.values())


def _shared_row(row: FinetuneRow, source: FinetuneSource) -> FinetuneRow:
    """The row of `source`'s run for a trial run on a checkpoint it shares with `row`'s run: the same scores, its own
    name and settings, `trials_of` naming the run the trial ran under (the report counts the checkpoint once)."""
    return dataclasses.replace(row, run=source.run, settings=dict(source.columns), trials_of=row.run)


def check_tasks(cfg: FinetuneConfig) -> None:
    """UserError for an unknown task in finetune.tasks."""
    if not cfg.tasks:
        raise UserError("finetune.tasks: empty; name at least one task, e.g. --set 'finetune.tasks=[sst2]'")
    for name in cfg.tasks:
        get_task(name)
    parse_revisions(cfg.dataset_revisions)
