"""The one failure policy (`FailurePolicy`): what a try is and when a job, the sweep or the `pretrain` command gives
up, for pretraining segments, fine-tuning trials and their waves, the `pretrain` command's one fit, an unreachable
bucket and a damaged checkpoint. The sweep's scheduler, the fine-tuning Tuners, Ray Train's trainer, storage's
retries and the worker's resume path ask it; `python -m raybiphase docs` writes docs/failures.md from it."""

from __future__ import annotations

import dataclasses
import re

from raybiphase.errors import UserError, env_number
from raybiphase.outages import StorageOutage

MAX_FAILURES_ENV = "RAYBIPHASE_MAX_FAILURES"
"""The `pretrain` command's restarts when `--max-failures` is not given (FailurePolicy.command_restarts)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class FailurePolicy:
    """One failure policy for every kind of work: what a try is, and when a job, the sweep or a command gives up.

    A pretraining segment's try is one Ray Train fit. Within it Ray Train restarts the worker group from the
    segment's newest committed checkpoint at most `restarts` times (FailureConfig.max_failures: a worker or a node
    lost, a worker's error); a drain's restart (a spot notice) is counted apart (`preemption_restarts`) and an
    elastic group's growth is no failure. A fit that raises for any reason (its restarts spent, a worker lost while
    its group starts, its controller lost) or that shows no sign of life for `stall_s` seconds (no step, report or
    change of the controller's state: the fit is stopped) is a failed try, said in one line: the segment is fitted
    again from its newest committed checkpoint (or its parent's), taking the slot it left, while the jobs that do not
    wait on it go on. A try that committed a newer checkpoint before failing made progress and starts the count
    again; `tries` failed tries in a row without progress fail the segment, and so does at once a final error: a
    bucket unreachable past sweep.storage_outage_s (a StorageOutage: one budget for all of the sweep's processes, so
    another try would only wait the same outage out again; found by type in Ray Train's error, each worker's
    exception and the controller's) or a stalled fit that cannot be stopped. Then no segment starts, the running
    ones end, the fine-tuning of what was ready goes on, every finished row is kept, and the sweep ends with a
    UserError naming the segment, its tries and the last error; a rerun resumes.

    A fine-tuning trial that fails runs again from its start up to `trial_retries` times (Tune's
    FailureConfig.max_failures: a node lost; same seed, same record). A wave of trials (a checkpoint's grid, then
    each completion pass) with a trial still failed after its retries fails its fine-tuning job: its rows would miss
    a trial of the grid, so none are appended. A failed job is said at once; the running jobs go on, none starts
    after it, and its error is raised once the sweep's loop ends.

    The `pretrain` command runs one fit, restarted at most `command_restarts` times (its `--max-failures`, else the
    environment variable RAYBIPHASE_MAX_FAILURES, else 2; -1: no limit); running it again resumes.

    An unreachable bucket is waited out by every storage call (raybiphase.storage's retries) for
    RAYBIPHASE_STORAGE_RETRY_S, or within a sweep sweep.storage_outage_s, counted from the outage's start across the
    sweep's processes; once spent, the StorageOutage is final (`final`): no enclosing storage retry, no segment try
    repeats it (`storage_outage_s`). A committed checkpoint whose files are not those its meta recorded (sizes and
    SHA-256) is passed over, with one line, for the committed checkpoint before it (`damaged`); a damaged parent
    checkpoint a segment was to start from fails its try, as nothing older may stand in for it. A sweep's lease that
    cannot be renewed (its bucket down past storage's retries) is tried again at its next renewal (`lease_renewals` per
    timeout)."""

    restarts: int = 2
    """Ray Train's restarts of one fit of a segment (its FailureConfig.max_failures)."""
    tries: int = 3
    """Fits of one segment in a row that may fail without committing a newer checkpoint (sweep.segment_tries)."""
    stall_s: float = 1800.0
    """Seconds a fit may show no sign of life before it is stopped as a failed try (sweep.stall_s)."""
    trial_retries: int = 2
    """Times a failed fine-tuning trial runs again from its start before it counts as failed (Tune's
    FailureConfig.max_failures)."""
    preemption_restarts: int = -1
    """Ray Train's restarts of a fit after a drained node (a spot notice; FailureConfig.max_preemption_failures;
    -1: no limit): never counted against `restarts`."""
    command_restarts: int = 2
    """Ray Train's restarts of the `pretrain` command's fit (--max-failures, else RAYBIPHASE_MAX_FAILURES; -1: no
    limit)."""
    storage_outage_s: float = 900.0
    """Seconds a sweep waits out a bucket it reached before and can no longer reach, counted from the outage's start
    across all of the sweep's processes (sweep.storage_outage_s); then the StorageOutage is final."""
    lease_renewals: int = 5
    """Renewals of a sweep's lease per sweep.lease_timeout_s; a renewal that fails (its bucket down past storage's
    retries) is tried again at the next, so the lease lapses to another driver only after this many failed in a
    row."""

    @classmethod
    def of(cls, sweep) -> FailurePolicy:
        """The policy a sweep's settings (its SweepConfig) give."""
        return cls(tries=sweep.segment_tries, stall_s=sweep.stall_s, storage_outage_s=sweep.storage_outage_s)

    @classmethod
    def for_command(cls, max_failures: int | None = None) -> FailurePolicy:
        """The `pretrain` command's policy: `max_failures` (its --max-failures) when given, else
        RAYBIPHASE_MAX_FAILURES, else the default; a UserError naming the flag or the variable for a value below
        -1 (no limit)."""
        if max_failures is None:
            return cls(command_restarts=int(env_number(MAX_FAILURES_ENV, cls().command_restarts, minimum=-1)))
        if max_failures < -1:
            raise UserError(f"--max-failures: {max_failures} is below -1 (no limit)")
        return cls(command_restarts=max_failures)

    def retry(self, error: BaseException, failed_in_a_row: int) -> bool:
        """Whether a segment whose fit failed with `error`, its `failed_in_a_row`-th failed try in a row without
        progress, is fitted again: while tries are left, never after a `final` error."""
        return failed_in_a_row < self.tries and not final(error)

    def job_fails(self, failed_trials: int) -> bool:
        """Whether a fine-tuning job whose last wave ended with `failed_trials` trials failed after their retries
        fails (its rows not appended): any failed trial fails it."""
        return failed_trials > 0

    def damaged(self, error: BaseException, *, older: bool) -> str:
        """What a worker says when a checkpoint it was to resume from is damaged (`error`): the line that passes it
        over for the committed checkpoint before it, when `older` (one of the run's own, with the older ones or
        the parent's after it); else `error` is raised, as nothing may stand in for it."""
        if not older:
            raise error
        return f"{error}; resuming from the committed checkpoint before it"


class FitStalled(RuntimeError):
    """A fit that showed no sign of life for sweep.stall_s seconds and was stopped."""


class Unstoppable(FitStalled):
    """A stalled fit with no controller to stop (one already gone, or a fit that never started one): never fitted again
    beside itself."""


def final(error: BaseException) -> bool:
    """Whether `error` ends its job at once, no try or retry repeating it: a storage outage past its budget
    (`storage_outage`) or a stalled fit that cannot be stopped."""
    return isinstance(error, Unstoppable) or storage_outage(error)


_OUTAGE_TEXT = re.compile(r"^(raybiphase\.outages\.)?StorageOutage: ", re.MULTILINE)


def storage_outage(error: BaseException) -> bool:
    """Whether `error` comes from a bucket that stayed unreachable past its outage budget: a StorageOutage, or an
    error that carries one, by type: its cause or context, Ray Train's WorkerGroupError (each worker's exception,
    `worker_failures`), ControllerError (`controller_failure`) or a Ray task's error (`cause`)."""
    seen, stack = set(), [error]
    while stack:
        err = stack.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, StorageOutage):
            return True
        carried = [getattr(err, "controller_failure", None), getattr(err, "cause", None),
                   *(getattr(err, "worker_failures", None) or {}).values()]
        if (type(err).__module__.split(".")[0] == "ray" and not any(isinstance(c, BaseException) for c in carried)
                and _OUTAGE_TEXT.search(str(err))):
            # Ray gives no exception object here (one it could not carry back or unpickle comes as its text, in a
            # RaySystemError or an error without a cause): only its traceback's text can say it
            return True
        stack += [err.__cause__, err.__context__, *(c for c in carried if isinstance(c, BaseException))]
    return False
