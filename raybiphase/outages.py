"""Waiting out an unreachable bucket: how long (a sweep's `sweep.storage_outage_s`, carried to every process of
the sweep in an environment variable), what is said meanwhile, and the error once the wait is over.

raybiphase.storage's `retrying` does the waiting; this module keeps the state one process shares across its
threads, so that one outage is said once a minute however many calls wait on it, and, within a sweep on a bucket,
the state its processes share (`OutageBoard`): a worker Ray Train restarts after an outage it gave up on counts
from the outage's start, not its own, so the sweep waits one `sweep.storage_outage_s` in all, not one per restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator

from raybiphase.errors import UserError, env_number

OUTAGE_ENV = "RAYBIPHASE_STORAGE_OUTAGE_S"
"""Set by a sweep from sweep.storage_outage_s (`outage_budget`) for its own process and, forwarded by
raybiphase.raycluster, for every Ray worker: the retry budget there, named as that setting in what is said."""
NOTICE_ENV = "RAYBIPHASE_STORAGE_NOTICE_S"
"""Seconds between the lines saying an outage is still being waited out (default 60; tests shorten it)."""
BOARD = "raybiphase-outages"
"""The name of the sweep's OutageBoard actor (in the driver's job: each invocation of a sweep has its own)."""
GAP_S = 300.0
"""A bucket failing again within this many seconds of the last failure any process of the sweep reported is the
same outage (a worker Ray Train restarts takes seconds to minutes to reach storage again); later, a new one."""
log = logging.getLogger("raybiphase.storage")


class StorageOutage(UserError, OSError):
    """A bucket still unreachable once the retry budget is spent: one line naming the location and the setting
    that bounds the wait. Still an OSError for the callers that handle a failed storage call; never retried again
    by an enclosing `retrying`."""


@contextlib.contextmanager
def outage_budget(seconds: float) -> Iterator[None]:
    """Within it, bucket operations of this process, and of every Ray worker started meanwhile (the variable is
    forwarded with the driver's environment), wait out an unreachable bucket for up to `seconds`."""
    saved = os.environ.get(OUTAGE_ENV)
    os.environ[OUTAGE_ENV] = f"{seconds:g}"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(OUTAGE_ENV, None)
        else:
            os.environ[OUTAGE_ENV] = saved


def minutes(seconds: float) -> str:
    """A wait for a line: seconds under a minute and a half, else minutes and seconds (`2 min 24 s`, `15 min`)."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    whole, rest = divmod(round(seconds), 60)
    return f"{whole} min" + (f" {rest} s" if rest else "")


class OutageBoard:
    """Each bucket's outage as the sweep's processes report it, by wall clock: when it began and when a process
    last found the bucket unreachable. A Ray actor the driver starts (`share`); a process reports each failure and,
    at its first, learns when the outage began."""

    def __init__(self):
        self.outages: dict[str, tuple[float, float]] = {}  # bucket -> (began, last failure reported)

    def failed(self, bucket: str, now: float, gap_s: float = GAP_S) -> float:
        """A process found `bucket` unreachable at `now`: when its outage began (now, unless a failure was reported
        within `gap_s`)."""
        began, seen = self.outages.get(bucket, (now, now))
        if now - seen > gap_s:
            began = now
        self.outages[bucket] = (min(began, now), max(seen, now))
        return self.outages[bucket][0]

    def reached(self, bucket: str) -> None:
        """A process reached `bucket` after finding it unreachable: its outage is over."""
        self.outages.pop(bucket, None)


_SHARED: list = [None]
"""The board `share` started: Ray ends an actor, named or not, once no handle to it is left."""


def share(ready_s: float = 60.0) -> None:
    """Start the job's OutageBoard (Ray must be up; within `sharing`, which ends it): from then on every process
    of this job counts a bucket's outage from its start as the first of them saw it. On the driver's node,
    restarted if it is lost (it then forgets: each process counts from its own start again, as without it).
    Returns once the board answers (at most `ready_s`): a process's first failure asks it when the outage began,
    and that question must not wait out the actor's own start-up, which the caller would count as outage."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    _SHARED[0] = ray.remote(num_cpus=0, max_restarts=-1)(OutageBoard).options(
        name=BOARD, get_if_exists=True, scheduling_strategy=here).remote()
    with contextlib.suppress(Exception):  # a board slow to start is one not asked yet, not an error
        ray.get(_SHARED[0].__ray_ready__.remote(), timeout=ready_s)


@contextlib.contextmanager
def sharing() -> Iterator[None]:
    """Within it a sweep may `share` its outages; the board ends with it (a sweep run inside a longer-lived
    process, a notebook or a test, leaves no outage behind for the next one)."""
    try:
        yield
    finally:
        actor, _SHARED[0] = _SHARED[0], None
        if actor is not None:
            import ray

            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)


class SharedBoard:
    """This process's view of the job's OutageBoard actor: the first failure of an outage asks when it began (at
    most 10 s), later ones are reported without waiting. A board that does not answer counts as none."""

    def __init__(self, actor):
        self.actor = actor

    def began(self, bucket: str, now: float) -> float:
        import ray

        return ray.get(self.actor.failed.remote(bucket, now), timeout=10)

    def report(self, bucket: str, now: float) -> None:
        self.actor.failed.remote(bucket, now)

    def reached(self, bucket: str) -> None:
        self.actor.reached.remote(bucket)


def _board() -> SharedBoard | None:
    """The job's OutageBoard, or None (no Ray, no board: a command other than a sweep, a sweep on local paths)."""
    import sys

    if "ray" not in sys.modules:  # a process that never imported Ray has no board to find
        return None
    import ray

    if not ray.is_initialized():
        return None
    try:
        return SharedBoard(ray.get_actor(BOARD))
    except ValueError:
        return None


class Outages:
    """The buckets this process finds unreachable, each with the time its outage began: however many calls (and
    threads) wait on one bucket, it is said once as it starts, once every RAYBIPHASE_STORAGE_NOTICE_S while it
    lasts and once when the bucket answers again; and every call's wait counts from the outage's start, the
    earliest any process of the sweep reported (`OutageBoard`) where there is a board."""

    def __init__(self):
        self.lock = threading.Lock()
        self.began: dict[str, float] = {}
        self.said: dict[str, float] = {}
        self.board = _board  # how this process finds the board (tests give one of their own)

    def failed(self, bucket: str, call: str, location: str, err: OSError, budget: float, setting: str) -> float:
        """Record a transient failure of `call` on `location`; the monotonic time the bucket's outage began."""
        now = time.monotonic()
        with self.lock:
            board = self.board()
            if bucket not in self.began:
                self.began[bucket] = self.said[bucket] = now - self._age(board, bucket)
                before = f"unreachable for {minutes(now - self.began[bucket])} already, " if \
                    now - self.began[bucket] >= 1 else ""
                log.warning("storage: %s on %s failed (%s); %sretrying for up to %s (%s)", call, location,
                            " ".join(str(err).split())[:200], before, minutes(budget), setting)
            else:
                self._report(board, bucket)
                if now - self.said[bucket] >= env_number(NOTICE_ENV, 60.0, minimum=0.1):
                    self.said[bucket] = now
                    log.warning("storage: %s unreachable for %s, waiting up to %s (%s)", bucket,
                                minutes(now - self.began[bucket]), minutes(budget), setting)
            return self.began[bucket]

    def reached(self, bucket: str) -> None:
        """A call on `bucket` went through: its outage, if any, is over."""
        if bucket not in self.began:  # the common case, without the lock
            return
        with self.lock:
            began = self.began.pop(bucket, None)
            self.said.pop(bucket, None)
        if began is not None:
            log.warning("storage: %s reachable again after %s", bucket, minutes(time.monotonic() - began))
            board = self.board()
            if board is not None:
                with contextlib.suppress(Exception):
                    board.reached(bucket)

    @staticmethod
    def _age(board, bucket: str) -> float:
        """Seconds since the sweep's processes first found `bucket` unreachable in this outage (0: this process is
        the first, or there is no board to ask, or it does not answer)."""
        if board is None:
            return 0.0
        now = time.time()
        try:
            return max(0.0, now - board.began(bucket, now))
        except Exception:
            return 0.0

    @staticmethod
    def _report(board, bucket: str) -> None:
        """Tell the board the bucket is still unreachable (not waited on)."""
        if board is not None:
            with contextlib.suppress(Exception):
                board.report(bucket, time.time())


OUTAGES = Outages()
