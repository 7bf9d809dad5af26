"""Fine-tuning trials on long-lived Ray Tune Tuners, fed trial by trial through Tune's public extension points.

`TuneTrials` runs a `tune.Tuner` in a background thread for as long as its caller has trials to give it
(raybiphase.sweep.scheduler: the sweep's one loop): one while segments may need a slot, then one that reuses its
trials' processes (below).
Trials reach it through `FeedSearcher`, a `ray.tune.search.Searcher`: `submit` queues a trial with its rank, and
Tune's `suggest` hands out the lowest-ranked one while fewer trials are live than `capacity()` allows (read at that
moment, so a trial never starts on a slot a segment took); `close` says no more will come, and a Tuner ends once
its live trials have. Each ended trial is passed to `ended(ticket, metrics, error)` from the Tuner's thread (a
Tune `Callback`); `metrics` is its last report, which for a finished trial holds its rows (fanout.ROWS).

What keeps this working on Tune's public surface:
- `num_samples=-1`: the searcher, not a sample count, says when the search is over.
- A zero-CPU keep-alive trial runs until the searcher is closed: with no trial live, Tune waits for the next one
  without handling events, so ended trials' actors would keep their CPUs (or GPU share) from the segments.
  It reports a placeholder `val_score` (Tune checks the scheduler's metric in every result) and ASHA passes it.
- While segments may still need a slot, `reuse_actors=False`: an ended trial's actor is stopped, freeing what it
  held (Tune keeps one idle actor for reuse, and no public switch frees it: a segment placed on its CPU would wait
  for good). Once no segment will run again, or none can start before the trials end (a size's gate waits on
  them: `settle`), the queued trials move to another Tuner that reuses its trials' processes: a trial then skips
  the new process's imports, task tokenization and model code loading (several seconds each, against a few
  seconds of training per quickstart trial). When a segment may need a slot again (`unsettle`), that Tuner takes
  no more trials and ends once its live ones have, freeing the process Tune keeps, and the next trials start on a
  Tuner that does not reuse. The Tuners share one ASHA per group and one count of live trials, so the overlap
  while one's last trials end stays in bounds.
- `max_concurrent_trials`: Tune starts one trial at a time from a custom searcher otherwise.
- The searcher and callback keep their lock and callables out of pickles (Tune pickles both with the experiment).
- Nothing Tune writes reaches the bucket, and nothing Tune reads back can have been written by another: each
  `TuneTrials` keeps Tune's experiment folders (whose state files Tune pickles: tuner.pkl, experiment_state-*.json,
  search_gen_state-*.json, callback-states-*.pkl, a trial's params.pkl and error.pkl) in a private temporary folder
  on the driver's own disk, removed by `join`. No Tuner is ever restored: a rerun starts new Tuners and learns
  which trials are done from their records (raybiphase.finetune.records). The searcher's own state is JSON.
- A failed trial runs again from its start up to `retries` times (a node lost; FailurePolicy.trial_retries, the one
  failure policy's: raybiphase.failures); only then is it ended.
- A finished trial's last report holds its rows, per-example test scores included, which Tune's default loggers
  (a JSON, CSV and TensorBoard file per trial) would copy: they are off (`TUNE_DISABLE_AUTO_CALLBACK_LOGGERS`, read
  when a Tuner starts), and one JSON logger of ours (`ScoresLog`) writes each trial's `result.json` without the
  rows (Tune reads it back when a Tuner ends; the rows' own home is the results table).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable

from ray.tune import Callback, Stopper
from ray.tune.logger import JsonLoggerCallback
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import Searcher

from raybiphase import locks, storage
from raybiphase.config import FinetuneConfig
from raybiphase.errors import UserError
from raybiphase.failures import FailurePolicy
from raybiphase.finetune.fanout import ROWS, journaled, record_final, rider_metric
from raybiphase.finetune.spec import TrialSpec
from raybiphase.finetune.trial import run_trial
from raybiphase.raycluster import ensure_ray

NO_TUNE_LOGGERS = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"
"""Tune's switch for its default per-trial loggers (ray.tune.utils.callback), "1" for our Tuners."""
KEEPALIVE = "keepalive"
"""The keep-alive trial's config key (and its reports')."""
SEARCHER_FORMAT = "raybiphase-feed-searcher/1"
"""What `FeedSearcher.save` writes (JSON), the only state its `restore` reads."""


def _trainable(config: dict, finetune: FinetuneConfig) -> None:
    """One Tune trial: the keep-alive loop, or `run_trial` on the spec Tune's config carries. A finished trial's
    last report carries its rows (fanout.record_final, which journals them first: ASHA may end the process at
    that report). Once the driver's lease is lost, the trial's writes to the sweep folder are refused
    (raybiphase.locks.fence)."""
    from ray import tune

    locks.fence_from_env()
    if config.get(KEEPALIVE):
        while True:
            time.sleep(1.0)
            tune.report({KEEPALIVE: 1, "step": 0, "val_score": -1.0})
    import torch

    spec = TrialSpec.from_config(config["spec"])

    def report(metrics: dict, rows: dict | None = None) -> None:
        if rows is None:  # the last report's value
            rows = record_final(spec, metrics["final"]) if "final" in metrics else {}
        score = metrics["val_score"]
        # a diverged trial reports its floor score (NaN only from rows of old), which ranks it low for ASHA
        tune.report({"step": metrics["step"], "val_score": -1.0 if math.isnan(score) else score,
                     **{rider_metric(name): value for name, value in metrics.get("also_val", {}).items()}, **rows})

    if (done := journaled(spec)) is not None:  # finished before its process ended: Tune's retry trains nothing
        report(*done)
        return
    torch.set_num_threads(max(1, int(finetune.cpus_per_trial)))
    run_trial(spec, cfg=finetune, report=report)


def trial_resources(cfg: FinetuneConfig) -> dict[str, float]:
    """What one fine-tuning trial asks Ray for."""
    return {"cpu": cfg.cpus_per_trial, **({"gpu": cfg.gpus_per_trial} if cfg.gpus_per_trial else {})}


class FeedSearcher(Searcher):
    """Trials come from `submit` (any thread), ranked; `suggest` (Tune's thread) hands out the keep-alive trial
    first, then the lowest-ranked queued trial while fewer than `capacity()` are live, else None (Tune asks again
    next step); FINISHED once closed with nothing queued. A trial is live from its hand-out to its completion,
    retries included. One lock guards the queue, the live set and the closed flag."""

    CKPT_FILE_TMPL = "searcher-state-{}.json"  # Tune's name for the file `save` writes: it is JSON, not a pickle

    def __init__(self, capacity: Callable[[], int] | None = None, live: Callable[[], int] | None = None):
        """`capacity()`: how many trials may be live now; `live()`: how many are live on other Tuners."""
        super().__init__()
        self._lock, self._capacity, self._live_total = threading.Lock(), capacity, live
        self._queue: list[tuple] = []  # (rank, n, config) heap
        self._numbers = itertools.count()
        self._live: dict[str, dict] = {}
        self._closed = self._kept_alive = False

    def submit(self, rank: tuple, config: dict) -> None:
        with self._lock:
            heapq.heappush(self._queue, (rank, next(self._numbers), config))

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def hand_back(self) -> list[tuple]:
        """Close, and give back every queued trial (its rank and config) for another Tuner to run."""
        with self._lock:
            self._closed, queued, self._queue = True, sorted(self._queue), []
        return [(rank, config) for rank, _, config in queued]

    def live(self) -> int:
        with self._lock:
            return len(self._live)

    def drained(self) -> bool:
        with self._lock:
            return self._closed and not self._queue

    def suggest(self, trial_id: str):
        capacity = self._capacity() if self._capacity else math.inf  # outside the lock: it takes none of ours
        elsewhere = self._live_total() if self._live_total else 0  # another Tuner's: takes only its own lock
        with self._lock:
            if not self._kept_alive:
                self._kept_alive = True
                return {KEEPALIVE: True}
            if not self._queue:
                return Searcher.FINISHED if self._closed else None
            if len(self._live) + elsewhere >= capacity:
                return None
            config = heapq.heappop(self._queue)[2]
            self._live[trial_id] = config
            return config

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        with self._lock:
            self._live.pop(trial_id, None)

    def save(self, checkpoint_path: str) -> None:
        """The queue, the live trials and the closed flag as JSON: plain data, which no reader runs."""
        with self._lock:
            state = {"format": SEARCHER_FORMAT, "queue": [[list(rank), n, config] for rank, n, config in self._queue],
                     "live": dict(self._live), "closed": self._closed}
        with open(checkpoint_path, "w") as f:
            json.dump(state, f)

    def restore(self, checkpoint_path: str) -> None:
        """The state `save` wrote; anything else (a pickle, another searcher's state, a damaged file) is a
        UserError naming the file, and nothing in it is run."""
        try:
            with open(checkpoint_path, "rb") as f:
                state = json.loads(f.read())
            if not (isinstance(state, dict) and state.get("format") == SEARCHER_FORMAT):
                raise ValueError(f"not {SEARCHER_FORMAT} state")
            queue = [(tuple(rank), int(n), dict(config)) for rank, n, config in state["queue"]]
            live, closed = {str(k): dict(v) for k, v in state["live"].items()}, bool(state["closed"])
        except (ValueError, TypeError, KeyError, AttributeError) as err:  # JSON's errors are ValueErrors
            reason = " ".join(str(err).split())[:120]
            raise UserError(f"{checkpoint_path}: not a fine-tuning searcher's state ({reason}); it is never "
                            "unpickled") from None
        with self._lock:
            self._queue, self._live, self._closed = queue, live, closed
            heapq.heapify(self._queue)

    def __getstate__(self):
        return {**self.__dict__, "_lock": None, "_capacity": None, "_live_total": None, "_numbers": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock, self._numbers = threading.Lock(), itertools.count(len(self._queue) + len(self._live))


class KeepAliveStopper(Stopper):
    """Stops the keep-alive trial once the searcher is closed with nothing queued; never stops the others."""

    def __init__(self, searcher: FeedSearcher):
        self.searcher = searcher

    def __call__(self, trial_id: str, result: dict) -> bool:
        return bool(result.get(KEEPALIVE)) and self.searcher.drained()

    def stop_all(self) -> bool:
        return False


class GroupedASHA(FIFOScheduler):
    """One ASHA per trial group (run x task): its rungs compare trials of one task on one checkpoint only. A trial
    with no group (the keep-alive trial, a completion-pass rerun, finetune.asha off) is never stopped. Shared by
    the Tuners of one `TuneTrials` (a group's trials may run on both): a lock serialises their threads' calls."""

    def __init__(self, make_asha):
        super().__init__()
        self._make_asha, self._by_group, self._metric = make_asha, {}, "val_score"
        self._lock = threading.RLock()

    def __getstate__(self):
        return {**self.__dict__, "_lock": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def _asha(self, trial) -> ASHAScheduler | None:
        group = trial.config.get("group")
        if not group:
            return None
        if tuple(group) not in self._by_group:
            self._by_group[tuple(group)] = self._make_asha()
        return self._by_group[tuple(group)]

    def set_search_properties(self, metric, mode, **spec) -> bool:
        return True

    def on_trial_add(self, controller, trial):
        with self._lock:
            if asha := self._asha(trial):
                asha.on_trial_add(controller, trial)

    def on_trial_result(self, controller, trial, result):
        with self._lock:
            asha = self._asha(trial)
            return asha.on_trial_result(controller, trial, result) if asha else FIFOScheduler.CONTINUE

    def on_trial_complete(self, controller, trial, result):
        with self._lock:
            if asha := self._asha(trial):
                asha.on_trial_complete(controller, trial, result)

    def on_trial_remove(self, controller, trial):
        with self._lock:
            if asha := self._asha(trial):
                asha.on_trial_remove(controller, trial)

    def on_trial_error(self, controller, trial):
        with self._lock:
            if asha := self._asha(trial):
                asha.on_trial_error(controller, trial)


class TrialEndedCallback(Callback):
    """Passes every trial Tune ended (finished, stopped, or failed for good) but the keep-alive one to `ended`, with
    its last report. A finished trial's rows (fanout.ROWS) are taken out of that report as it arrives, before Tune
    keeps it as the trial's last result: Tune's experiment state, saved again and again while trials run, holds
    no rows, so it does not grow with trials times test-set size; they are handed to `ended` with the rest."""

    def __init__(self, ended: Callable):
        self.ended = ended
        self.rows: dict[str, list] = {}  # trial id -> the rows of its last report, until Tune ends the trial

    def __getstate__(self):
        return {**self.__dict__, "ended": None, "rows": {}}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if ROWS in result:  # Tune lets a callback change the result in place, before it keeps it
            self.rows[trial.trial_id] = result.pop(ROWS)

    def _report(self, trial) -> dict:
        metrics = dict(trial.last_result or {})
        if (rows := self.rows.pop(trial.trial_id, None)) is not None:
            metrics[ROWS] = rows
        return metrics

    def on_trial_complete(self, iteration, trials, trial, **info):
        if self.ended and not trial.config.get(KEEPALIVE):
            self.ended(trial.config["ticket"], self._report(trial), None)

    def on_trial_error(self, iteration, trials, trial, **info):
        if self.ended and not trial.config.get(KEEPALIVE):
            error = trial.get_pickled_error() or trial.get_error() or RuntimeError("the trial failed")
            self.ended(trial.config["ticket"], self._report(trial), error)


class ScoresLog(JsonLoggerCallback):
    """Tune's JSON logger, each trial's reports without a finished trial's rows (fanout.ROWS)."""

    def log_trial_result(self, iteration: int, trial, result: dict):
        super().log_trial_result(iteration, trial, {k: v for k, v in result.items() if k != ROWS})


class TuneTrials:
    """The Tuners for every trial its caller submits (module docstring): the first starts with the first `submit`;
    `settle` moves what is queued to one that reuses processes; `close` ends them once their live trials end.
    `ended(ticket, metrics, error)` runs in a Tuner's thread; a Tuner that fails as a whole gives
    `ended(None, {}, error)`. `retries`: a failed trial's runs again from its start (FailurePolicy.trial_retries)."""

    def __init__(self, finetune: FinetuneConfig, *, experiment: str, max_concurrent: int,
                 capacity: Callable[[], int], ended: Callable, grace_period: int | None = None,
                 reduction_factor: float = 3, retries: int = FailurePolicy().trial_retries):
        self.finetune, self.experiment, self.ended, self.retries = finetune, experiment, ended, retries
        self.capacity, self.max_concurrent = capacity, max_concurrent
        self.asha = GroupedASHA(functools.partial(
            ASHAScheduler, time_attr="step", metric="val_score", mode="max", max_t=finetune.max_steps,
            grace_period=grace_period or finetune.eval_every, reduction_factor=reduction_factor))
        self.searchers: list[FeedSearcher] = []
        self.threads: list[threading.Thread] = []
        self.reuse = self.reusing = False  # whether trials should reuse processes; whether the last Tuner does
        self.tune_dir: str | None = None  # Tune's experiment folders: the driver's own disk (module docstring)

    def submit(self, ticket: int, rank: tuple, spec: TrialSpec) -> None:
        group = list(spec.group) if spec.asha else None
        self._queue(rank, {"ticket": ticket, "group": group, "spec": spec.to_config()})

    def settle(self) -> None:
        """No segment needs a slot until the trials end: trials from now on reuse their processes (module
        docstring)."""
        self._reusing(True)

    def unsettle(self) -> None:
        """A segment may need a slot again (a size's gate opened): the Tuner that reuses processes takes no more
        trials and ends once its live ones have, freeing the one process Tune keeps; trials from now on start
        their own."""
        self._reusing(False)

    def _reusing(self, reuse: bool) -> None:
        """Queued trials move to a Tuner that does (`reuse`) or does not reuse processes, unless the last one does
        already."""
        if self.reuse == reuse:
            return
        self.reuse = reuse
        if self.searchers:
            for rank, config in self.searchers[-1].hand_back():
                self._queue(rank, config)

    def close(self) -> None:
        for searcher in self.searchers:
            searcher.close()

    def join(self) -> None:
        """Wait for every Tuner to end, then remove Tune's folders (no rerun reads them)."""
        for thread in self.threads:
            while thread.is_alive():
                thread.join(timeout=0.5)  # short joins: Ctrl-C still reaches the main thread
        if self.tune_dir:
            shutil.rmtree(self.tune_dir, ignore_errors=True)

    def _queue(self, rank: tuple, config: dict) -> None:
        if not self.searchers or self.reuse != self.reusing:
            self._start()
        self.searchers[-1].submit(rank, config)

    def _live_elsewhere(self, number: int) -> int:
        """Trials live on the Tuners but Tuner `number` (the first one's last trials, after `settle`)."""
        return sum(other.live() for i, other in enumerate(self.searchers) if i != number)

    def _start(self) -> None:
        from ray import tune

        ensure_ray()
        os.environ[NO_TUNE_LOGGERS] = "1"  # module docstring; read by Tune in `fit`
        cfg, number = self.finetune, len(self.searchers)
        searcher = FeedSearcher(self.capacity, live=functools.partial(self._live_elsewhere, number))
        self.reusing = self.reuse
        resources = trial_resources(cfg)
        trainable = tune.with_resources(tune.with_parameters(_trainable, finetune=cfg),
                                        lambda config: {"cpu": 0, "memory": 1 << 20} if config.get(KEEPALIVE)
                                        else resources)
        name = storage.basename(self.experiment) + (f"-{number + 1}" if number else "")  # a folder per Tuner
        self.tune_dir = self.tune_dir or tempfile.mkdtemp(prefix="raybiphase-tune-")
        tuner = tune.Tuner(
            trainable, param_space={},
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=self.asha, num_samples=-1,
                                        reuse_actors=self.reuse, max_concurrent_trials=self.max_concurrent + 1,
                                        trial_dirname_creator=lambda t: f"trial_{t.trial_id}"),
            run_config=tune.RunConfig(storage_path=self.tune_dir, name=name, verbose=0,
                                      stop=KeepAliveStopper(searcher), callbacks=[TrialEndedCallback(self.ended), ScoresLog()],
                                      failure_config=tune.FailureConfig(max_failures=self.retries)))
        thread = threading.Thread(target=self._fit, args=(tuner,), name=f"fine-tuning trials {number + 1}",
                                  daemon=True)
        self.searchers.append(searcher)
        self.threads.append(thread)
        thread.start()

    def _fit(self, tuner) -> None:
        try:
            tuner.fit()
        except BaseException as err:  # every trial still live or queued is lost with it
            self.ended(None, {}, err)
