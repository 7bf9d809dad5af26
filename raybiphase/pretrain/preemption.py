"""A preemption notice: spot and preemptible VMs get SIGTERM and a grace period (30 s to 2 min) before they go.

On the first SIGTERM a training worker finishes the step under way, every worker agrees (one all-reduce of a flag
per step), the segment writes a checkpoint at once and the workers raise `Preempted`; Ray Train then restarts the
group from that checkpoint (on the nodes that are left, or new ones), so a resume loses at most the step that was
under way. A second SIGTERM takes Ray's own way out (the process exits).

The loop runs in a thread of Ray Train's worker actor, and Python lets only the main thread set signal handlers:
`install` asks the worker's own actor to run the setup in its main thread (a sync actor's methods run there).
"""

from __future__ import annotations

import signal
import threading
import time

import torch
import torch.distributed as dist

_NOTICE = threading.Event()
_GROUP: list = [None]
"""The process group the flag is agreed over: a gloo group beside NCCL, so the check never waits on the GPU."""


class Preempted(RuntimeError):
    """Raised by every worker once the preemption checkpoint is written: Ray Train restarts the group from it."""


def _handle_in_main_thread() -> bool:
    previous = signal.getsignal(signal.SIGTERM)
    if getattr(previous, "raybiphase_notice", False):  # a kept worker group's next segment: set already
        return True

    def notice(signum, frame):
        if _NOTICE.is_set() and callable(previous):
            previous(signum, frame)  # a second SIGTERM: Ray's handler, the process exits
        _NOTICE.set()

    notice.raybiphase_notice = True
    signal.signal(signal.SIGTERM, notice)
    return True


def install(world: int = 1, *, keep_notice: bool = False) -> bool:
    """Route SIGTERM of this Ray Train worker to the preemption notice (every worker calls it once, before the
    first step); False outside an actor (a plain process: the handler is set directly when this is the main
    thread). A new worker starts without a notice; `keep_notice`: a kept group's next segment keeps one that came
    before it (its node is still going: its first step checkpoints and the group restarts elsewhere)."""
    if not keep_notice:
        _NOTICE.clear()
    if world > 1 and _GROUP[0] is None and dist.get_backend() != "gloo":
        _GROUP[0] = dist.new_group(backend="gloo")
    if threading.current_thread() is threading.main_thread():
        return _handle_in_main_thread()
    import ray

    try:
        actor = ray.get_runtime_context().current_actor if ray.is_initialized() else None
    except RuntimeError:  # a task, not an actor
        actor = None
    if actor is None or not hasattr(actor, "execute"):  # not a Ray Train worker
        return False
    return ray.get(actor.execute.remote(_handle_in_main_thread))


def _drain_notice() -> bool:
    """Ray's own notice: the node is draining for preemption (what Ray Train's `get_preemption_info` reads; read
    here without its per-call barrier, since `requested` agrees across workers anyway)."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        return get_train_context().preemption_context.preemption_info is not None
    except Exception:  # outside Ray Train, or another Ray: SIGTERM alone
        return False


def requested(world: int) -> bool:
    """Whether any worker got a notice (every worker calls this after each step: they stop together; a CPU
    all-reduce, no GPU sync)."""
    flag = _NOTICE.is_set() or _drain_notice()
    if world > 1:
        tensor = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_GROUP[0])
        flag = bool(tensor.item())
    return flag


def wait_for_controller(timeout_s: float = 60.0) -> None:
    """Until Ray Train's controller has collected this worker's reports (the preemption checkpoint among them), so
    the restart starts from it; at most `timeout_s`."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        queue = get_train_context().execution_context.result_queue
    except Exception:
        return
    deadline = time.monotonic() + timeout_s
    while queue.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.2)
