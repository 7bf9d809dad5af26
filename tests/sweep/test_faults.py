"""Faults a sweep's segments meet on a cluster, rehearsed on the real local Ray: a worker lost while its group
starts (its training function being launched), a worker lost mid-training, the fit's controller lost (all three met
by one segment, in turn), and a fit that hangs. Each ends as a clean run does (every (run, step) row once) or, for
the hang, with one line within sweep.stall_s of the fit's last sign of life; no fault leaves CPUs held.

The faults are Ray Train callbacks (its DeveloperAPI) added to the sweep's own fits, each acting once (a mark file
says it has)."""

from __future__ import annotations

import io
import os
import re
import sys
import time

import pytest

from tests.conftest import tiny_base

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _faults(marks):
    """A callback acting at most once per fault across the fits it is given to (a mark file in `marks` per fault
    says it acted): kills the first worker as the training function is launched ("launch"); in a later fit, kills
    it after the first report ("worker"); once Ray Train restarted the group within that fit, ends the controller's
    process after the restarted group's first report ("controller")."""
    from ray.train.v2._internal.execution.callback import ControllerCallback, ReportCallback, WorkerGroupCallback

    class Faults(ControllerCallback, WorkerGroupCallback, ReportCallback):
        def __init__(self):
            self.group, self.restarted = None, False

        def _once(self, kind: str) -> bool:
            mark = marks / f"{kind}.mark"
            if mark.exists():
                return False
            mark.write_text(kind)
            return True

        def after_worker_group_start(self, worker_group):
            import ray

            if self._once("launch"):  # after its start's own checks: the launch finds it dead
                ray.kill(worker_group.get_workers()[0].actor)
                time.sleep(2)

        def after_worker_group_training_start(self, worker_group):
            self.group, self.restarted = worker_group, (marks / "worker.mark").exists()

        def after_report(self, training_report, metrics):
            import ray

            if self.group is not None and not self.restarted and self._once("worker"):
                ray.kill(self.group.get_workers()[0].actor)
            elif self.restarted and self._once("controller"):
                os._exit(1)

    return Faults()


def _blocking_loop(config: dict) -> None:
    """A training function that never steps nor reports: a fit that hangs."""
    time.sleep(3600)


def _spec(tmp_path, small_data, **sweep):
    from raybiphase.config import SweepSpec, from_dict

    spec = tiny_base(tmp_path / "results", small_data, name="faults")
    spec["resources"] = {"num_workers": 1, "cpus_per_worker": 0.45, "max_concurrent": 2}
    spec["sweep"] = {**spec["sweep"], **sweep}
    return from_dict(SweepSpec, spec)


def _cpus_free(expected: float, timeout: float = 180.0) -> float:  # a loaded machine frees them slowly
    import ray

    deadline = time.time() + timeout
    while time.time() < deadline and ray.available_resources().get("CPU", 0.0) < expected:
        time.sleep(1)
    return ray.available_resources().get("CPU", 0.0)


def test_a_worker_lost_at_launch_or_mid_training_and_a_lost_controller_each_end_as_a_clean_run(
        ray_cluster, small_data, tmp_path):
    """One segment meets the three faults in turn: its first fit loses its worker as the training function
    launches (Ray Train raises: a failed try, fitted again); the next fit loses a worker after its first report
    (Ray Train's own restart, within the fit: no try is lost), then, once restarted, its controller (a failed try,
    fitted again from its newest checkpoint). The run's rows are those of a clean run, each once; each of the two
    failed tries is said in a line."""
    import ray
    import ray.cloudpickle

    from raybiphase.results.store import read_rows
    from raybiphase.sweep import driver
    from raybiphase.telemetry.console import Console

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the controller need not import this module
    cpus = ray.cluster_resources()["CPU"]
    spec = _spec(tmp_path, small_data, segment_tries=4)
    make = driver.make_trainer

    def with_faults(job, **kwargs):
        return make(job, callbacks=[*kwargs.pop("callbacks", ()), _faults(tmp_path)], **kwargs)

    out = io.StringIO()
    driver.run_sweep(spec, console=Console(out), make_trainer=with_faults)
    text = out.getvalue()
    assert sorted(p.name for p in tmp_path.glob("*.mark")) == ["controller.mark", "launch.mark", "worker.mark"]
    rows = read_rows(tmp_path / "results" / "faults" / "pretrain.parquet")
    assert not rows.duplicated(["run", "step"]).any()
    assert rows.groupby("run")["step"].apply(sorted).tolist() == [list(range(1, 9))]
    failed = re.findall(r"^pretraining: tiny-\S+ try (\d) failed \((.*)\); fitting it again from (its start|step "
                        r"\d+) \([1-4] failed tr(?:y|ies) in a row left\)$", text, re.M)
    # the lost worker at launch and the lost controller: a try each; the worker lost mid-training: none
    assert [int(number) for number, _, _ in failed] == [1, 2], text
    assert _cpus_free(cpus) == cpus  # no worker group, placement group or controller left holding CPUs


def test_a_hung_fit_ends_the_sweep_in_one_line_within_the_stall_bound(ray_cluster, small_data, tmp_path):
    """A training function that blocks: no step, no report, no change of the controller's state. sweep.stall_s
    after the fit's last sign of life it is stopped; with one try allowed, the sweep ends with one line naming the
    segment, its try and the stall, and the fit's CPUs are free again."""
    import ray
    import ray.cloudpickle

    from raybiphase.errors import UserError
    from raybiphase.sweep import driver
    from raybiphase.telemetry.console import Console

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cpus = ray.cluster_resources()["CPU"]
    spec = _spec(tmp_path, small_data, stall_s=15, segment_tries=1)
    make = driver.make_trainer
    out = io.StringIO()
    began = time.monotonic()
    with pytest.raises(UserError) as raised:
        driver.run_sweep(spec, console=Console(out),
                         make_trainer=lambda job, **kwargs: make(job, train_fn=_blocking_loop, **kwargs))
    took = time.monotonic() - began
    line = str(raised.value)
    assert "\n" not in line and re.fullmatch(
        r"sweep: segment tiny-\S+ failed after 1 try \(sweep\.segment_tries: 1\), last error: no sign of "
        r"life for 1\d s \(sweep\.stall_s: 15\); stopped \(.+\); run the sweep again to resume", line), line
    assert re.search(r"^pretraining: tiny-\S+ showed no sign of life for 1\d s \(sweep.stall_s: 15\); "
                     "stopping its fit$", out.getvalue(), re.M), out.getvalue()
    assert took < 15 + 90, took  # the fit's start (a cold one: under a minute here), the bound, the stop
    assert _cpus_free(cpus) == cpus
