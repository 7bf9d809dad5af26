"""A whole sweep's time as a record: what docs/study.md's line on the paper miniature's time is generated from.

    /usr/bin/time -v python -m raybiphase.sweep sweeps/paper_mini.yaml > paper_mini.log 2>&1
    python benchmarks/sweep_record.py results/paper_mini --log paper_mini.log --shared nothing \\
        --command "python -m raybiphase.sweep sweeps/paper_mini.yaml" --out benchmarks/results/paper-mini-DATE.json

Reads the driver's output (its plan line, its last `time:` line and, when run under GNU time, the driver's peak
memory) and the sweep's own tables (how many fine-tuning trials ran: one row per trial of the fan-out, not the
copies given to runs that share a checkpoint), and writes one JSON record with the machine, the package versions,
the environment's lock (benchmarks/environment.py) and the code version the sweep recorded. `tests/test_docs.py`
holds docs/study.md's line to the latest record.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

from raybiphase.results import rows as result_rows
from raybiphase.results.store import read_rows
from raybiphase.storage import FINETUNE_FILE, RUN_INFO, read_json

from environment import environment  # benchmarks/environment.py, quickstart_*.py, beside this script
from quickstart_record import cpu_kernels, cpu_model, packages
from quickstart_time import minutes, plan, sweep_time_line, timing


def trials(results: Path) -> int:
    """The fine-tuning trials the sweep ran: its own rows, less the copies a shared checkpoint's runs get."""
    rows = read_rows(str(results / FINETUNE_FILE))
    ours = rows[rows["source"] == result_rows.OURS]
    if "trials_of" in ours.columns:
        ours = ours[ours["trials_of"].isna() | (ours["trials_of"] == "")]
    return len(ours)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="the sweep's results folder (results/paper_mini)")
    parser.add_argument("--log", type=Path, required=True, help="the sweep driver's whole output")
    parser.add_argument("--command", required=True, help="the command that ran the sweep, as the docs give it")
    parser.add_argument("--shared", default="unknown",
                        help="what else ran on the machine during the run ('nothing' when it ran alone)")
    parser.add_argument("--out", type=Path, help="where to write the JSON record")
    args = parser.parse_args()
    log = args.log.read_text()
    rec = {"benchmark": "sweep-time", "command": args.command, "date": datetime.date.today().isoformat(),
           "code": (read_json(str(args.results / RUN_INFO)) or {}).get("code", ""),
           "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "kernels": cpu_kernels(),
                       "shared": args.shared},
           "packages": packages(), "environment": environment(), **plan(log), "trials": trials(args.results),
           "time": timing(log)}
    rec["headline"] = (f"{rec['runs']} runs, {rec['segments']} segments, {rec['trials']:,} trials in "
                       f"{minutes(rec['time']['total_s'])}")
    if args.out:
        args.out.write_text(json.dumps(rec, indent=2, ensure_ascii=False) + "\n")
    print(sweep_time_line(rec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
