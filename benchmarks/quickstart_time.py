"""The quickstart's time in its record and the README: the driver's last line read into seconds, and the README's
line written from them (benchmarks/quickstart_record.py writes the record; tests/test_readme.py holds the README's
line to the latest record). Light on purpose: the tests import it without the results stack."""

from __future__ import annotations

import re

TIME_LINE = re.compile(r"^time: (\S+) in all: (.*)$", re.M)
"""The driver's last line (raybiphase.telemetry.clock.Clock.summary): `time: 5m55s in all: pretraining 2m38s (...),
fine-tuning 5m45s (...)`."""


def seconds(text: str) -> int:
    """'5m55s' or '42s' (raybiphase.telemetry.clock.duration) as seconds."""
    minutes, _, rest = text.rpartition("m")
    return int(minutes or 0) * 60 + int(rest.rstrip("s"))


def timing(log: str) -> dict:
    """The run's time from the driver's output: the whole, and each stage its last line names, in seconds (stages
    overlap: fine-tuning runs beside pretraining)."""
    found = TIME_LINE.findall(log)
    if not found:
        raise SystemExit("the log has no `time: ... in all` line: pass the quickstart driver's whole output")
    total, stages = found[-1]
    named = re.findall(r"(?:^|, )([A-Za-z][\w -]*?) (\d+m\d{2}s|\d+s)", re.sub(r"\([^)]*\)", "", stages))
    return {"total_s": seconds(total), "stages_s": {name: seconds(value) for name, value in named},
            "line": f"time: {total} in all"}


def minutes(total: int) -> str:
    return f"{total // 60}m{total % 60:02d}s" if total >= 60 else f"{total}s"


def time_line(rec: dict) -> str:
    """The README's line on the quickstart's time, from the record's `time`, `machine` and `trials`."""
    took = rec.get("time", "not measured")
    if not isinstance(took, dict):
        return (f"Its time is not in the record (`time`: {took}), so this page quotes none; the driver's last "
                "line says where a run's time went.")
    shared = rec["machine"].get("shared", "unknown")
    beside = {"nothing": "nothing else running", "unknown": "what else ran not recorded"}.get(
        shared, f"beside other work ({shared})")
    stages = ", ".join(f"{name} {minutes(value)}" for name, value in took["stages_s"].items())
    return (f"On {rec['machine']['cores']} cores, {beside}, it took {minutes(took['total_s'])}: its last line read "
            f"`{took['line']}`, of which {stages} (fine-tuning runs beside pretraining).")
