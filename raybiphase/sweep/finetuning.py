"""The sweep's fine-tuning, pipelined with its pretraining.

A checkpoint's trials do not wait for the last segment of the sweep: the untrained controls are exported and
fine-tuned at once, and each distinct checkpoint (plan.checkpoints) is queued as soon as the segment that holds it
has ended. A thread of the driver (`FinetuneStream`) starts what is queued as one batch: a fan-out in a thread of
its own (raybiphase.finetune.fanout.run_fanout: ASHA and the completion pass per checkpoint and task) that
appends its rows to finetune.parquet when it ends. Batches run at once on shared trial slots
(raybiphase.finetune.scheduling.TrialSlots), an earlier batch's trials first: checkpoints ready while a batch
runs do not wait for that batch's last trials or its completion pass, but they wait while its
trials still fill every slot, so they start together as one batch, once a slot would otherwise be idle. (A batch
per checkpoint at once would start a Tuner each, and trial processes that Tune reuses only within a Tuner: on the
2-core quickstart that cost more than the idle slots it filled.)

Segments come first, as the dry run's timeline assumes (raybiphase.sweep.timeline: fine-tuning fills the GPUs
segments leave idle): of `finetune.max_concurrent` trials (default `resources.max_concurrent`), only the share of
the `resources.max_concurrent` segment slots that no segment holds may run while pretraining goes on; the bound is
read each time Tune asks for a trial, so a trial never starts on a slot a segment holds, and a segment that becomes
ready waits at most for the trials already running. Once the last segment has ended, every trial slot is open.
A batch that fails is said at once; the batches running go on, none starts after it, and the error is raised when
pretraining ends.

Resuming: a trial with a row or a record is not rerun (the fan-out's own rule), whichever batch it was in.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time

from raybiphase import storage
from raybiphase.config import SweepSpec
from raybiphase.finetune.baselines import bm25_baseline, majority_baseline
from raybiphase.finetune.fanout import Fanout, plan_trials, run_fanout
from raybiphase.finetune.scheduling import TrialSlots
from raybiphase.finetune.tasks import get_task
from raybiphase.pretrain.export import export_initial
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from raybiphase.sweep.context import SweepContext


def finetune_sources(ctx: SweepContext, segments: set[str] | None = None) -> list[result_rows.FinetuneSource]:
    """One source per distinct checkpoint (plan.checkpoints: every run's final and train.export_steps ones), under
    the first run whose weights it holds, with its grid (plan.grids: finetune.exports' for an intermediate step);
    the other runs sharing it ride along in `shared_by` (their rows are copies: shared weights are fine-tuned
    once). With `segments`, only the checkpoints those segments hold."""
    out = []
    grids = ctx.plan.grids(ctx.spec)
    for (segment, step), names in ctx.plan.checkpoints().items():
        if segments is not None and segment not in segments:
            continue
        hf = storage.hf_dir(ctx.paths.checkpoint(segment, step))
        first, *others = (result_rows.FinetuneSource(name, step, hf,
                                                     result_rows.config_columns(ctx.plan.runs[name].config),
                                                     grid=grids[(segment, step)])
                          for name in names)
        out.append(dataclasses.replace(first, shared_by=tuple(others)))
    return out


def control_sources(ctx: SweepContext) -> list[result_rows.FinetuneSource]:
    """The untrained controls (plan.controls): each one's step-0 weights exported once, under
    <sweep>/controls/<name>/hf (an `exported.json` beside it marks a finished export), as a source at step 0."""
    out = []
    for control in ctx.plan.controls.values():
        folder = ctx.paths.control(control.name)
        hf = storage.join(folder, storage.HF_DIR)
        if not storage.exists(storage.join(folder, storage.EXPORTED)):
            storage.delete(hf)  # an export cut short, if any
            export_initial(control.config, ctx.data_dir(control.config), hf)
            storage.write_json(storage.join(folder, storage.EXPORTED), {"runs": control.runs})
        out.append(result_rows.FinetuneSource(control.name, 0, hf, result_rows.control_columns(control.config)))
    return out


def baseline_rows(spec: SweepSpec) -> list[dict]:
    """Baseline rows on the same test splits (each appended once: its key is fixed): BM25 for every retrieval task
    (run "bm25"), the majority class for every sequence-classification task (run "majority")."""
    rows, caps = [], {"max_examples": spec.finetune.max_examples, "max_eval_examples": spec.finetune.max_eval_examples}
    for name in spec.finetune.tasks:
        family = get_task(name).family
        if family == "IR":
            rows.append(result_rows.baseline_row(bm25_baseline(name, **caps), run="bm25", family=family,
                                                 sweep=spec.sweep.name).record())
        elif family == "SC":
            rows.append(result_rows.baseline_row(majority_baseline(name, **caps), run="majority",
                                                 family=family, sweep=spec.sweep.name).record())
    return rows


def trial_capacity(trials: int, slots: int, running_segments: int, pretraining: bool) -> int:
    """Trials that may run now: all `trials` once pretraining is over, else their share of the `slots` segment
    slots that no running segment holds (rounded up: a free slot always admits one)."""
    if not pretraining:
        return trials
    return math.ceil(trials * max(0, slots - running_segments) / slots)


class FinetuneStream:
    """Fine-tuning beside pretraining (module docstring). `segments_done(done)` queues the checkpoints of segments
    that ended, `segments_running(n)` says how many hold the cluster, `close()` says pretraining is over, and
    `join()` waits for every queued trial and returns the rows appended (a fine-tuning failure is raised there)."""

    def __init__(self, ctx: SweepContext):
        self.ctx = ctx
        self.fanout = dataclasses.replace(Fanout.of(ctx.spec), slots=TrialSlots(self.capacity))
        self.queued: set[str] = set()  # segments whose checkpoints were queued
        self.ready: list[result_rows.FinetuneSource] = []
        self.rows: list[dict] = []
        self.running, self.pretraining = 0, True
        self.error: BaseException | None = None
        self.changed = threading.Condition()  # guards ready, pretraining and error
        self.appending = threading.Lock()  # one batch at a time appends to finetune.parquet
        self.thread = threading.Thread(target=self._work, name="fine-tuning", daemon=True)
        self.batches: list[threading.Thread] = []
        self.started = self.seconds = 0.0

    def start(self) -> None:
        ctx, path = self.ctx, self.ctx.paths.table(storage.FINETUNE_FILE)
        done = {result_rows.trial_key(dict(zip(result_rows.TRIAL_KEY, key))) for key in _trials_done(path)}
        planned = {t.key for t in plan_trials(_planned_sources(ctx), ctx.spec.finetune)}
        ctx.say(f"fine-tuning: {len(planned & done)}/{len(planned)} trials already done; the rest run as their "
                f"checkpoints are ready ({'ASHA' if ctx.spec.finetune.asha else 'full grid'})")
        self.started = time.perf_counter()
        self.thread.start()

    def capacity(self) -> int:
        spec = self.ctx.spec
        return trial_capacity(self.fanout.max_concurrent, spec.resources.max_concurrent, self.running,
                              self.pretraining)

    def segments_running(self, count: int) -> None:
        self.running = count

    def segments_done(self, done: set[str]) -> None:
        sources = finetune_sources(self.ctx, set(done) - self.queued)
        with self.changed:
            self.queued |= set(done)
            if sources:
                self.ready += sources
                self.changed.notify()

    def close(self) -> None:
        with self.changed:
            self.pretraining = False
            self.changed.notify()

    def join(self, *, raise_error: bool = True) -> list[dict]:
        while self.thread.is_alive():
            self.thread.join(timeout=0.5)  # short joins: Ctrl-C still reaches the main thread
        if self.error is not None and raise_error:
            raise self.error
        return self.rows

    def _work(self) -> None:
        try:
            self._start(control_sources(self.ctx))  # the controls need no pretraining: first
            while (batch := self._next_batch()) is not None:
                self._start(batch)
        except BaseException as err:
            self._failed(err)
        finally:
            for thread in self.batches:
                thread.join()
            self.seconds = time.perf_counter() - self.started

    def _next_batch(self) -> list[result_rows.FinetuneSource] | None:
        """The checkpoints ready, once another batch would start a trial now; None once a batch failed, or
        pretraining is over with nothing ready."""
        with self.changed:
            while self.error is None and (self.ready or self.pretraining):
                if self.ready and self.fanout.slots.room_for_another(self.batches):
                    batch, self.ready = self.ready, []
                    return batch
                self.changed.wait(timeout=1)  # slots free up without a notice: looked at every second
            return None

    def _start(self, sources: list[result_rows.FinetuneSource]) -> None:
        """Run one batch in a thread of its own, beside the batches already running."""
        if sources:
            number = len(self.batches) + 1
            self.batches.append(threading.Thread(target=self._batch, args=(number, sources), daemon=True,
                                                 name=f"fine-tuning batch {number}"))
            self.batches[-1].start()

    def _batch(self, number: int, sources: list[result_rows.FinetuneSource]) -> None:
        ctx, path = self.ctx, self.ctx.paths.table(storage.FINETUNE_FILE)
        names = ", ".join(f"{s.run}@{s.pretrain_step}" for s in sources)
        ctx.say(f"fine-tuning: batch {number}, {len(sources)} checkpoint(s) ready: {names}"
                + (f" ({self.running} segment(s) still training)" if self.pretraining else ""))
        try:
            rows = run_fanout(sources, dataclasses.replace(self.fanout, priority=number), storage=ctx.paths.root,
                              name="finetune", done=_trials_done(path), out=ctx.out,
                              label=f"fine-tuning (batch {number})")
            with self.appending:
                if rows:
                    store.append_rows(path, rows, key=result_rows.FINETUNE_KEY)
                self.rows += rows
        except BaseException as err:
            self._failed(err)
            return
        ctx.say(f"fine-tuning: batch {number}, {len(rows)} trial row(s) recorded for {names}")

    def _failed(self, err: BaseException) -> None:
        """Say a failure at once; the first is raised by join() in the driver's thread once pretraining is over."""
        with self.changed:
            self.error = self.error or err
            self.changed.notify()
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        self.ctx.say(f"fine-tuning: failed ({type(err).__name__}: {first}); pretraining goes on, the error is "
                     "raised when it ends")


def _trials_done(table: str) -> set[tuple]:
    """The keys (rows.TRIAL_KEY) of our trials with a row in the finetune.parquet at `table`."""
    return {key[:-1] for key in store.done_keys(table, result_rows.FINETUNE_KEY) if key[-1] == result_rows.OURS}


def _planned_sources(ctx: SweepContext) -> list[result_rows.FinetuneSource]:
    """Every source the sweep fine-tunes, the controls included, without exporting anything (for counting)."""
    controls = [result_rows.FinetuneSource(c.name, 0, "", {}) for c in ctx.plan.controls.values()]
    return controls + finetune_sources(ctx)
