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
