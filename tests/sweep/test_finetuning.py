"""Fine-tuning beside pretraining, without Ray: how many trials may run while segments hold the cluster, the
searcher that obeys that bound as it changes and ranks earlier checkpoints first, and the scheduler's one loop that
starts each checkpoint's trials once, as its segment ends. The trial runner is replaced by a recorder here;
tests/sweep/test_pipeline.py runs the real one beside a training segment."""

from __future__ import annotations

import io
import re
import threading

import pytest

from raybiphase.config import SweepSpec, from_dict
from raybiphase.outages import StorageOutage
from raybiphase.sweep.scheduler import trial_capacity


@pytest.mark.parametrize("trials, slots, running, pretraining, expected", [
    (2, 2, 2, True, 0),  # every slot holds a segment: no trial starts
    (2, 2, 1, True, 1),  # one slot free: its share of the trials
    (2, 2, 0, True, 2),  # pretraining waits on dependencies: every slot fine-tunes
    (8, 4, 3, True, 2),  # 4 trials per GPU-slot, one slot free
    (3, 4, 3, True, 1),  # a free slot always admits one (rounded up)
    (2, 2, 2, False, 2),  # pretraining over: all of them
])
def test_trials_take_only_the_slots_segments_leave_free(trials, slots, running, pretraining, expected):
    assert trial_capacity(trials, slots, running, pretraining) == expected


def test_the_searcher_starts_trials_only_while_the_capacity_allows_and_follows_it_as_it_changes():
    """Read each time Tune asks: a slot a segment took holds every queued trial back (None: Tune asks again next
    step); the keep-alive trial comes first whatever the bound; FINISHED only once closed with nothing queued.
    Tune pickles its searcher with the experiment: the lock and the capacity stay out."""
    from ray import cloudpickle
    from ray.tune.search import Searcher

    from raybiphase.finetune.tuner import KEEPALIVE, FeedSearcher

    bound = [0]
    searcher = FeedSearcher(lambda: bound[0])
    for value in (1, 2, 3):
        searcher.submit((1,), {"a": value})
    assert searcher.suggest("k") == {KEEPALIVE: True}
    assert searcher.suggest("t1") is None  # every slot holds a segment
    bound[0] = 2
    assert [searcher.suggest(t) for t in ("t1", "t2", "t3")] == [{"a": 1}, {"a": 2}, None]
    searcher.on_trial_complete("t1")
    bound[0] = 1
    assert searcher.suggest("t3") is None  # a segment took the freed slot
    searcher.on_trial_complete("t2", error=True)  # a trial that failed for good frees its slot, once
    searcher.on_trial_complete("t2", error=True)
    searcher.close()
    assert not searcher.drained() and searcher.suggest("t3") == {"a": 3}
    assert searcher.drained() and searcher.suggest("t4") == Searcher.FINISHED
    restored = cloudpickle.loads(cloudpickle.dumps(searcher))
    assert restored._capacity is None and restored._lock is not searcher._lock and restored.drained()


def test_an_earlier_checkpoints_trials_go_first_and_a_later_ones_fill_the_slots_its_tail_leaves_idle():
    """Trials rank by their job (the order checkpoints became ready): a completion pass of job 1, submitted after
    job 2's trials, still starts first; once job 1 has no trial waiting, job 2's take the free slots instead of
    waiting for job 1's last trials to end."""
    from raybiphase.finetune.tuner import FeedSearcher

    searcher = FeedSearcher(lambda: 2)
    searcher.suggest("keep-alive")
    searcher.submit((1,), {"job": 1, "n": 1})
    searcher.submit((2,), {"job": 2, "n": 1})
    searcher.submit((2,), {"job": 2, "n": 2})
    assert searcher.suggest("a") == {"job": 1, "n": 1}  # job 1's last trial: its tail
    assert searcher.suggest("b") == {"job": 2, "n": 1}  # the slot job 1 leaves idle
    searcher.on_trial_complete("a")
    searcher.submit((1,), {"job": 1, "completion": True})  # job 1's completion pass, ranked before job 2
    assert searcher.suggest("c") == {"job": 1, "completion": True}
    searcher.on_trial_complete("b")
    assert searcher.suggest("d") == {"job": 2, "n": 2}


def test_the_searchers_state_is_plain_json_that_reads_back_in_order(tmp_path):
    """What Tune keeps of the searcher between runs is data: a restored searcher hands out the same trials in the
    same order, and trials submitted after the restore rank among them."""
    import json

    from raybiphase.finetune.tuner import KEEPALIVE, FeedSearcher

    searcher = FeedSearcher(lambda: 1)
    searcher.suggest("keep-alive")
    for job, n in ((2, 1), (1, 1), (2, 2)):
        searcher.submit((job,), {"job": job, "n": n, "group": ["run", 8, "tweets"]})
    assert searcher.suggest("a") == {"job": 1, "n": 1, "group": ["run", 8, "tweets"]}
    searcher.save_to_dir(str(tmp_path))
    (state,) = tmp_path.glob("searcher-state-*.json")
    assert json.loads(state.read_text())["live"] == {"a": {"job": 1, "n": 1, "group": ["run", 8, "tweets"]}}
    restored = FeedSearcher(lambda: 2)
    restored.restore(str(state))
    restored.submit((1,), {"job": 1, "n": 2})
    assert restored.suggest("k") == {KEEPALIVE: True}  # the restored Tuner's own keep-alive trial comes first
    assert [restored.suggest(t) for t in ("b", "c")] == [{"job": 1, "n": 2}, None]  # "a" is still live
    restored.on_trial_complete("a")
    assert restored.suggest("d") == {"job": 2, "n": 1, "group": ["run", 8, "tweets"]}


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_crafted_searcher_state_is_refused_in_one_line_and_never_run(tmp_path, protocol):
    """Whoever can write a sweep's files must not get code run by the driver: a pickle that would run a command,
    put where the searcher's state goes, is a UserError naming the file, and the command never runs."""
    import pickle

    from raybiphase.errors import UserError
    from raybiphase.finetune.tuner import FeedSearcher

    marker, state = tmp_path / "ran", tmp_path / "searcher-state-crafted.json"
    state.write_bytes(pickle.dumps({"queue": [], "live": {}, "closed": _RunsCode(marker)}, protocol=protocol))
    with pytest.raises(UserError, match=f"^{state}: not a fine-tuning searcher's state .*never unpickled$") as err:
        FeedSearcher().restore(str(state))
    assert "\n" not in str(err.value) and not marker.exists()
    state.write_text('{"queue": [], "live": {}, "closed": false}')  # JSON, but not this searcher's
    with pytest.raises(UserError, match=f"^{state}: not a fine-tuning searcher's state"):
        FeedSearcher().restore(str(state))


class _Paths:
    def __init__(self, root):
        self.root = str(root)

    def table(self, name):
        return f"{self.root}/{name}"

    def checkpoint(self, segment, step):
        return f"{self.root}/runs/{segment}/step-{step:08d}"


def _two_runs(tmp_path):
    """A two-run sweep sharing its CLM prefix (2 segment slots, one fine-tuning task): its plan, a context whose
    lines go to the returned buffer."""
    from raybiphase.planning.plan import make_plan
    from raybiphase.sweep.context import SweepContext
    from raybiphase.telemetry.console import Console

    spec = from_dict(SweepSpec, {"sweep": {"name": "s", "storage": str(tmp_path), "grid": {"phases.clm_share": [0.5, 1.0]}},
                                 "model": {"size": "tiny"}, "phases": {"steps": 8},
                                 "optim": {"warmup_steps": 2, "decay_steps": 2},
                                 "resources": {"max_concurrent": 2},
                                 "finetune": {"tasks": ["tweets"], "lrs": [1e-3], "seeds": [0]}})
    plan, out = make_plan(spec), io.StringIO()
    return plan, SweepContext(spec, plan, _Paths(tmp_path / "s"), console=Console(out)), out


class _Segments:
    """The sweep's segments as the scheduler's jobs (`jobs`), each one 'training' until the test ends it; a fit's
    value is its one row."""

    def __init__(self, plan, ctx):
        self.plan, self.ctx = plan, ctx
        self.chain = {sid: -i for i, sid in enumerate(plan.segments)}  # plan order
        self.release = {sid: threading.Event() for sid in plan.segments}
        self.lines, self.fail, self.steps = [], {}, {}  # fail: segment -> tries that fail; steps: committed
        self.hang, self.stops, self.stoppable = set(), [], True  # hang: segments whose next fit blocks until stopped
        self.stopped = {sid: threading.Event() for sid in plan.segments}
        self.jobs = [_Fit(self, segment) for segment in plan.segments.values()]

    def fit(self, segment, restarts):
        assert self.release[segment.id].wait(30) and restarts == 2
        if segment.id in self.hang:  # no sign of life until stopped (a stop that fails leaves it blocked)
            self.hang.discard(segment.id)
            assert self.stopped[segment.id].wait(60)
            self.stopped[segment.id].clear()
            raise RuntimeError("The actor died unexpectedly before finishing this task.")
        tries = self.fail.get(segment.id, [])
        if not tries:
            return [{"run": run, "step": segment.end} for run in segment.runs]
        how = tries.pop(0)  # "none": nothing committed; "progress": a checkpoint; "outage": one, then an outage
        if how != "none":
            self.steps[segment.id] = self.steps.get(segment.id, -1) + 1
        if how == "outage":
            raise StorageOutage("storage: s3://b unreachable for 15 min")
        raise RuntimeError("worker died\nValueError: loss is nan")

    def stop(self, segment):
        self.stops.append(segment.id)
        if self.stoppable:
            self.stopped[segment.id].set()
        return self.stoppable


class _Fit:
    """One segment as a job of the scheduler (raybiphase.sweep.segments.SegmentFit's interface)."""

    def __init__(self, segments, segment):
        from raybiphase.planning.plan import dependencies

        self.segments, self.segment, self.id = segments, segment, segment.id
        self.after = frozenset(dependencies(segment, segments.plan.runs))
        self.chain = segments.chain[segment.id]
        self.table, self.key = None, ("run", "step")

    def fit(self, restarts):
        return self.segments.fit(self.segment, restarts)

    def committed(self):
        return self.segments.steps.get(self.id, -1)

    def last_sign(self):
        return 0.0

    def stop(self):
        return self.segments.stop(self.segment)

    def started(self, running):
        self.segments.lines.append(("started", self.id, running))

    def rows(self, value):
        return value

    def ended(self, seconds, running, done):
        assert self.id in done
        self.segments.lines.append(("ended", self.id, True))

    def sources(self):
        from raybiphase.sweep.finetuning import finetune_sources

        return finetune_sources(self.segments.ctx, {self.id})

    def try_over(self):
        if self.id not in [line[1] for line in self.segments.lines if line[0] == "ended"]:
            self.segments.lines.append(("ended", self.id, False))


def _scheduler(ctx, out, launched, monkeypatch, fail=(), policy=None):
    """A scheduler whose checkpoint work is one trial per source (a stand-in fan-out) on the recorder; trials of
    a run in `fail` fail."""
    from raybiphase.failures import FailurePolicy
    from raybiphase.finetune.fanout import ROWS, Fanout
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.tasks import get_task
    from raybiphase.sweep import scheduler
    from raybiphase.telemetry.console import Console
    from tests.finetune.recording import recording

    class OneTrial:  # CheckpointWaves' interface: one wave of one trial, then its rows
        def __init__(self, sources, cfg, *, experiment, done):
            self.source, self.done = sources[0], None

        def next_wave(self, rows=None):
            if rows is None:
                return [TrialSpec(self.source.run, self.source.pretrain_step, "", get_task("tweets"), 1e-3, 0, "")]
            self.done = rows
            return None

        def ended(self, spec, metrics, *, failed):
            return None if failed else [spec]

        def rows(self):
            return [{"run": r.run} for r in self.done]

    def outcome(spec):
        if spec.run in fail:
            raise RuntimeError("bad checkpoint")
        return {"step": 4, ROWS: []}

    monkeypatch.setattr(scheduler, "CheckpointWaves", OneTrial)
    return scheduler.Scheduler(Fanout.of(ctx.spec), slots=2, console=Console(out),
                               trials=recording(launched, outcome), policy=policy or FailurePolicy())


def test_the_controls_start_at_once_and_each_checkpoint_once_its_segment_ends(tmp_path, monkeypatch):
    """The controls' trials start before any segment ends; each checkpoint's, as soon as its segment has ended,
    beside the segments still training (its line says how many); a segment holding no checkpoint starts none."""
    from raybiphase.finetune.spec import FinetuneSource

    plan, ctx, out = _two_runs(tmp_path)
    segments, launched = _Segments(plan, ctx), []
    sched = _scheduler(ctx, out, launched, monkeypatch)
    prefix, *tails = plan.segments
    runner = threading.Thread(target=lambda: segments.lines.append(("rows", sched.run(
        segments.jobs, lambda: [FinetuneSource("init", 0, "")]))), daemon=True)
    runner.start()
    segments.release[prefix].set()
    _until(lambda: len([line for line in segments.lines if line[0] == "started"]) == 3)
    assert [spec.run for spec in launched] == ["init"]  # the controls: before any checkpoint
    segments.release[tails[0]].set()
    _until(lambda: len(launched) == 2)
    segments.release[tails[1]].set()
    runner.join(30)
    assert not runner.is_alive()
    finals = [plan.segments[s].runs[0] for s in tails]
    assert [spec.run for spec in launched] == ["init", *finals]  # each checkpoint once, as its segment ended
    assert segments.lines[-1] == ("rows", [{"run": run} for run in ["init", *finals]])
    lines = out.getvalue().splitlines()
    assert f"fine-tuning: batch 2, 1 checkpoint(s) ready: {finals[0]}@8 (1 segment(s) still training)" in lines
    assert f"fine-tuning: batch 3, 1 checkpoint(s) ready: {finals[1]}@8" in lines


def _until(condition, timeout=30.0):
    import time

    deadline = time.time() + timeout
    while not condition() and time.time() < deadline:
        time.sleep(0.05)
    assert condition()


def test_a_fine_tuning_failure_is_said_at_once_and_raised_when_pretraining_ends(tmp_path, monkeypatch):
    plan, ctx, out = _two_runs(tmp_path)
    segments, launched = _Segments(plan, ctx), []
    sched = _scheduler(ctx, out, launched, monkeypatch)
    errors = []

    def run():
        try:
            sched.run(segments.jobs, lambda: (_ for _ in ()).throw(OSError("bucket gone")))
        except OSError as err:
            errors.append(err)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    _until(lambda: "fine-tuning: failed (OSError: bucket gone); pretraining goes on" in out.getvalue())
    assert runner.is_alive()  # pretraining goes on
    for event in segments.release.values():
        event.set()
    runner.join(30)
    assert [str(e) for e in errors] == ["bucket gone"] and launched == []  # no job started after the failure


def test_a_failed_job_is_said_at_once_the_running_ones_finish_and_none_starts_after_it(tmp_path, monkeypatch):
    from raybiphase.finetune.spec import FinetuneSource

    plan, ctx, out = _two_runs(tmp_path)
    segments, launched = _Segments(plan, ctx), []
    prefix, *tails = plan.segments
    first = plan.segments[tails[0]].runs[0]
    sched = _scheduler(ctx, out, launched, monkeypatch, fail={first})
    with pytest.raises(RuntimeError, match="1 of 1 fine-tuning trials failed; first: .*bad checkpoint"):
        segments.release[prefix].set()
        segments.release[tails[0]].set()
        threading.Timer(2.0, segments.release[tails[1]].set).start()  # ready after the failure: not started
        sched.run(segments.jobs, lambda: [FinetuneSource("init", 0, "")])
    assert [spec.run for spec in launched] == ["init", first]
    assert sched.rows == [{"run": "init"}]  # the controls' job finished and recorded its row
    assert "fine-tuning: failed (RuntimeError: 1 of 1 fine-tuning trials failed" in out.getvalue()


def test_a_segment_failing_every_try_stops_new_segments_and_is_raised_in_one_line_naming_its_tries(tmp_path,
                                                                                               monkeypatch):
    """FailurePolicy: a fit that fails without progress is fitted again, said in a line each time, until
    sweep.segment_tries fits in a row failed; then no segment starts and one line names the segment, its tries and
    the last error."""
    from raybiphase.errors import UserError

    plan, ctx, out = _two_runs(tmp_path)
    segments, launched = _Segments(plan, ctx), []
    prefix, *tails = plan.segments
    segments.fail = {prefix: ["none", "none", "none"]}
    sched = _scheduler(ctx, out, launched, monkeypatch)
    segments.release[prefix].set()
    with pytest.raises(UserError) as raised:
        sched.run(segments.jobs, lambda: [])
    assert str(raised.value) == (f"sweep: segment {prefix} failed after 3 tries (sweep.segment_tries: 3), last "
                                 "error: worker died ValueError: loss is nan; run the sweep again to resume")
    assert [line[:2] for line in segments.lines] == [("started", prefix)] * 3 + [("ended", prefix)]
    lines = out.getvalue().splitlines()
    assert f"pretraining: {prefix} try 1 failed (worker died ValueError: loss is nan); fitting it again from its " \
           "start (2 failed tries in a row left)" in lines
    assert f"pretraining: {prefix} try 2 failed (worker died ValueError: loss is nan); fitting it again from its " \
           "start (1 failed try in a row left)" in lines
    assert f"pretraining: {prefix} failed on try 3 (worker died ValueError: loss is nan); no segment starts after " \
           "it, the running ones and the fine-tuning of ready checkpoints go on" in lines


def test_a_failed_try_that_committed_a_checkpoint_starts_the_count_again(tmp_path, monkeypatch):
    """A try that committed a newer checkpoint before failing made progress: with one failed try allowed in a
    row, a segment failing twice with progress and then once without ends there, fitted three times."""
    from raybiphase.errors import UserError
    from raybiphase.failures import FailurePolicy

    plan, ctx, out = _two_runs(tmp_path)
    segments, launched = _Segments(plan, ctx), []
    prefix, *tails = plan.segments
    segments.fail = {prefix: ["progress", "progress", "none"]}
    segments.release[prefix].set()
    with pytest.raises(UserError, match=f"^sweep: segment {prefix} failed after 3 tries \\(sweep.segment_tries: 1\\)"):
        _scheduler(ctx, out, launched, monkeypatch, policy=FailurePolicy(tries=1)).run(segments.jobs, lambda: [])
    assert [line[:2] for line in segments.lines] == [("started", prefix)] * 3 + [("ended", prefix)]
    assert f"pretraining: {prefix} try 2 failed (worker died ValueError: loss is nan); fitting it again from step " \
           "1 (1 failed try in a row left)" in out.getvalue()


def test_a_failing_segment_leaves_the_jobs_that_do_not_wait_on_it_going_and_ends_with_every_row(tmp_path,
                                                                                               monkeypatch):
    """While one branch fails and is fitted again, the other branch starts and ends and its checkpoint is
    fine-tuned; the sweep then ends with the failed segment's line, the other rows kept."""
    from raybiphase.errors import UserError
    from raybiphase.finetune.spec import FinetuneSource

    plan, ctx, out = _two_runs(tmp_path)
    segments, launched = _Segments(plan, ctx), []
    prefix, *tails = plan.segments
    segments.fail = {tails[0]: ["none"] * 3}
    sched = _scheduler(ctx, out, launched, monkeypatch)
    for event in segments.release.values():
        event.set()
    with pytest.raises(UserError, match=f"^sweep: segment {tails[0]} failed after 3 tries"):
        sched.run(segments.jobs, lambda: [FinetuneSource("init", 0, "")])
    other = plan.segments[tails[1]].runs[0]
    assert ("ended", tails[1], True) in segments.lines  # trained beside the failing branch
    assert sorted(spec.run for spec in launched) == sorted(["init", other])  # its checkpoint fine-tuned
    assert sorted(row["run"] for row in sched.rows) == sorted(["init", other])


def test_a_stalled_fit_is_stopped_and_fitted_again_and_one_that_cannot_be_stopped_fails_its_segment(
        tmp_path, monkeypatch):
    """A fit with no sign of life for sweep.stall_s is stopped (its fit raises): a failed try, fitted again. One
    with no controller to stop fails the segment at once, never fitted again beside itself."""
    from raybiphase.errors import UserError
    from raybiphase.failures import FailurePolicy
    from raybiphase.sweep import scheduler

    plan, ctx, out = _two_runs(tmp_path)
    segments, launched = _Segments(plan, ctx), []
    prefix, *tails = plan.segments
    segments.hang = {prefix}
    segments.release[prefix].set()
    runner = threading.Thread(target=lambda: _scheduler(ctx, out, launched, monkeypatch, policy=FailurePolicy(
        stall_s=1.0)).run(segments.jobs, lambda: []), daemon=True)
    runner.start()
    _until(lambda: ("ended", prefix, True) in segments.lines)
    segments.release[tails[0]].set(), segments.release[tails[1]].set()
    runner.join(30)
    assert not runner.is_alive() and segments.stops == [prefix]
    text = out.getvalue()
    assert re.search(f"pretraining: {prefix} showed no sign of life for [12] s \\(sweep.stall_s: 1\\); stopping "
                     "its fit", text), text
    assert re.search(f"pretraining: {prefix} try 1 failed \\(no sign of life for [12] s \\(sweep.stall_s: 1\\); "
                     r"stopped \(The actor died unexpectedly before finishing this task.\)\); fitting it again", text)

    plan, ctx, out = _two_runs(tmp_path / "unstoppable")
    segments, launched = _Segments(plan, ctx), []
    prefix, *tails = plan.segments
    segments.hang, segments.stoppable = {prefix}, False
    segments.release[prefix].set()
    monkeypatch.setattr(scheduler, "STOP_GRACE_S", 1.0)
    with pytest.raises(UserError) as raised:
        _scheduler(ctx, out, launched, monkeypatch, policy=FailurePolicy(stall_s=1.0)).run(segments.jobs, lambda: [])
    assert re.fullmatch(f"sweep: segment {prefix} failed after 1 try \\(sweep.segment_tries: 3\\), last error: no "
                        "sign of life for [12] s \\(sweep.stall_s: 1\\); it has no Ray Train controller to stop; "
                        "run the sweep again to resume", str(raised.value)), str(raised.value)
    assert [line[:2] for line in segments.lines] == [("started", prefix), ("ended", prefix)]
    segments.stopped[prefix].set()  # the blocked fit ends: its late end changes nothing


def test_a_storage_outage_fails_the_segment_even_after_progress(tmp_path, monkeypatch):
    """A bucket unreachable past its budget: a new try would wait the same outage out again."""
    from raybiphase.errors import UserError

    plan, ctx, out = _two_runs(tmp_path)
    segments, launched = _Segments(plan, ctx), []
    prefix, *tails = plan.segments
    segments.fail = {prefix: ["outage"]}
    segments.release[prefix].set()
    with pytest.raises(UserError, match=f"segment {prefix} failed after 1 try .*last error: storage: s3://b "
                                        "unreachable for 15 min"):
        _scheduler(ctx, out, launched, monkeypatch).run(segments.jobs, lambda: [])
    assert [line[:2] for line in segments.lines] == [("started", prefix), ("ended", prefix)]
