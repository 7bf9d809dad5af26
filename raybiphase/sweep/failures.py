"""The sweep's one failure policy (`FailurePolicy`): what a try of a segment is, when a segment is fitted again,
when the sweep stops, and the one line that says so. The scheduler (raybiphase.sweep.scheduler) applies it."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from raybiphase.errors import UserError
from raybiphase.outages import StorageOutage


@dataclasses.dataclass(frozen=True, kw_only=True)
class FailurePolicy:
    """The sweep's one failure policy: what a try is, and when the sweep stops.

    A segment's try is one Ray Train fit. Within it Ray Train restarts the worker group from the segment's newest
    committed checkpoint at most `restarts` times (FailureConfig.max_failures: a worker or a node lost, a worker's
    error); a drain's restart (a spot notice) and an elastic group's growth are no failure and are not counted. A
    fit that raises for any reason (its restarts spent, a worker lost while its group starts, its controller lost)
    or that shows no sign of life for `stall_s` seconds (no step, report or change of the controller's state: the
    fit is stopped) is a failed try, said in one line: the segment is fitted again from its newest committed
    checkpoint (or its parent's), taking the slot it left, while the jobs that do not wait on it go on. A try that
    committed a newer checkpoint before failing made progress and starts the count again; `tries` failed tries in
    a row without progress, a bucket unreachable past sweep.storage_outage_s (one budget for all of the sweep's
    processes: raybiphase.outages), or a stalled fit that cannot be stopped fail the segment: then no segment
    starts, the running ones end, the fine-tuning of what was ready goes on, every finished row is kept, and the
    sweep ends with a UserError naming the segment, its tries and the last error; a rerun resumes. A failed
    fine-tuning job is said at once; the running jobs go on, none starts after it, and its error is raised once
    the loop ends."""

    restarts: int = 2
    """Ray Train's restarts of one fit of a segment (its FailureConfig.max_failures)."""
    tries: int = 3
    """Fits of one segment in a row that may fail without committing a newer checkpoint (sweep.segment_tries)."""
    stall_s: float = 1800.0
    """Seconds a fit may show no sign of life before it is stopped as a failed try (sweep.stall_s)."""

    @classmethod
    def of(cls, sweep) -> FailurePolicy:
        """The policy a sweep's settings (its SweepConfig) give."""
        return cls(tries=sweep.segment_tries, stall_s=sweep.stall_s)

    def retry(self, error: BaseException, failed_in_a_row: int) -> bool:
        """Whether a segment whose fit failed with `error`, its `failed_in_a_row`-th failed try in a row without
        progress, is fitted again: while tries are left, never after a storage outage or a fit that could not be
        stopped."""
        return failed_in_a_row < self.tries and not storage_outage(error) and not isinstance(error, Unstoppable)


class FitStalled(RuntimeError):
    """A fit that showed no sign of life for sweep.stall_s seconds and was stopped."""


class Unstoppable(FitStalled):
    """A stalled fit with no controller to stop (Ray Train's local mode, or one already gone): never fitted again
    beside itself."""


def storage_outage(error: BaseException) -> bool:
    """Whether `error` comes from a bucket that stayed unreachable past its outage budget: a StorageOutage, or a
    failed fit whose text (Ray Train's error, each worker's traceback in it) ends a traceback with one."""
    return isinstance(error, StorageOutage) or re.search(r"^(raybiphase\.outages\.)?StorageOutage: ", str(error),
                                                         re.MULTILINE) is not None


STOP_GRACE_S = 60.0
"""Seconds a stopped fit has to raise before its segment fails without another try."""


def said(error: BaseException) -> str:
    """An error in one line: its first line (with the next when the first only introduces it, as Ray Train's
    "Training failed due to controller error:" does) and its last cause (Ray Train's error lists each worker's
    traceback after its first line, the exception that ended it last)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [type(error).__name__]
    head = " ".join(lines[:2]) if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    causes = [line for line in lines[1:] if re.match(r"^[\w.]*(Error|Exception|Exit)\b", line) and line not in head]
    return head + (f" {causes[-1]}" if causes else "")


def segment_failure(errors: dict[str, BaseException], order: list[str], say: Callable[[str], None],
                    tries: dict[str, int], policy: FailurePolicy) -> UserError:
    """The first failed segment (in `order`) said whole, and the one-line error raised for it: the segment, its
    tries and its last error in one line (`said`)."""
    first = next(sid for sid in order if sid in errors)
    say(f"pretraining: {first} failed:\n{str(errors[first]).strip()}")
    others = f"; {len(errors) - 1} other segment(s) failed too" if len(errors) > 1 else ""
    return UserError(f"sweep: segment {first} failed after {tries[first]} tr{'y' if tries[first] == 1 else 'ies'} "
                     f"(sweep.segment_tries: {policy.tries}), last error: {said(errors[first])}{others}; "
                     "run the sweep again to resume")
