"""Waiting out an unreachable bucket: how long (a sweep's `sweep.storage_outage_s`, carried to every process of
the sweep in an environment variable), what is said meanwhile, and the error once the wait is over.

raybiphase.storage's `retrying` does the waiting; this module keeps the state one process shares across its
threads, so that one outage is said once a minute however many calls wait on it.
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


class Outages:
    """The buckets this process finds unreachable, each with the time its outage began: however many calls (and
    threads) wait on one bucket, it is said once as it starts, once every RAYBIPHASE_STORAGE_NOTICE_S while it
    lasts and once when the bucket answers again; and every call's wait counts from the outage's start."""

    def __init__(self):
        self.lock = threading.Lock()
        self.began: dict[str, float] = {}
        self.said: dict[str, float] = {}

    def failed(self, bucket: str, call: str, location: str, err: OSError, budget: float, setting: str) -> float:
        """Record a transient failure of `call` on `location`; the monotonic time the bucket's outage began."""
        now = time.monotonic()
        with self.lock:
            if bucket not in self.began:
                self.began[bucket] = self.said[bucket] = now
                log.warning("storage: %s on %s failed (%s); retrying for up to %s (%s)", call, location,
                            " ".join(str(err).split())[:200], minutes(budget), setting)
            elif now - self.said[bucket] >= env_number(NOTICE_ENV, 60.0, minimum=0.1):
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


OUTAGES = Outages()
