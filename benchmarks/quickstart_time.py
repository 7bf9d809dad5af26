"""A sweep's time in its record and the docs: the driver's last line read into seconds, and the lines written from
them: the README's on the quickstart (benchmarks/quickstart_record.py writes its record; tests/test_readme.py holds
the line to the latest record) and docs/study.md's on the paper miniature (benchmarks/sweep_record.py;
tests/test_docs.py). Light on purpose: the tests import it without the results stack."""

from __future__ import annotations

import re

TIME_LINE = re.compile(r"^time: (\S+) in all: (.*)$", re.M)
"""The driver's last line (raybiphase.telemetry.clock.Clock.summary): `time: 5m55s in all: pretraining 2m38s (...),
fine-tuning 5m45s (...)`."""


def seconds(text: str) -> int:
    """'5m55s' or '42s' (raybiphase.telemetry.clock.duration) as seconds."""
    minutes, _, rest = text.rpartition("m")
    return int(minutes or 0) * 60 + int(rest.rstrip("s"))


PLAN_LINE = re.compile(r"^sweep (\S+): (\d+) runs, (\d+) segments$", re.M)
"""The driver's first line of the plan (raybiphase.planning.plan): `sweep paper_mini: 39 runs, 55 segments`."""
PEAK_LINE = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
"""GNU time's (`/usr/bin/time -v`) line on the driver process's peak memory."""


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


def _stages(took: dict) -> str:
    """A record's stages as the docs' lines give them: `pretraining 25m49s, fine-tuning 62m27s`."""
    return ", ".join(f"{name} {minutes(value)}" for name, value in took["stages_s"].items())


def time_line(rec: dict) -> str:
    """The README's line on the quickstart's time, from the record's `time`, `machine` and `trials`."""
    took = rec.get("time", "not measured")
    if not isinstance(took, dict):
        return (f"Its time is not in the record (`time`: {took}), so this page quotes none; the driver's last "
                "line says where a run's time went.")
    shared = rec["machine"].get("shared", "unknown")
    beside = {"nothing": "nothing else running", "unknown": "what else ran not recorded"}.get(
        shared, f"beside other work ({shared})")
    stages = _stages(took)
    return (f"On {rec['machine']['cores']} cores, {beside}, it took {minutes(took['total_s'])}: its last line read "
            f"`{took['line']}`, of which {stages} (fine-tuning runs beside pretraining).")


def plan(log: str) -> dict:
    """The sweep's name, runs and segments as the driver's plan line gave them, and the driver's peak memory in GB
    where the log holds GNU time's report (None otherwise)."""
    found = PLAN_LINE.search(log)
    if not found:
        raise SystemExit("the log has no `sweep NAME: N runs, M segments` line: pass the driver's whole output")
    peak = PEAK_LINE.search(log)
    return {"sweep": found[1], "runs": int(found[2]), "segments": int(found[3]),
            "driver_peak_gb": round(int(peak[1]) / 1e6, 2) if peak else None}


def sweep_time_line(rec: dict) -> str:
    """docs/study.md's line on a whole sweep's time, from a sweep_record.py record."""
    took, shared = rec["time"], rec["machine"].get("shared", "unknown")
    beside = {"nothing": "with nothing else running", "unknown": "what else ran not recorded"}.get(
        shared, f"beside other work ({shared})")
    stages = _stages(took)
    peak = f"; the driver's peak memory {rec['driver_peak_gb']:.1f} GB" if rec.get("driver_peak_gb") else ""
    return (f"In full, `{rec['command']}` took {minutes(took['total_s'])} on {rec['machine']['cores']} cores, "
            f"{beside}, in one invocation at {rec['code']} ({rec['runs']} runs in {rec['segments']} segments, "
            f"{rec['trials']:,} fine-tuning trials; its stages: {stages}, fine-tuning running beside "
            f"pretraining{peak}).")
