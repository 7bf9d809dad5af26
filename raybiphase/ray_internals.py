"""The only place raybiphase reaches past Ray's public API, each reach checked when the driver starts Ray.

Ray 2.60 has no public call for three things the platform needs:

- running a function in the main thread of a Ray Train worker's actor, the one thread where Python lets a SIGTERM
  handler be set (a spot VM's notice: `raybiphase.pretrain.preemption`). Ray Train runs the training function in
  another thread of that actor; the actor's own `execute` method runs in its main thread.
- finding the Ray clusters `ray start` left running on this machine (`raybiphase.raycluster` says so before it
  starts a cluster of its own beside them).
- draining a node for preemption with a deadline (`ray drain-node`, a CLI Ray keeps out of its stability
  promise, the call its own autoscaler makes): `raybiphase spot-watch` turns a cloud's spot notice into one.

`check()` runs before the driver starts or joins Ray. If the installed Ray moved any of these internals, it stops with one
line naming what is missing and the Ray version this code was tested with, instead of letting preemption notices or
the warning go silently missing after an upgrade. Everything else (preemption notices from the cluster, waiting for
the controller) goes through Ray Train's public API.
"""

from __future__ import annotations

from typing import Callable

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
