"""The preemption notice in one process (the Ray Train test is in test_trainer.py): the first
SIGTERM only raises the flag the loop checks after each step, the second takes the handler that was there before
(Ray's: the process exits)."""

from __future__ import annotations

import os
import signal
import time

from raybiphase.pretrain import preemption


def _wait(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_first_sigterm_is_a_notice_and_the_second_exits_as_before():
    exits = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: exits.append(signum))  # stands in for Ray's
    try:
        assert preemption.install() and not preemption.requested(1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert _wait(lambda: preemption.requested(1) == preemption.SIGNAL) and exits == []  # checkpoint, stop
        os.kill(os.getpid(), signal.SIGTERM)
        assert _wait(lambda: exits == [signal.SIGTERM])  # the second one: the old handler's way out
        preemption.install()
        assert not preemption.requested(1)  # a new worker starts without a notice
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_drain_notice_is_read_as_often_as_ray_trains_watcher_refreshes_it(monkeypatch):
    """A worker reads Ray's drain notice at Ray Train's own preemption poll interval, which Ray Train forwards to
    its workers: every 5 s by default, as the variable says otherwise, and the default for a value that is no
    positive number of seconds."""
    monkeypatch.delenv(preemption.POLL_ENV, raising=False)
    assert preemption.drain_poll_s() == preemption.DEFAULT_POLL_S == 5.0
    for value, seconds in (("1", 1.0), ("0.5", 0.5), ("0", 5.0), ("-2", 5.0), ("soon", 5.0)):
        monkeypatch.setenv(preemption.POLL_ENV, value)
        assert preemption.drain_poll_s() == seconds, value
