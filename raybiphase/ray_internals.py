"""The only place raybiphase reaches past Ray's public API, each reach checked when the driver starts Ray.

Ray 2.60 has no public call for four things the platform needs:

- running a function in the main thread of a Ray Train worker's actor, the one thread where Python lets a SIGTERM
  handler be set (a spot VM's notice: `raybiphase.pretrain.preemption`). Ray Train runs the training function in
  another thread of that actor; the actor's own `execute` method runs in its main thread.
- finding the Ray clusters `ray start` left running on this machine (`raybiphase.raycluster` says so before it
  starts a cluster of its own beside them).
- draining a node for preemption with a deadline (`ray drain-node`, a CLI Ray keeps out of its stability
  promise, the call its own autoscaler makes): `raybiphase spot-watch` turns a cloud's spot notice into one.
- guarding a fit (`fit_guard`): Ray Train's controller and worker-group callbacks (a DeveloperAPI) give the driver
  the controller's process and its signs of life, so a fit that hangs can be stopped (`stop_fit`), and shut down a
  worker group that Ray 2.60 leaks when one of its workers dies while the training function is launched (the
  controller never learns of that group, so its placement group would hold its CPUs and GPUs until the driver
  exits, and whatever waits for them, a fine-tuning trial or the segment's next try, waits forever).

`check()` runs before the driver starts or joins Ray. If the installed Ray moved any of these internals, it stops with one
line naming what is missing and the Ray version this code was tested with, instead of letting preemption notices or
the warning go silently missing after an upgrade. Everything else (preemption notices from the cluster, waiting for
the controller) goes through Ray Train's public API.
"""

from __future__ import annotations

from collections.abc import Callable

from raybiphase.errors import UserError

TESTED_RAY = "2.60"
"""The Ray release these internals were read from (constraints.txt pins it)."""


def _train_worker_class():
    from ray.train.v2._internal.execution.worker_group.worker import RayTrainWorker

    return RayTrainWorker


def missing() -> list[str]:
    """The internals this Ray lacks, by name (empty when every one is where this code expects it)."""
    gaps = []
    try:
        if not callable(getattr(_train_worker_class(), "execute", None)):
            gaps.append("RayTrainWorker.execute")
    except ImportError:
        gaps.append("ray.train.v2._internal.execution.worker_group.worker.RayTrainWorker")
    try:
        from ray._private.services import find_gcs_addresses  # noqa: F401
        from ray._private.utils import read_ray_address  # noqa: F401
    except ImportError:
        gaps.append("ray._private.services.find_gcs_addresses / ray._private.utils.read_ray_address")
    try:
        from ray.scripts.scripts import drain_node  # noqa: F401
    except ImportError:
        gaps.append("`ray drain-node` (ray.scripts.scripts.drain_node)")
    try:
        _guard_class()
    except (ImportError, AttributeError):
        gaps.append("ray.train.v2._internal.execution.callback (ControllerCallback, WorkerGroupCallback, "
                    "ReportCallback)")
    return gaps


def check() -> None:
    """Raise `UserError` in one line when the installed Ray lacks an internal this module uses."""
    gaps = missing()
    if gaps:
        import ray

        raise UserError(f"Ray {ray.__version__} lacks what raybiphase uses of its internals ({', '.join(gaps)}); "
                        f"install the Ray release constraints.txt names (tested: {TESTED_RAY})")


def run_in_worker_main_thread(fn: Callable[[], bool]) -> bool:
    """`fn()` run in the main thread of the calling Ray Train worker's actor (call it from the training function).
    Raises when that actor has no `execute`: a worker that cannot set its handler must not train as if it could."""
    import ray

    actor = ray.get_runtime_context().current_actor
    if not hasattr(actor, "execute"):
        raise RuntimeError(f"this Ray Train worker's actor has no `execute` (Ray {ray.__version__}): a preemption "
                           f"notice could not reach the training loop; install Ray {TESTED_RAY}")
    return ray.get(actor.execute.remote(fn))


def local_clusters() -> tuple[list[str], str]:
    """The GCS addresses of the Ray clusters running on this machine, and the one `ray start` last recorded as the
    machine's current cluster ("" when none)."""
    from ray._private.services import find_gcs_addresses
    from ray._private.utils import read_ray_address

    return sorted(find_gcs_addresses()), read_ray_address() or ""


def drain_node_command(seconds_left: int, message: str, node_id: str | None = None,
                       address: str | None = None) -> list[str]:
    """`ray drain-node` for preemption with `seconds_left` until the machine goes (this node unless `node_id`)."""
    command = ["ray", "drain-node", "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", message,
               "--deadline-remaining-seconds", str(seconds_left)]
    return command + (["--node-id", node_id] if node_id else []) + (["--address", address] if address else [])


_GUARD = None


def _guard_class():
    """The fit guard's class, made once from Ray Train's callback bases (imported only when Train is used)."""
    global _GUARD
    if _GUARD is not None:
        return _GUARD
    from ray.train.v2._internal.execution.callback import ControllerCallback, ReportCallback, WorkerGroupCallback

    class FitGuard(ControllerCallback, WorkerGroupCallback, ReportCallback):
        """Lives in the fit's controller (on the driver's node: Ray Train pins it there). Writes `record` (a local
        JSON file: the controller's pid and the time of its last sign of life: its start, each change of its
        state, each report) and shuts down a worker group whose training function never launched before a failure is acted
        on."""

        def __init__(self, record: str):
            self.record = record
            self.launching: list = []  # groups started whose training function has not been seen to launch

        def _alive(self, state: str) -> None:
            import json
            import os
            import time

            part = f"{self.record}.part"
            with open(part, "w") as out:
                json.dump({"pid": os.getpid(), "time": time.time(), "state": state}, out)
            os.replace(part, self.record)

        def after_controller_start(self, train_run_context) -> None:
            self._alive("started")

        def after_controller_state_update(self, previous_state, current_state) -> None:
            if type(current_state) is not type(previous_state):  # called on every turn of the control loop
                self._alive(type(current_state).__name__)

        def after_report(self, training_report, metrics) -> None:
            self._alive("report")

        def after_worker_group_start(self, worker_group) -> None:
            self.launching.append(worker_group)

        def after_worker_group_training_start(self, worker_group) -> None:
            self.launching = [group for group in self.launching if group is not worker_group]

        def _shut_leaked(self) -> None:
            leaked, self.launching = self.launching, []
            for group in leaked:
                if group.has_started():
                    try:
                        group.shutdown()  # its actors and its placement group
                    except Exception:  # a group half gone: the controller's own cleanup still runs
                        pass

        def before_controller_execute_failure_decision(self, failure_decision) -> None:
            self._shut_leaked()

        async def before_controller_shutdown(self) -> None:
            self._shut_leaked()

    _GUARD = FitGuard
    return FitGuard


def fit_guard(record: str):
    """A Ray Train callback for one fit (pass it in `RunConfig.callbacks`): its controller writes `record`, a
    local file (`{"pid", "time", "state"}`: when the controller last showed a sign of life), and cleans up a worker
    group it would leak (module docstring). Read the record with `fit_record`; stop the fit with `stop_fit`."""
    return _guard_class()(record)


def fit_record(record: str) -> dict | None:
    """What the guard of a fit last wrote (None: nothing yet, the controller has not started)."""
    import json

    try:
        with open(record) as source:
            return json.load(source)
    except (OSError, ValueError):
        return None


def stop_fit(record: str) -> bool:
    """Kill the controller of the fit `record` guards, so that its `fit()` raises (Ray ends the worker group the
    controller owned, and Ray Train's placement-group cleaner its placement group). False when there is no
    controller to kill: the fit never started one or it has already gone."""
    import os
    import signal

    seen = fit_record(record)
    try:
        pid = int(seen["pid"])
    except (TypeError, KeyError, ValueError):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:  # never another process that took a dead one's pid
            if b"TrainController" not in cmdline.read():
                return False
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: trust the pid the record names
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True
