"""The fine-tuning fan-out on Ray Tune: checkpoints x tasks x learning rates x seeds, with ASHA stopping losers.

    rows = run_fanout([FinetuneSource("tiny-clm-10-mlm40-40-a1b2c3", 40, ".../hf", {"phases.clm_share": 0.25})],
                      Fanout.of(spec), storage="/abs/results/quickstart", name="finetune", done=keys_already_in_parquet)

One Tune trial per (run, pretrain_step, task, lr, seed) of each distinct checkpoint's grid (`FinetuneSource.grid`:
an intermediate checkpoint may take fewer tasks, LRs or seeds, finetune.exports; runs sharing a checkpoint get
copies of its rows: `FinetuneSource.shared_by`): a function trainable that fine-tunes in its own process
(`raybiphase.finetune.trial.run_trial`, holding `finetune.cpus_per_trial` CPUs and `finetune.gpus_per_trial` GPUs),
reporting `step` and `val_score` at every evaluation. With `finetune.asha`, ASHA (time_attr="step", metric="val_score", mode="max") stops weak trials at
its rungs (grace_period = the first evaluation, reduction_factor 3, max_t = finetune.max_steps); each
checkpoint and task gets its own ASHA, so scores of different tasks never compete. Without it the full grid runs.
At most `resources.max_concurrent` trials run at once (`finetune.max_concurrent` when set). Beside pretraining the
sweep runs a fan-out per batch of ready checkpoints, at once, on shared trial slots (`Fanout.slots`:
raybiphase.finetune.scheduling.TrialSlots) whose bound drops while segments hold the cluster; each fan-out's trials
start in the order of their fan-outs, and a later one fills the slots an earlier one's tail leaves idle.

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

Resuming: every trial leaves a record `<storage>/<name>/records/<key>.json` (raybiphase.finetune.records;
finished trials write theirs before their last report, the driver writes the stopped ones), named by its key and
a digest of the settings that shape a trial (batch size, steps, warmup, eval cadence, example cap, max length). A
rerun skips the keys in `done` (rows the caller already holds) and the keys with a record (returned as rows again,
not recomputed): only the missing trials launch; with ASHA off, trials ASHA stopped before run again.
(`Tuner.restore` resumes one interrupted Tuner, but not a grid that grew, nor one whose trials ASHA stopped.)

Rows: raybiphase.results.rows (trial_row when planned, finished_row, stopped_row, completed_row).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import threading
import time
import uuid
from collections import defaultdict

from ray.tune.schedulers import ASHAScheduler

from raybiphase import storage
from raybiphase.config import FinetuneConfig, FinetuneGrid, SweepSpec
from raybiphase.finetune.records import (SETTINGS_COLUMN, TrialKey, read_record, record_path, trial_settings,
                                        write_record)
from raybiphase.finetune.scheduling import CappedGrid, Claim, GroupedASHA, TrialSlots
from raybiphase.finetune.tasks import get_task, training_groups
from raybiphase.finetune.trial import (
    TrialResult,
    find_hf_dir,
    load_checked_tokenizer,
    resolve_hf_dir,
    run_trial,
)
from raybiphase.raycluster import ensure_ray
from raybiphase.results import rows as result_rows
from raybiphase.results.aggregate import best_lr
from raybiphase.results.rows import FinetuneRow, FinetuneSource, trial_key
from raybiphase.results.wandb import log_finetune_group
from raybiphase.storage import absolute, is_uri, join  # by name: run_fanout has a `storage` argument
from raybiphase.telemetry.progress import trial_progress
from raybiphase.telemetry.wandb import sweep_settings

REDUCTION_FACTOR = 3
TRIAL_RETRIES = 2
"""Times a failed trial runs again from its start (a trial whose node was lost; a deterministic failure costs
three attempts before the fan-out reports it)."""
_REGISTRY_LOCK = threading.Lock()
"""Held while a trainable is registered with Tune: fan-outs run in threads at once (raybiphase.sweep.finetuning),
and Tune 2.60's registry is not thread-safe (two Tuners each registering their trainable failed with 'dictionary
changed size during iteration'), so a launch registers its trainable under this lock and hands Tune its name."""
_WANDB_LOCK = threading.Lock()
"""Held while a fan-out writes its W&B runs: one thread at a time starts and finishes them."""


@dataclasses.dataclass(frozen=True)
class Fanout:
    """What the fan-out uses of a sweep, and nothing else."""

    finetune: FinetuneConfig
    sweep: str = ""
    """The rows' `sweep` column."""
    max_concurrent: int = 1
    """Trials running at once."""
    wandb: dict | None = None
    """W&B settings (raybiphase.telemetry.wandb.sweep_settings), or None."""
    slots: TrialSlots | None = None
    """The trial slots this fan-out shares with others running at once, their bound asked before each trial
    starts; None: its own, `max_concurrent`. The sweep's driver gives fine-tuning the slots its segments leave free
    (raybiphase.sweep.finetuning)."""
    priority: int = 0
    """On shared slots, trials of a fan-out of lower priority start first (the sweep: its batches in order)."""

    @classmethod
    def of(cls, spec: SweepSpec) -> Fanout:
        return cls(spec.finetune, spec.sweep.name, spec.finetune.max_concurrent or spec.resources.max_concurrent,
                   sweep_settings(spec))


# ------------------------------------------------------------------------------------------------ planning


def grid_of(source: FinetuneSource, cfg: FinetuneConfig) -> FinetuneGrid:
    """What a checkpoint is fine-tuned on: its own grid (an intermediate checkpoint's, from finetune.exports), else
    the full grid."""
    return source.grid or cfg.grid()


def checkpoint_tasks(sources: list[FinetuneSource], cfg: FinetuneConfig) -> dict[tuple[str, int], tuple[str, ...]]:
    """The tasks each checkpoint is fine-tuned on, by (run, pretrain_step): its training groups are its own."""
    return {(source.run, source.pretrain_step): grid_of(source, cfg).tasks for source in sources}


def plan_rows(sources: list[FinetuneSource], cfg: FinetuneConfig, sweep: str = "") -> list[FinetuneRow]:
    """Every planned row, one per (checkpoint, task, LR, seed) of the checkpoint's grid (`grid_of`), group by
    group (checkpoint x task), seed-major so each ASHA rung sees every LR early."""
    return [result_rows.trial_row(source, task=get_task(name), lr=lr, seed=seed, sweep=sweep)
            for source in sources for grid in [grid_of(source, cfg)]
            for name in grid.tasks for seed in grid.seeds for lr in grid.lrs]


def plan_trials(sources: list[FinetuneSource], cfg: FinetuneConfig, sweep: str = "") -> list[FinetuneRow]:
    """The trials that train, in `plan_rows`' order: one per training group of the checkpoint's tasks (checkpoint
    x trained task x LR x seed); the other tasks of a group ride along (`riders`)."""
    tasks = checkpoint_tasks(sources, cfg)
    return [row for row in plan_rows(sources, cfg, sweep)
            if row.task in training_groups(tasks[(row.run, row.pretrain_step)])]


def riders(trial: FinetuneRow, tasks) -> list[FinetuneRow]:
    """The planned rows of the tasks tested on the model `trial` trains (the rest of its training group among
    `tasks`, those its checkpoint is fine-tuned on)."""
    return [result_rows.task_row(trial, get_task(name)) for name in training_groups(tasks)[trial.task][1:]]


def trained_in(row: FinetuneRow, tasks) -> FinetuneRow:
    """The planned trial that trains the model a planned row is tested on (`tasks`: those its checkpoint is
    fine-tuned on): the row itself unless it rides along."""
    trained = next(name for name, members in training_groups(tasks).items() if row.task in members)
    return row if trained == row.task else result_rows.task_row(row, get_task(trained))


def _trials_for(rows: list[FinetuneRow], tasks: dict[tuple[str, int], tuple[str, ...]]) -> list[FinetuneRow]:
    """The trials to launch for these planned rows, each once, in the rows' order (`tasks`: checkpoint_tasks)."""
    trials = (trained_in(row, tasks[(row.run, row.pretrain_step)]) for row in rows)
    return list({trial.key: trial for trial in trials}.values())


def group_of(row: FinetuneRow) -> tuple:
    """The trials one ASHA compares, and one best LR is picked among: one checkpoint, one task."""
    return (row.run, row.pretrain_step, row.task)


# ------------------------------------------------------------------------------------------------ the trial


@dataclasses.dataclass(frozen=True)
class TrialInput:
    """One Tune trial's whole input: its planned row and record path, the ASHA group it is compared in, and its
    riders (the tasks tested on the model it trains), each with its row and record path. Tune's config carries it
    as plain data (`to_config`), which its loggers can write."""

    row: FinetuneRow
    record: str
    group: tuple
    riders: tuple[TrialInput, ...] = ()

    @classmethod
    def of(cls, trial: FinetuneRow, tasks, experiment: str, settings: str) -> TrialInput:
        return cls(trial, record_path(experiment, trial.key, settings), group_of(trial),
                   tuple(cls(r, record_path(experiment, r.key, settings), group_of(r)) for r in riders(trial, tasks)))

    def to_config(self) -> dict:
        return {"row": _planned(self.row), "record": self.record, "group": list(self.group),
                "riders": [{"row": _planned(r.row), "record": r.record} for r in self.riders]}

    @classmethod
    def from_config(cls, config: dict) -> TrialInput:
        row = FinetuneRow.from_record(config["row"])
        return cls(row, config["record"], tuple(config.get("group") or group_of(row)),
                   tuple(cls.from_config(r) for r in config.get("riders", ())))

    @property
    def also_test(self) -> tuple[str, ...]:
        return tuple(r.row.task for r in self.riders)


def record_final(trial: TrialInput, final: TrialResult) -> None:
    """A finished trial's records (run_trial's result `final`): its riders' first, its own last (a trial whose
    own record is on disk has every row on disk)."""
    for rider in trial.riders:
        write_record(rider.record, result_rows.finished_row(rider.row, final["also_tested"][rider.row.task]))
    write_record(trial.record, result_rows.finished_row(trial.row, final))


def rider_metric(task: str) -> str:
    """The Tune metric holding a rider's validation score ("val_score" is the trained task's, which ASHA reads)."""
    return f"val_score:{task}"


def trial_rows(trial: TrialInput, metrics: dict, *, failed: bool) -> list[FinetuneRow] | None:
    """The rows of a trial Tune ended (its own, then its riders'), from their records; a row with none was stopped
    by ASHA at the trial's last report (`metrics`): its stopped row is recorded here. None when the trial `failed`
    before recording a row."""
    rows = []
    for member in [trial, *trial.riders]:
        record = read_record(member.record)
        if record is None:
            if failed:
                return None
            metric = "val_score" if member is trial else rider_metric(member.row.task)
            record = result_rows.stopped_row(member.row, val_score=metrics.get(metric, float("nan")),
                                             step=int(metrics.get("step", 0)),
                                             seconds=float(metrics.get("time_total_s", 0.0)))
            write_record(member.record, record)
        rows.append(record)
    return rows


def _trainable(config: dict, finetune: FinetuneConfig) -> None:
    import torch
    from ray import tune

    trial = TrialInput.from_config(config["trial"])
    torch.set_num_threads(max(1, int(finetune.cpus_per_trial)))

    def report(metrics: dict) -> None:
        if "final" in metrics:  # the trial's results are on disk before the report a scheduler may stop it at
            record_final(trial, metrics["final"])
        score = metrics["val_score"]
        # a diverged trial reports its floor score (NaN only from rows of old), which ranks it low for ASHA
        tune.report({"step": metrics["step"], "val_score": -1.0 if math.isnan(score) else score,
                     **{rider_metric(name): value for name, value in metrics.get("also_val", {}).items()},
                     "finished": int("final" in metrics)})  # else a trial that ended was stopped (progress lines)

    row = trial.row
    run_trial(row.checkpoint, row.task, lr=row.lr, seed=row.seed, cfg=finetune, report=report,
              also_test=trial.also_test)


def trial_resources(cfg: FinetuneConfig) -> dict[str, float]:
    """What one fine-tuning trial asks Ray for."""
    return {"cpu": cfg.cpus_per_trial, **({"gpu": cfg.gpus_per_trial} if cfg.gpus_per_trial else {})}


def _planned(row: FinetuneRow) -> dict:
    """What Tune's config carries of a planned trial: no scores yet (NaN would reach Tune's loggers)."""
    return {k: v for k, v in row.record().items() if not (isinstance(v, float) and math.isnan(v))}


def _launch(trials: list[FinetuneRow], cfg: Fanout, *, experiment: str, name: str, asha: bool,
            grace_period: int | None, reduction_factor: float, verbose: int, out, tasks: dict,
            label: str = "fine-tuning") -> list[FinetuneRow]:
    """Run `trials` (base rows) on Ray Tune; returns their rows and their riders' (among the tasks of their
    checkpoint: `tasks`, checkpoint_tasks), stopped ones recorded by the driver. Its trials hold a claim on
    `cfg.slots` (shared with the fan-outs running beside it) or on slots of its own. One Tuner, or several in turn
    when the claim holds every trial back for a while: a Tuner ends then (CappedGrid), and the next one starts with
    the trials not yet run once the claim may start one again."""

    from ray import tune
    from ray.tune import register_trainable

    ensure_ray()
    trainable = f"raybiphase-finetune-{uuid.uuid4().hex[:12]}"  # registered by name: Tuners then register nothing
    with _REGISTRY_LOCK:  # before the claim: a claim waiting on this lock would hold later claims back
        register_trainable(trainable, tune.with_resources(tune.with_parameters(_trainable, finetune=cfg.finetune),
                                                          trial_resources(cfg.finetune)))
    slots = cfg.slots or TrialSlots(lambda: cfg.max_concurrent)
    claim = slots.claim(len(trials), cfg.priority)
    try:
        return _tune(trials, cfg, claim, trainable, experiment=experiment, name=name, asha=asha,
                     grace_period=grace_period, reduction_factor=reduction_factor, verbose=verbose, out=out,
                     tasks=tasks, label=label)
    finally:
        slots.release(claim)


def _tune(trials: list[FinetuneRow], cfg: Fanout, claim: Claim, trainable: str, *, experiment: str, name: str,
          asha: bool, grace_period: int | None, reduction_factor: float, verbose: int, out, tasks: dict,
          label: str) -> list[FinetuneRow]:
    from ray import tune

    ft = cfg.finetune
    settings = trial_settings(ft)
    scheduler = None
    if asha:  # one for all the Tuners: its rungs keep the results of trials a previous Tuner ran
        scheduler = GroupedASHA(functools.partial(
            ASHAScheduler, time_attr="step", metric="val_score", mode="max", max_t=ft.max_steps,
            grace_period=grace_period or ft.eval_every, reduction_factor=reduction_factor))
    progress = trial_progress(len(trials), out=out, label=label)
    tune_name = name if claim.number == 0 else f"{name}-{claim.number}"  # fan-outs at once: a folder each
    remaining, results = list(trials), []
    while remaining:
        while not claim.may_start():  # every slot is taken: no Tuner waits for one (CappedGrid)
            time.sleep(1)
        space = [TrialInput.of(t, tasks[(t.run, t.pretrain_step)], experiment, settings).to_config()
                 for t in remaining]
        tuner = tune.Tuner(
            trainable,
            param_space={"trial": tune.grid_search(space)},
            tune_config=tune.TuneConfig(scheduler=scheduler, search_alg=CappedGrid(claim, cfg.max_concurrent),
                                        reuse_actors=True,
                                        trial_dirname_creator=lambda t: f"trial_{t.trial_id}"),
            # a trial lost with its node (a preempted VM) runs again from its start, elsewhere: same seed, same record
            run_config=tune.RunConfig(storage_path=storage.parent(experiment), name=tune_name, verbose=verbose,
                                      failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES),
                                      callbacks=[progress]),
        )
        ran = list(tuner.fit())
        results += ran
        started = {TrialInput.from_config(result.config["trial"]).row.key for result in ran}
        remaining = [t for t in remaining if t.key not in started]
    rows, failures = [], []
    for result in results:
        trial = TrialInput.from_config(result.config["trial"])
        ended = trial_rows(trial, result.metrics or {}, failed=result.error is not None)
        if ended is None:
            first_line = (str(result.error).strip().splitlines() or [""])[0]
            failures.append(f"{trial.row.key}: {type(result.error).__name__}: {first_line}")
            continue
        rows += ended
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(trials)} fine-tuning trials failed; first: {failures[0]}")
    return rows


# ------------------------------------------------------------------------------------------------ the fan-out


def run_fanout(sources: list[FinetuneSource], cfg: Fanout, *, storage: str, name: str, done=frozenset(),
               grace_period: int | None = None, reduction_factor: float = REDUCTION_FACTOR,
               complete_best: bool = True, verbose: int = 0, out=None, label: str = "fine-tuning") -> list[dict]:
    """Fine-tune every source checkpoint on its grid (`grid_of`: an intermediate checkpoint's own, else
    cfg.finetune.tasks over lrs x seeds); one row per task, LR and seed of it not in `done` (keys rows.TRIAL_KEY),
    as records (FinetuneRow.record), and a copy of it for every run in the source's `shared_by` (the same weights:
    fine-tuned once). A training group's tasks share one trial (module docstring).
    Bad task names or checkpoints raise UserError before anything runs. `label` starts its progress lines.
    Fan-outs may run at once in threads of one driver, on shared `cfg.slots`, each with its own records' `name`
    or with disjoint checkpoints."""
    experiment = join(absolute(storage), name)  # a local folder or a bucket, like every sweep location
    tasks = checkpoint_tasks(sources, cfg.finetune)
    for task_name in [*cfg.finetune.tasks, *(task for names in tasks.values() for task in names)]:
        get_task(task_name)  # one clear line for bad input, before Ray starts
    # absolute: trials run in their own directories, on any node (a bucket's checkpoint is copied where it is used)
    sources = [dataclasses.replace(s, hf_dir=absolute(s.hf_dir)) for s in sources]
    for source in sources:  # one clear line for a bad checkpoint, before Ray starts
        if is_uri(source.hf_dir):  # weights stay in the bucket until a trial's node needs them
            find_hf_dir(source.hf_dir)
        else:
            load_checked_tokenizer(resolve_hf_dir(source.hf_dir))
    done = {trial_key(dict(zip(result_rows.TRIAL_KEY, k))) for k in done}
    copies = {(s.run, s.pretrain_step): s.shared_by for s in sources}

    def copy_keys(trial: FinetuneRow) -> list[TrialKey]:
        return [(other.run, *trial.key[1:]) for other in copies[(trial.run, trial.pretrain_step)]]

    # a row is planned when it, or the row of a run sharing its checkpoint, is missing; its trial runs when it has
    # no record (the trial that trains its group's model: the whole group's rows are recorded again)
    plan = [t for t in plan_rows(sources, cfg.finetune, cfg.sweep)
            if t.key not in done or any(k not in done for k in copy_keys(t))]
    settings = trial_settings(cfg.finetune)
    records = {t.key: read_record(record_path(experiment, t.key, settings)) for t in plan}
    for key, record in records.items():
        if record is not None and record.stopped_early and not cfg.finetune.asha:
            records[key] = None  # the full grid was asked for: a trial ASHA stopped runs again
    missing = _trials_for([t for t in plan if records[t.key] is None], tasks)
    options = dict(experiment=experiment, grace_period=grace_period, reduction_factor=reduction_factor,
                   verbose=verbose, out=out or sys.stdout)
    new = set()
    if missing:
        for row in _launch(missing, cfg, name=name, asha=cfg.finetune.asha, label=label, tasks=tasks, **options):
            new.add(row.key)
            if row.key in records:  # a trained task's row already in `done` is not planned
                records[row.key] = row
    if complete_best:
        new |= {row.key for row in _complete_best(records, plan, cfg, experiment,
                                                  {**options, "label": f"{label} (completion pass)"}, tasks)}
    rows = []
    for trial in plan:
        record = records[trial.key]
        if record is None:
            continue
        shared = [result_rows.shared_row(record, other) for other in copies[(trial.run, trial.pretrain_step)]]
        rows += [{**row.record(), SETTINGS_COLUMN: settings} for row in [record, *shared] if row.key not in done]
    with _WANDB_LOCK:
        _log_groups(rows, new, cfg.wandb)
    return rows


def _log_groups(rows: list[dict], new: set, settings: dict | None) -> None:
    """W&B: one run per (checkpoint, task) with a table of its trials, for the groups this invocation added to."""
    groups = defaultdict(list)
    for row in rows:
        groups[(row["run"], row["pretrain_step"], row["task"])].append(row)
    for group in groups.values():
        if settings and any(trial_key(r) in new for r in group):
            log_finetune_group(settings, group)


def _complete_best(records: dict, plan: list[FinetuneRow], cfg: Fanout, experiment: str, options: dict,
                   tasks: dict) -> list[FinetuneRow]:
    """Rerun, without ASHA, the stopped seeds of each group's best LR (aggregate.best_lr: the report's rule), until
    the best LR has none; with `finetune.complete_lrs`, every stopped trial at once. A rider's stopped row reruns
    the trial that trains its model (its group's rows all stopped with it). Returns the rerun rows."""
    done = []
    for attempt in range(len(cfg.finetune.lrs)):
        groups = defaultdict(list)
        for row in records.values():
            if row is not None:
                groups[group_of(row)].append(row)
        rerun = []
        for rows in groups.values():
            lr = None if cfg.finetune.complete_lrs else best_lr([r.record() for r in rows], complete_only=False)
            rerun += [r for r in rows if r.stopped_early and (cfg.finetune.complete_lrs or r.lr == lr)]
        if not rerun:
            return done
        planned = {t.key: t for t in plan}
        name = f"{storage.basename(experiment)}-completion{attempt}"
        trials = _trials_for([planned[r.key] for r in rerun], tasks)
        for row in _launch(trials, cfg, name=name, asha=False, tasks=tasks, **options):
            if row.key not in records:  # a trained task's row already in `done`
                continue
            row = result_rows.completed_row(records[row.key], row)
            write_record(record_path(experiment, row.key, trial_settings(cfg.finetune)), row)
            records[row.key] = row
            done.append(row)
    return done
