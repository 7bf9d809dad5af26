"""How the sweep says a failure: the one line a failed try or segment is said in, and the error the sweep ends
with. What a try is and when the sweep stops is the one failure policy (raybiphase.failures.FailurePolicy); the
scheduler (raybiphase.sweep.scheduler) applies it."""

from __future__ import annotations

import re
from collections.abc import Callable

from raybiphase.errors import UserError
from raybiphase.failures import FailurePolicy

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
