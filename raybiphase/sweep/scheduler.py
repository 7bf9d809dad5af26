"""The sweep's one scheduler: every segment and every fine-tuning trial, in one loop, on one slot budget.

The sweep is a graph of jobs of two kinds, each ending as an event on the loop's queue whose value carries its rows:
- A *segment* (raybiphase.sweep.segments.SegmentFit) starts once the segments it depends on are done (and, with
  sweep.stages by_size, its size's gate is open: raybiphase.sweep.size_gate): one Ray Train fit of its TorchTrainer,
  from the driver, in a thread of its own (a fit blocks), its checkpoints committed in the segment's own folder.
  Its value is what the fit returned (rank 0's reports, the checkpoints Ray Train registered).
- Each checkpoint a segment holds (and each untrained control and public encoder, at once) is then a
  *fine-tuning job* (raybiphase.finetune.fanout.CheckpointWaves): its trials, then its completion passes, each wave
  waiting for the last; its value is the rows its trials' last reports carried. A public encoder's job
  (finetune.baselines) keeps its records and rows where every sweep at this storage finds them (`Records`:
  raybiphase.sweep.hub_baselines), and trains beside pretraining like any other.

A job of either kind ends in `finished(job, value)`: its rows (`job.rows(value)`) appended to its table once
(pretrain.parquet, finetune.parquet), then, for a segment, what its own code does as it ends (pruning, W&B, the
progress line: `SegmentFit.ended`) and its checkpoints' fine-tuning jobs, started at once. The loop keeps which
segments are done; a segment's job never calls back into it.

One loop, in the driver's main thread, waits on whatever ends first: a segment (its thread posts to the loop's
event queue) or a fine-tuning trial (the Tuner's thread posts its last report, which carries a finished trial's
rows as a value: raybiphase.finetune.tuner), and starts what became ready. Nothing else decides what runs:
- Segments hold `resources.max_concurrent` slots; among the ready ones, the longest remaining chain starts first
  (raybiphase.planning.timeline.by_priority).
- Trials (at most finetune.max_concurrent, default resources.max_concurrent) run only in the share of the slots
  that segments leave free while pretraining goes on (`trial_capacity`, read each time Tune would start a trial);
  once no segment runs or waits, every trial slot is open. A ready segment waits at most for running trials.
- Trials of an earlier job start first (a job's number is its rank; a completion pass keeps its job's rank).

What a try is and when a job or the sweep gives up is `FailurePolicy` (raybiphase.failures), the one failure policy of
both kinds of job (raybiphase.sweep.failure_lines says its failures in one line).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable

from raybiphase.failures import FailurePolicy, FitStalled, Unstoppable
from raybiphase.finetune.fanout import ROWS, CheckpointWaves, Fanout, check_tasks
from raybiphase.finetune.spec import FinetuneSource, TrialSpec
from raybiphase.finetune.tuner import TuneTrials
from raybiphase.planning.timeline import by_priority
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from raybiphase.storage import absolute, join
from raybiphase.sweep.failure_lines import STOP_GRACE_S, said, segment_failure
from raybiphase.sweep.segments import SegmentFit
from raybiphase.sweep.size_gate import SizeStages
from raybiphase.telemetry.console import STDOUT, Console
from raybiphase.telemetry.progress import interval, trials_line


def trial_capacity(trials: int, slots: int, running_segments: int, pretraining: bool) -> int:
    """Trials that may run now: all `trials` once pretraining is over, else their share of the `slots` segment
    slots that no running segment holds (rounded up: a free slot always admits one)."""
    if not pretraining:
        return trials
    return math.ceil(trials * max(0, slots - running_segments) / slots)


@dataclasses.dataclass(frozen=True)
class Records:
    """Where a fine-tuning job keeps its trials' records and appends its rows when not in the sweep's own folder
    (a public encoder's cache, shared by the sweeps at one storage), and the trial keys already done there."""

    experiment: str
    table: str
    done: frozenset = frozenset()


@dataclasses.dataclass
class Job:
    """One checkpoint's fine-tuning: its work, and the wave of trials it waits on; its value, once it has no wave
    left, is its rows."""

    number: int
    name: str
    work: CheckpointWaves
    table: str | None = None
    """Where its rows go (finetune.parquet; None: kept, not written), keyed by `key`."""
    key: tuple[str, ...] = result_rows.FINETUNE_KEY
    waiting: set[int] = dataclasses.field(default_factory=set)
    """Tickets of the wave's trials not yet ended."""
    own: bool = True
    """A checkpoint of this sweep (False: a public encoder's, which no size gate waits for)."""
    size: int = 0
    wave_rows: list = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)

    def rows(self, value: list[dict]) -> list[dict]:
        return value


class Scheduler:
    """The loop (module docstring). `run(segments, sources, done)` runs it until nothing is left and returns the
    rows fine-tuning appended to `table` (None: kept, not written). `done_trials`: the trial keys with a row
    already (raybiphase.sweep.finetuning.trials_done); `gate`: whether a segment whose dependencies are done may start
    (sweep.stages by_size). `trials(capacity, ended)` makes the trial runner; by default long-lived Tuners
    (raybiphase.finetune.tuner.TuneTrials) under `experiment`."""

    def __init__(self, fanout: Fanout | None, *, slots: int, experiment: str = "", table: str | None = None,
                 console: Console = STDOUT, done_trials=frozenset(), trials=None,
                 policy: FailurePolicy = FailurePolicy(), gate: SizeStages | None = None):
        self.fanout, self.slots, self.experiment, self.table = fanout, slots, experiment, table
        self.policy, self.gate = policy, gate
        self.say = console.say
        self.done_trials = done_trials
        self.events: queue.Queue = queue.Queue()
        make = trials or (lambda capacity, ended: TuneTrials(
            fanout.finetune, experiment=experiment, max_concurrent=fanout.max_concurrent, capacity=capacity,
            ended=ended, grace_period=fanout.grace_period, reduction_factor=fanout.reduction_factor,
            retries=policy.trial_retries))
        self.trials = make(self.capacity, lambda *event: self.events.put(("trial", *event))) if fanout else None
        self.segments: dict[str, SegmentFit] = {}  # id -> each segment to train
        self.done: set[str] = set()  # ids of the segments done
        self.pending: list[SegmentFit] = []
        self.running: dict[str, float] = {}  # segment id -> when it started
        self.segment_errors: dict[str, BaseException] = {}
        self.tries: dict[str, int] = collections.Counter()  # segment id -> its fits so far (the running one's number)
        self.failed_in_a_row: dict[str, int] = collections.Counter()  # ... that failed in a row without progress
        self.stopping: dict[str, tuple[float, str]] = {}  # a stalled fit being stopped: when, and why
        self.checked = 0.0  # when stalls were last looked for
        self.jobs: dict[int, Job] = {}
        self.tickets: dict[int, tuple[Job, TrialSpec]] = {}
        self.numbers, self.ticket_numbers, self.batches = itertools.count(1), itertools.count(), 0
        self.error: BaseException | None = None  # the first fine-tuning failure
        self.rows: list[dict] = []
        self.most = 0
        self.count = {"done": 0, "total": 0, "stopped": 0, "printed": 0.0}
        self.ends: collections.deque[float] = collections.deque(maxlen=9)  # when the last trials ended: the pace
        self.began = self.finetuning_ended = time.perf_counter()
        self._capacity = 0  # trials allowed now: a snapshot only this loop writes (it alone changes its inputs)

    @property
    def pretraining(self) -> bool:
        return bool(self.running) or (bool(self.pending) and not self.segment_errors)

    def capacity(self) -> int:
        """Trials that may run now (read by the Tuner's thread before it starts one): the loop's last snapshot,
        one attribute read, never a half-changed `running` or `pending`."""
        return self._capacity

    def _snapshot(self) -> None:
        """The capacity Tune's thread reads, recomputed by the loop after each change to the segments."""
        if self.fanout:
            self._capacity = trial_capacity(self.fanout.max_concurrent, self.slots, len(self.running),
                                            self.pretraining)

    # ------------------------------------------------------------------------------------------------ the loop

    def run(self, segments: list[SegmentFit], sources: Callable[[], list[FinetuneSource]],
            done: set[str] = frozenset(), beside: Callable[[], list[tuple[FinetuneSource, Records]]] = list
            ) -> list[dict]:
        """Train `segments` (those in `done` count as done already) and fine-tune the checkpoints `sources()` gives
        at once (the controls, and the checkpoints of segments done before), then those `beside()` gives with
        where each keeps its records (the public encoders), and each segment's checkpoints as it ends. Returns
        the rows appended to the scheduler's own table."""
        self.segments = {job.id: job for job in segments}
        self.done = set(done)
        self.pending = list(segments)
        self._snapshot()
        self.settle()
        self.add_jobs(sources)
        self.add_jobs(beside)
        while True:
            self.start_segments()
            self.settle()
            if not self.running and not self.jobs:
                break  # segments still pending can never start: one failed
            if self.running:
                self.watch_stalls()
            try:
                kind, *event = self.events.get(timeout=0.5)  # short waits: Ctrl-C still reaches this thread
            except queue.Empty:
                continue
            if kind == "segment":
                self.segment_ended(*event)
            else:
                self.trial_ended(*event)
        if self.trials:
            self.trials.close()
            self.trials.join()
        if self.segment_errors:
            raise segment_failure(self.segment_errors, list(self.segments), self.say, self.tries, self.policy)
        if self.error is not None:
            raise self.error
        return self.rows

    def ready(self, job: SegmentFit) -> bool:
        """Every segment it waits on done, and (by_size) its size's gate open."""
        return job.after <= self.done and (self.gate is None or self.gate.ready(
            job.segment, self.done, finetuning_open=any(j.own for j in self.jobs.values()) or self.error is not None))

    def start_segments(self) -> None:
        """Ready segments, longest remaining chain first, into the slots no segment holds; none after a failure."""
        if self.segment_errors:
            return
        ready = [job for job in self.pending if self.ready(job)]
        for job in by_priority(ready, {j.id: j.chain for j in ready})[:max(0, self.slots - len(self.running))]:
            self.pending.remove(job)
            self.running[job.id] = time.time()
            self.most = max(self.most, len(self.running))
            self._snapshot()
            self.tries[job.id] += 1
            job.started(len(self.running))
            threading.Thread(target=self._fit, args=(job, self.tries[job.id]), daemon=True,
                             name=f"segment {job.id} try {self.tries[job.id]}").start()

    def _fit(self, job: SegmentFit, attempt: int) -> None:
        """Try number `attempt` of a segment (in its own thread); its end goes to the loop: the fit's value, or its
        error with whether the failed try committed a newer checkpoint."""
        before, value, error, progressed = None, None, None, False
        try:
            before = job.committed()
            value = job.fit(self.policy.restarts)
        except Exception as err:  # raised once every running segment has ended
            error = err
            try:
                progressed = before is not None and job.committed() > before
            except Exception:  # unreadable now: no progress seen
                pass
        finally:
            self.events.put(("segment", job.id, attempt, error, progressed, value))

    def watch_stalls(self) -> None:
        """Stop each running fit that showed no sign of life for the policy's stall_s (its fit then raises, a
        failed try); one that cannot be stopped, or whose fit does not end within a minute of being stopped,
        fails its segment at once. Looked at every tenth of stall_s (at most every minute)."""
        now = time.time()
        if now - self.checked < min(60.0, self.policy.stall_s / 10):  # each look reads the beats from storage
            return
        self.checked = now
        for sid, started in list(self.running.items()):
            job = self.segments[sid]
            if sid in self.stopping:
                when, why = self.stopping[sid]
                if now - when > STOP_GRACE_S:
                    self.give_up(sid, Unstoppable(f"{why}; its fit did not end once stopped"))
                continue
            try:
                sign = job.last_sign()
            except Exception:  # unreadable now: the try's start stands
                sign = 0.0
            quiet = now - max(started, sign)
            if quiet <= self.policy.stall_s:
                continue
            why = f"no sign of life for {quiet:.0f} s (sweep.stall_s: {self.policy.stall_s:g})"
            if job.stop():
                self.say(f"pretraining: {sid} showed {why}; stopping its fit")
                self.stopping[sid] = (now, why)
            else:
                self.give_up(sid, Unstoppable(f"{why}; it has no Ray Train controller to stop"))

    def give_up(self, sid: str, error: BaseException) -> None:
        """End the running try of `sid` now with `error` (never tried again: FailurePolicy.retry); the end its
        thread may post later finds it no longer running and is ignored."""
        self.segment_ended(sid, self.tries[sid], error)

    def segment_ended(self, sid: str, attempt: int, error: BaseException | None, progressed: bool = False,
                      value=None) -> None:
        """A segment's try ended: on success its `value` is recorded (`finished`) and its checkpoints' fine-tuning
        starts at once; on failure another try or the segment's failure (FailurePolicy), said in one line."""
        if sid not in self.running or attempt != self.tries[sid]:
            return  # a try given up on earlier
        started = self.running.pop(sid)
        job = self.segments[sid]
        stopped = self.stopping.pop(sid, None)
        if error is not None and stopped is not None and not isinstance(error, FitStalled):
            error = FitStalled(f"{stopped[1]}; stopped ({said(error)})")
        if error is not None:
            self.failed_in_a_row[sid] = 0 if progressed else self.failed_in_a_row[sid] + 1
            if not self.segment_errors and self.policy.retry(error, self.failed_in_a_row[sid]):
                left = self.policy.tries - self.failed_in_a_row[sid]
                step = self.checkpoint_step(job)
                self.say(f"pretraining: {sid} try {attempt} failed ({said(error)}); fitting it again from "
                         + (f"step {step}" if step >= 0 else "its start")
                         + f" ({left} failed tr{'y' if left == 1 else 'ies'} in a row left)")
                self.pending.insert(0, job)  # it takes the slot it left
                self._snapshot()
                return
            self.segment_errors[sid] = error
            self._snapshot()
            self.say(f"pretraining: {sid} failed on try {attempt} ({said(error)}); no segment starts after it, "
                     "the running ones and the fine-tuning of ready checkpoints go on")
            job.try_over()
            return
        self._snapshot()
        self.done.add(sid)
        self.finished(job, value, seconds=time.time() - started)

    @staticmethod
    def checkpoint_step(job: SegmentFit) -> int:
        """The step a failed segment is fitted again from: its newest committed checkpoint's (-1: its start)."""
        try:
            return job.committed()
        except Exception:
            return -1

    def settle(self) -> None:
        """Once no segment runs or can start before the trials end (none will, or every pending one waits on a
        size's gate, which waits on fine-tuning), trials may keep their processes between them
        (TuneTrials.settle); once one may start again, they stop doing so (TuneTrials.unsettle)."""
        if not self.trials:
            return
        if not self.pretraining or self.gated():
            self.trials.settle()
        else:
            self.trials.unsettle()

    def gated(self) -> bool:
        """No segment runs and every pending one waits on its size's gate, which opens once fine-tuning is done."""
        return self.gate is not None and not self.running and not any(self.ready(job) for job in self.pending)

    # ------------------------------------------------------------------------------------------------ fine-tuning

    def add_jobs(self, sources: Callable[[], list[FinetuneSource] | list[tuple[FinetuneSource, Records]]]) -> None:
        """A job per checkpoint `sources()` gives (alone: its records in the sweep's folder; or with its `Records`),
        each started at once, ranked after every job before it; none after a fine-tuning failure."""
        if not self.fanout or self.error is not None:
            return
        try:
            ready = sources()
        except Exception as err:
            self.failed(err)
            return
        if not ready:
            return
        self.batches += 1
        ready = [item if isinstance(item, tuple) else (item, None) for item in ready]
        names = ", ".join(f"{s.run}@{s.pretrain_step}" for s, _ in ready)
        self.say(f"fine-tuning: batch {self.batches}, {len(ready)} checkpoint(s) ready: {names}"
                 + (f" ({len(self.running)} segment(s) still training)" if self.pretraining else ""))
        for source, records in ready:
            number = next(self.numbers)
            experiment, table, done = ((self.experiment, self.table, self.done_trials) if records is None else
                                       (records.experiment, records.table, records.done))
            try:
                waves = CheckpointWaves([source], self.fanout, experiment=experiment, done=done)
            except Exception as err:  # a bad checkpoint or task: said once the running work has ended
                self.failed(err)
                continue
            job = Job(number, f"{source.run}@{source.pretrain_step}", waves, table=table, own=records is None)
            self.jobs[number] = job
            self.advance(job)

    def advance(self, job: Job, rows: list | None = None) -> None:
        """Give the job the rows its last wave ended with and submit its next wave's trials; or append its rows
        once it has none left."""
        try:
            wave = job.work.next_wave(rows)
            ended = job.work.rows() if wave is None else None
        except Exception as err:
            del self.jobs[job.number]
            self.failed(err)
            return
        if wave is None:
            del self.jobs[job.number]
            self.finished(job, ended)
            return
        job.size, job.wave_rows, job.failures = len(wave), [], []
        for spec in wave:
            ticket = next(self.ticket_numbers)
            self.tickets[ticket] = (job, spec)
            job.waiting.add(ticket)
            self.trials.submit(ticket, (job.number,), spec)
        self.count["total"] += len(wave)

    def trial_ended(self, ticket: int | None, metrics: dict, error: BaseException | None) -> None:
        """A trial's rows (its job's `ended`: taken from its last report, `metrics`), its line of progress, and its
        job's next step once its wave has ended."""
        if ticket is None:  # the Tuner itself failed: every trial waiting is lost
            for job in list(self.jobs.values()):
                del self.jobs[job.number]
                self.failed(error)
            return
        job, spec = self.tickets.pop(ticket)
        job.waiting.discard(ticket)
        rows = job.work.ended(spec, metrics, failed=error is not None)
        if rows is None:
            first = (str(error).strip().splitlines() or [""])[0]
            job.failures.append(f"{spec.key}: {type(error).__name__}: {first}")
        else:
            job.wave_rows += rows
        self.progress(stopped=error is None and ROWS not in metrics)
        if job.waiting or job.number not in self.jobs:
            return
        if self.policy.job_fails(len(job.failures)):
            del self.jobs[job.number]
            self.failed(RuntimeError(f"{len(job.failures)} of {job.size} fine-tuning trials failed; first: "
                                     f"{job.failures[0]}"))
            return
        self.advance(job, job.wave_rows)

    def progress(self, *, stopped: bool) -> None:
        """A line at most every RAYBIPHASE_PROGRESS_S seconds, and once every trial submitted so far has ended."""
        count, now = self.count, time.perf_counter()
        count["done"] += 1
        count["stopped"] += stopped
        self.ends.append(now)
        pace = (self.ends[-1] - self.ends[0]) / (len(self.ends) - 1) if len(self.ends) > 1 else None
        every = interval()
        if every > 0 and (now - count["printed"] >= every or count["done"] == count["total"]):
            count["printed"] = now
            running = min(len(self.tickets), self.capacity())
            self.say(trials_line(count["done"], count["total"], count["stopped"], running, pace))

    def finished(self, job: Job | SegmentFit, value, seconds: float = 0.0) -> None:
        """A job of either kind ended with `value` (a fine-tuning job's: its rows; a segment's: its fit's value,
        raybiphase.sweep.segments.FitValue): its rows (`job.rows(value)`) appended to its table, once; then a
        fine-tuning job's line, or what a segment's end does (`SegmentFit.ended`: pruning, W&B, the progress line)
        and its checkpoints' fine-tuning, started at once."""
        rows = job.rows(value)
        if job.table and rows:
            store.append_rows(job.table, rows, key=job.key)
        if isinstance(job, Job):
            if job.own:
                self.rows += rows
            self.finetuning_ended = time.perf_counter()
            self.say(f"fine-tuning: {len(rows)} trial row(s) recorded for {job.name}")
            return
        now = time.time()
        job.ended(seconds, {s: now - t for s, t in self.running.items()}, self.done)
        if self.fanout:
            self.add_jobs(job.sources)

    def failed(self, err: BaseException) -> None:
        """Say a failure at once; the first is raised when the loop ends."""
        self.error = self.error or err
        self.finetuning_ended = time.perf_counter()
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        self.say(f"fine-tuning: failed ({type(err).__name__}: {first})"
                 + ("; pretraining goes on, the error is raised when it ends" if self.pretraining else ""))


def finetune_checkpoints(sources: list[FinetuneSource], fanout: Fanout, *, storage: str, name: str,
                         done=frozenset(), console: Console = STDOUT, trials=None) -> list[dict]:
    """Fine-tune `sources` with no pretraining beside them (`raybiphase finetune`, the benchmarks): the same loop,
    every trial slot open. Records go under <storage>/<name>; returns the rows (the caller writes them). Bad task
    names or checkpoints raise UserError before anything runs."""
    check_tasks(fanout.finetune)
    scheduler = Scheduler(fanout, slots=fanout.max_concurrent, experiment=join(absolute(storage), name), console=console,
                          done_trials=set(done), trials=trials)
    return scheduler.run([], lambda: sources)
