"""A preemption notice: spot and preemptible VMs get SIGTERM and a grace period (30 s to 2 min) before they go.

Two ways a notice reaches the loop, both agreed by every worker after the step under way (one all-reduce per step):

- a drain of a worker's node that Ray announces with its deadline (a cloud's spot notice turned into a drain by
  `raybiphase spot-watch` on the node, or an autoscaler reclaiming it; read through Ray Train's public
  `ray.train.get_preemption_info`): the segment writes a checkpoint at once and keeps training, as Ray Train asks;
  at the deadline Ray Train restarts the group from that checkpoint on the nodes left or new ones, and counts the
  restart against `FailureConfig.max_preemption_failures` (unbounded), never against the segment's `max_failures`.
- SIGTERM to a worker's process (a plain VM's shutdown): the segment writes a checkpoint and the workers raise
  `Preempted`; Ray Train restarts the group from it. A second SIGTERM takes Ray's own way out (the process exits).

Either way a resume loses at most the steps trained after the notice's checkpoint.

Ray's drain notice is read as often as Ray Train's preemption watcher refreshes it (`drain_poll_s`: every 5 s
unless RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S says otherwise), not every step: `get_preemption_info` is a barrier
across the workers through Ray's actors, which a step of a fraction of a second should not wait on, and reading it
more often than the watcher refreshes it learns nothing new. The workers agree when to read it through the same
all-reduce, so each calls it equally often, as Ray requires. A drain is acted on at most two intervals after Ray
announces it: well inside a grace period of 30 s or more.

The loop runs in a thread of Ray Train's worker actor, and Python lets only the main thread set signal handlers:
`install` has the worker's own actor run the setup in its main thread (`raybiphase.ray_internals`, checked when the
driver starts).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import torch
import torch.distributed as dist

from raybiphase import ray_internals

_NOTICE = threading.Event()
_GROUP: list = [None]
"""The process group the flag is agreed over: a gloo group beside NCCL, so the check never waits on the GPU."""


class Preempted(RuntimeError):
    """Raised by every worker once the preemption checkpoint is written: Ray Train restarts the group from it."""


def _handle_in_main_thread() -> bool:
    previous = signal.getsignal(signal.SIGTERM)
    if getattr(previous, "raybiphase_notice", False):  # an earlier run in this process set it already
        return True

    def notice(signum, frame):
        if _NOTICE.is_set() and callable(previous):
            previous(signum, frame)  # a second SIGTERM: Ray's handler, the process exits
        _NOTICE.set()

    notice.raybiphase_notice = True
    signal.signal(signal.SIGTERM, notice)
    return True


POLL_ENV, DEFAULT_POLL_S = "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", 5.0
"""Ray Train's setting for how often its preemption watcher polls Ray for drained nodes, and its default (Ray Train
forwards the variable from the driver to its controller and workers)."""


def drain_poll_s() -> float:
    """Seconds between the workers' reads of Ray's drain notice: Ray Train's watcher interval (POLL_ENV), so that
    a notice is read within one interval of the watcher seeing it and never more often than it can change."""
    try:
        seconds = float(os.environ.get(POLL_ENV, DEFAULT_POLL_S))
    except ValueError:
        return DEFAULT_POLL_S
    return seconds if seconds > 0 else DEFAULT_POLL_S


_EVERY = [DEFAULT_POLL_S]  # drain_poll_s(), read once per process by install
_POLLED = [0.0]  # when the drain notice was last read (time.monotonic)
_IN_TRAIN = [False]  # whether this process is a Ray Train worker (set by install)
_DRAINING = [False]  # Ray's last answer: this group's nodes are being drained


def install(world: int = 1) -> bool:
    """Route SIGTERM of this Ray Train worker to the preemption notice (every worker calls it once, before the
    first step; a worker starts without a notice); False outside Ray Train (a plain process: the handler is set
    directly when this is the main thread)."""
    _NOTICE.clear()
    _DRAINING[0] = False
    _POLLED[0], _EVERY[0] = time.monotonic(), drain_poll_s()
    if world > 1 and _GROUP[0] is None and dist.get_backend() != "gloo":
        _GROUP[0] = dist.new_group(backend="gloo")
    _IN_TRAIN[0] = _in_train_worker()
    if threading.current_thread() is threading.main_thread():
        return _handle_in_main_thread()
    if not _IN_TRAIN[0]:
        return False
    return ray_internals.run_in_worker_main_thread(_handle_in_main_thread)


def _in_train_worker() -> bool:
    import ray

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return False  # not in an actor: a loop run outside a Ray Train worker has no notices to watch
    import ray.train

    try:
        ray.train.get_context()
    except RuntimeError:  # the driver, a Tune trial or a plain Ray task: Ray Train's calls do not apply
        return False
    return True


SIGNAL, DRAIN = 1, 2
"""What `requested` says: a SIGTERM reached a worker (checkpoint, then stop), Ray is draining a worker's node
(checkpoint, then keep training until Ray Train restarts the group at the drain's deadline)."""


def requested(world: int) -> int:
    """0, or the strongest notice any worker got (SIGNAL over DRAIN): every worker calls this after each step and
    they act together (a CPU all-reduce, no GPU sync)."""
    notice = SIGNAL if _NOTICE.is_set() else 0
    due = _IN_TRAIN[0] and time.monotonic() - _POLLED[0] >= _EVERY[0]
    if world > 1:
        tensor = torch.tensor([notice, int(due)], dtype=torch.int32)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_GROUP[0])
        notice, due = int(tensor[0].item()), bool(tensor[1].item())
    if due:  # every worker at once (the all-reduce agreed): Ray's call is a barrier over them
        import ray.train

        _POLLED[0] = time.monotonic()
        _DRAINING[0] = ray.train.get_preemption_info() is not None
    return notice or (DRAIN if _DRAINING[0] else 0)


def wait_for_controller(timeout_s: float = 60.0) -> None:
    """Until Ray Train's controller has processed every report of this worker (the preemption checkpoint among
    them), so the restart starts from it; at most `timeout_s`. Nothing to wait for outside Ray Train."""
    if not _IN_TRAIN[0]:
        return
    import ray.train

    ray.train.get_all_reported_checkpoints(consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED,
                                           timeout_s=timeout_s)
