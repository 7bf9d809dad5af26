"""Fine-tuning beside pretraining (issue 29, point 2), without Ray: how many trials may run while segments hold the
cluster, a Tune grid that obeys that bound as it changes, and the stream that queues each checkpoint once, as its
segment ends. The fan-out itself is replaced by a recorder here; tests/sweep/test_pipeline.py runs the real one
beside a training segment."""

from __future__ import annotations

import io
import threading
import time

import pytest

from raybiphase.config import SweepSpec, from_dict
from raybiphase.sweep.finetuning import trial_capacity


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


def _grid(claim, values, tmp_path):
    from ray import tune
    from ray.tune.experiment import Experiment

    from raybiphase.finetune.scheduling import CappedGrid

    grid = CappedGrid(claim, fallback=2)
    grid.add_configurations([Experiment("x", lambda config: None, config={"a": tune.grid_search(values)},
                                        storage_path=str(tmp_path))])
    return grid


def test_the_grid_starts_trials_only_while_its_bound_allows_and_follows_it_as_it_changes(tmp_path):
    """While refused, the grid says it is finished: Tune then asks it for nothing and keeps no ended trial's
    process idle (it would hold what a segment or another fan-out's trial waits for); with none of its trials
    running, the Tuner ends. Tune re-reads it every step, so a slot freed makes it unfinished again."""
    from ray import cloudpickle

    from raybiphase.finetune.scheduling import TrialSlots

    bound = [0]
    slots = TrialSlots(lambda: bound[0])
    claim = slots.claim(3)
    grid = _grid(claim, [1, 2, 3], tmp_path)
    assert grid.next_trial() is None and grid.is_finished()  # held back, none running: its Tuner ends
    bound[0] = 2
    assert not grid.is_finished()
    first, second = grid.next_trial(), grid.next_trial()
    assert first and second and grid.next_trial() is None
    assert grid.is_finished()  # its own trials fill the bound: an ended one's process is not kept idle...
    grid.on_trial_complete(first.trial_id)
    assert not grid.is_finished()  # ...unless the grid may start its next trial on the freed slot
    bound[0] = 0
    assert grid.next_trial() is None and grid.is_finished()  # a segment took the slot
    bound[0] = 2
    third = grid.next_trial()
    assert third.config["a"] == 3 and grid.is_finished()  # every trial started: nothing left to ask for
    grid.on_trial_complete(second.trial_id, error=True)  # a trial that failed for good frees its slot, once
    grid.on_trial_complete(second.trial_id, error=True)
    assert (claim.waiting, claim.running) == (0, 1)
    # Tune pickles its search algorithm with the experiment: the claim (and the slots' lock) stays out
    restored = cloudpickle.loads(cloudpickle.dumps(grid))
    assert restored._claim is None and restored._fallback == 2


def test_a_later_fanout_takes_the_slots_an_earlier_ones_tail_leaves_idle_and_never_more(tmp_path):
    """Two fan-outs on shared slots (the sweep's batches of ready checkpoints): the earlier one's trials start
    first; once it has none left to start, the later one fills what its last trials leave free; together they
    never run more trials than the bound."""
    from raybiphase.finetune.scheduling import TrialSlots

    slots = TrialSlots(lambda: 2)
    early_claim, late_claim = slots.claim(3), slots.claim(2)
    early, late = _grid(early_claim, [1, 2, 3], tmp_path), _grid(late_claim, [4, 5], tmp_path)
    running = [early.next_trial(), early.next_trial()]
    assert all(running) and late.next_trial() is None and early.next_trial() is None  # the bound: 2 in all
    assert late.is_finished()  # held back with none of its own running: its Tuner ends, a later one starts
    early.on_trial_complete(running.pop(0).trial_id)
    assert late.next_trial() is None  # a slot frees, but the earlier fan-out still has a trial to start
    running.append(early.next_trial())
    assert running[-1].config["a"] == 3 and early.next_trial() is None
    early.on_trial_complete(running.pop(0).trial_id)  # the earlier one's tail: one trial, two slots
    tail = late.next_trial()
    assert tail is not None and tail.config["a"] == 4 and late.next_trial() is None
    assert (early_claim.running, late_claim.running, late_claim.waiting) == (1, 1, 1)
    early.on_trial_complete(running.pop(0).trial_id)
    slots.release(early_claim)  # its launch ended
    assert late.next_trial().config["a"] == 5 and late_claim.waiting == 0


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
    from raybiphase.sweep.context import SweepContext
    from raybiphase.sweep.plan import make_plan

    spec = from_dict(SweepSpec, {"sweep": {"name": "s", "storage": str(tmp_path), "grid": {"phases.clm_share": [0.5, 1.0]}},
                                 "model": {"size": "tiny"}, "phases": {"steps": 8},
                                 "optim": {"warmup_steps": 2, "decay_steps": 2},
                                 "resources": {"max_concurrent": 2},
                                 "finetune": {"tasks": ["tweets"], "lrs": [1e-3], "seeds": [0]}})
    plan, out = make_plan(spec), io.StringIO()
    return plan, SweepContext(spec, plan, _Paths(tmp_path / "s"), out=out), out


def test_an_earlier_batchs_completion_pass_ranks_before_a_later_batch_and_idle_slots_are_told():
    """A claim ranks by its fan-out's priority (the sweep's batch number), then by when it was made: the completion
    pass of batch 1, claimed after batch 2's trials, still starts first. `idle` says whether a free slot would go
    unused by every waiting trial (the stream then starts the next batch)."""
    from raybiphase.finetune.scheduling import TrialSlots

    slots = TrialSlots(lambda: 1)
    assert slots.idle()
    second = slots.claim(2, priority=2)
    assert not slots.idle()  # batch 2 has trials waiting for the free slot
    completion = slots.claim(1, priority=1)
    assert completion.may_start() and not second.may_start()
    assert [c.number for c in (second, completion)] == [0, 1]
    planning = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
    planning.start()  # a fan-out that has not claimed yet: no room for another until it has
    assert not slots.room_for_another([planning, threading.current_thread()])
    slots.release(completion)
    assert second.may_start()
    slots.release(second)
    assert slots.room_for_another([threading.current_thread()])  # it made its claims, and the slot is free


def test_the_stream_starts_checkpoints_ready_meanwhile_as_one_batch_once_a_running_batch_leaves_a_slot_idle(
        tmp_path, monkeypatch):
    """The controls' batch starts at once; each checkpoint is queued once, when its segment ends. Checkpoints
    ready while a running batch still has trials to start wait, and start together as one batch as soon as that
    batch's tail leaves a slot idle, not when it ends (issue 29). Every batch shares one set of trial slots,
    bounded by the segments, and a later batch ranks after an earlier one."""
    from raybiphase.sweep import finetuning

    plan, ctx, out = _two_runs(tmp_path)
    batches, slots, priorities = [], set(), []
    controls_claimed, trial_started, release, checkpoints_ran = (threading.Event() for _ in range(4))

    def fanout(sources, cfg, **kwargs):  # a launch's claim on the shared slots, as _launch makes it
        batches.append(sorted((s.run, s.pretrain_step) for s in sources))
        slots.add(id(cfg.slots))
        priorities.append(cfg.priority)
        assert cfg.slots.bound() == trial_capacity(2, 2, stream.running, stream.pretraining)
        claim = cfg.slots.claim(1, cfg.priority)
        if sources[0].run == "init":  # the controls: one trial, waiting for a slot, then running until released
            controls_claimed.set()
            trial_started.wait(30)
            with cfg.slots.lock:
                claim.waiting, claim.running = 0, 1
            release.wait(30)
        else:
            checkpoints_ran.set()
        cfg.slots.release(claim)
        return []

    monkeypatch.setattr(finetuning, "run_fanout", fanout)
    monkeypatch.setattr(finetuning, "control_sources", lambda ctx: [finetuning.result_rows.FinetuneSource("init", 0, "")])
    stream = finetuning.FinetuneStream(ctx)
    stream.segments_running(1)
    stream.start()
    assert controls_claimed.wait(10)
    prefix, *tails = plan.segments  # the shared CLM prefix, then the two runs' tails
    stream.segments_done({prefix})  # holds no checkpoint a run fine-tunes
    stream.segments_done({prefix, tails[0]})
    stream.segments_done({prefix, tails[0]})  # told again: queued once
    stream.segments_done({prefix, *tails})
    stream.segments_running(0)
    time.sleep(1.5)  # the controls' trial still waits for a slot: the checkpoints wait with it
    held = not checkpoints_ran.is_set()
    trial_started.set()  # the controls' batch has no trial left to start, a slot is idle: the checkpoints go
    ran_beside = checkpoints_ran.wait(10)  # before the controls' batch has ended
    release.set()
    stream.close()
    assert stream.join() == [] and stream.error is None
    assert held and ran_beside, f"held {held}, ran beside the running batch {ran_beside}: {batches}"
    finals = sorted((plan.segments[s].runs[0], plan.segments[s].end) for s in tails)
    assert batches == [[("init", 0)], finals] and priorities == [1, 2] and len(slots) == 1
    assert "fine-tuning: batch 2, 2 checkpoint(s) ready:" in out.getvalue()


def test_a_fine_tuning_failure_is_said_at_once_and_raised_when_pretraining_ends(tmp_path, monkeypatch):
    from raybiphase.sweep import finetuning
    from raybiphase.sweep.context import SweepContext
    from raybiphase.sweep.plan import make_plan

    spec = from_dict(SweepSpec, {"sweep": {"name": "s", "storage": str(tmp_path)}, "model": {"size": "tiny"},
                                 "finetune": {"tasks": ["tweets"]}})
    out = io.StringIO()
    ctx = SweepContext(spec, make_plan(spec), _Paths(tmp_path / "s"), out=out)
    monkeypatch.setattr(finetuning, "control_sources", lambda ctx: (_ for _ in ()).throw(OSError("bucket gone")))
    stream = finetuning.FinetuneStream(ctx)
    stream.start()
    stream.thread.join(10)
    assert "fine-tuning: failed (OSError: bucket gone); pretraining goes on" in out.getvalue()
    stream.close()
    with pytest.raises(OSError, match="bucket gone"):
        stream.join()


def test_a_failed_batch_is_said_at_once_the_running_ones_finish_and_none_starts_after_it(tmp_path, monkeypatch):
    from raybiphase.sweep import finetuning

    plan, ctx, out = _two_runs(tmp_path)
    failed, batches = threading.Event(), []
    row = {"run": "init", "pretrain_step": 0, "task": "tweets", "lr": 1e-3, "seed": 0, "source": "raybiphase"}

    def fanout(sources, cfg, **kwargs):
        batches.append([s.run for s in sources])
        if sources[0].run == "init":  # the controls: one trial running (a slot left free) when the next batch fails
            claim = cfg.slots.claim(1, cfg.priority)
            with cfg.slots.lock:
                claim.waiting, claim.running = 0, 1
            assert failed.wait(30)
            cfg.slots.release(claim)
            return [row]
        raise RuntimeError("1 of 1 fine-tuning trials failed; first: bad checkpoint")

    monkeypatch.setattr(finetuning, "run_fanout", fanout)
    monkeypatch.setattr(finetuning, "control_sources", lambda ctx: [finetuning.result_rows.FinetuneSource("init", 0, "")])
    stream = finetuning.FinetuneStream(ctx)
    stream.start()
    prefix, *tails = plan.segments
    stream.segments_done({prefix, tails[0]})
    deadline = time.time() + 30
    while "fine-tuning: failed (RuntimeError" not in out.getvalue() and time.time() < deadline:
        time.sleep(0.1)
    failed.set()
    stream.segments_done({prefix, *tails})  # ready after the failure: not started
    stream.close()
    with pytest.raises(RuntimeError, match="bad checkpoint"):
        stream.join()
    assert len(batches) == 2 and stream.rows == [row]  # the controls' batch finished and recorded its row
    assert "fine-tuning: failed (RuntimeError: 1 of 1 fine-tuning trials failed" in out.getvalue()
