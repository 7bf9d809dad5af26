"""The one failure policy's decisions (raybiphase.failures), without Ray running: a segment's tries, a trial's
retries, a wave's failure, the `pretrain` command's restarts, an outage never retried (found by type in Ray Train's
own error classes), a damaged checkpoint passed over."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from ray.exceptions import RaySystemError
from ray.train.v2.api.exceptions import ControllerError, WorkerGroupError

from raybiphase import storage
from raybiphase.config import SweepSpec, load
from raybiphase.errors import UserError
from raybiphase.failures import MAX_FAILURES_ENV, FailurePolicy, Unstoppable, final, storage_outage
from raybiphase.outages import StorageOutage
from raybiphase.pretrain.checkpoint import Damaged

OUTAGE = "storage: s3://b/sweep unreachable for 15 min (sweep.storage_outage_s = 900 s; raise it to wait longer)"


def carried(error: BaseException) -> BaseException:
    """`error` as Ray carries it from the controller actor to the driver's `fit()`: pickled and back."""
    return pickle.loads(pickle.dumps(error))


def test_a_segment_is_fitted_again_while_tries_are_left_and_the_sweep_sets_them():
    spec = load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.segment_tries=2", "sweep.stall_s=60",
                                                       "sweep.storage_outage_s=30"])
    policy = FailurePolicy.of(spec.sweep)
    assert (policy.tries, policy.stall_s, policy.storage_outage_s) == (2, 60.0, 30.0)
    error = RuntimeError("Training failed due to worker errors:\nValueError: loss is nan")
    assert policy.retry(error, 1) and not policy.retry(error, 2)
    assert not policy.retry(Unstoppable("no sign of life for 61 s"), 0)


def test_a_storage_outage_is_never_retried_found_by_type_in_ray_trains_error():
    policy = FailurePolicy()
    workers = carried(WorkerGroupError("[Rank 1] ...", {0: RuntimeError("gloo: peer lost"), 1: StorageOutage(OUTAGE)}))
    controller = carried(ControllerError(StorageOutage(OUTAGE)))
    for error in (StorageOutage(OUTAGE), workers, controller):
        assert storage_outage(error) and final(error) and not policy.retry(error, 0), error
    try:  # an outage that ended a worker's call, re-raised as another error
        try:
            raise StorageOutage(OUTAGE)
        except StorageOutage as outage:
            raise RuntimeError("could not write the checkpoint") from outage
    except RuntimeError as chained:
        assert storage_outage(WorkerGroupError("...", {0: chained}))
    # the typed failures decide, not the text: a worker whose own error only quotes an outage is retried
    quoting = WorkerGroupError("raybiphase.outages.StorageOutage: " + OUTAGE, {0: RuntimeError("loss is nan")})
    assert not storage_outage(quoting) and policy.retry(quoting, 0)
    assert not storage_outage(RuntimeError("StorageOutage: " + OUTAGE))


def test_an_outage_ray_carries_only_as_text_is_still_found():
    lost = RaySystemError("Failed to unpickle serialized exception",
                          f"Traceback (most recent call last):\n  ...\nraybiphase.outages.StorageOutage: {OUTAGE}")
    assert storage_outage(lost) and not FailurePolicy().retry(lost, 0)
    assert not storage_outage(RaySystemError("Failed to unpickle serialized exception", "ValueError: loss is nan"))


def test_storage_retries_a_dropped_connection_but_never_an_outage_past_its_budget():
    assert storage.transient(OSError("AWS Error NETWORK_CONNECTION: Connection reset by peer"))
    assert not storage.transient(StorageOutage(OUTAGE))


def test_a_failed_trial_is_retried_by_the_policy_and_fails_its_wave():
    from raybiphase.finetune.fanout import Fanout
    from raybiphase.sweep.scheduler import Scheduler

    spec = load(SweepSpec, "sweeps/quickstart.yaml")
    scheduler = Scheduler(Fanout.of(spec), slots=2, policy=FailurePolicy(trial_retries=5))
    assert scheduler.trials.retries == 5
    assert FailurePolicy().trial_retries == 2
    assert FailurePolicy().job_fails(1) and not FailurePolicy().job_fails(0)


def test_the_pretrain_commands_restarts_come_from_its_flag_else_the_environment(monkeypatch):
    monkeypatch.delenv(MAX_FAILURES_ENV, raising=False)
    assert FailurePolicy.for_command().command_restarts == 2
    monkeypatch.setenv(MAX_FAILURES_ENV, "-1")
    assert FailurePolicy.for_command().command_restarts == -1
    assert FailurePolicy.for_command(0).command_restarts == 0
    with pytest.raises(UserError, match="^--max-failures: -2 is below -1"):
        FailurePolicy.for_command(-2)
    monkeypatch.setenv(MAX_FAILURES_ENV, "-3")
    with pytest.raises(UserError, match=f"^{MAX_FAILURES_ENV}: '-3'"):
        FailurePolicy.for_command()


def test_the_pretrain_command_refuses_a_bad_restart_count_in_one_line_before_anything_runs():
    done = subprocess.run([sys.executable, "-m", "raybiphase", "pretrain", "sweeps/quickstart.yaml",
                           "--max-failures", "-2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("--max-failures: -2 is below -1 (no limit)")


def test_a_damaged_checkpoint_falls_back_to_the_one_before_it_but_never_past_a_parent():
    damaged = Damaged("checkpoint: runs/a/checkpoint_000010 is damaged: shard_0.distcp changed since it was committed")
    line = FailurePolicy().damaged(damaged, older=True)
    assert line.startswith(str(damaged)) and line.endswith("resuming from the committed checkpoint before it")
    with pytest.raises(Damaged):
        FailurePolicy().damaged(damaged, older=False)
