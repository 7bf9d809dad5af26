"""The quickstart's figures as a record: what the README's quickstart table and held-out losses are copied from.

    python -m raybiphase.sweep sweeps/quickstart.yaml 2>&1 | tee quickstart.log
    python benchmarks/quickstart_record.py results/quickstart --log quickstart.log --shared "nothing" \\
        --out benchmarks/results/quickstart-DATE.json

Reads the sweep's own tables (summary.parquet, finetune.parquet, pretrain.parquet) and writes one JSON record: the
machine (CPU model, cores, torch's CPU kernels), the installed versions of the packages that decide its numbers
(torch, transformers, tokenizers, numpy, datasets, ray, pyarrow), the code version, each run's held-out loss at its
end, and per task and objective the test score (x 100) with its 95% interval half-width and seed count, the
control's, the baselines', how many trials diverged, the corpus' unigram entropy (the reference line of the loss
curves), the run's time as the driver's last line gave it (`--log`: its output; "not measured" without one), what
else ran on the machine meanwhile (`--shared`), and the environment's lock (benchmarks/environment.py). It prints
the README's table (a cell in bold where its interval lies above the control's), the line under it saying which
families separate from the control at this scale, and the README's line on the run's time. `tests/test_readme.py`
checks that every cell, every bold and those lines are this record's (every figure in the README comes from a run
of the code it documents).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
from importlib import metadata
from pathlib import Path

import pandas as pd

from raybiphase.storage import RUN_INFO
from raybiphase.results.aggregate import clipped
from raybiphase.results.report import enriched_summary
from raybiphase.results.store import read_rows
from raybiphase.results.tables import POINTS
from raybiphase.storage import FINETUNE_FILE, PRETRAIN_FILE, read_json

from environment import environment  # benchmarks/environment.py and quickstart_time.py, beside this script
from quickstart_time import time_line, timing

FAMILIES = {"SC": "squad_shuffle", "TC": "squad_commas", "QA": "squad_sentence", "IR": "squad_retrieval"}
COLUMNS = ("CLM→MLM", "CLM", "MLM", "untrained")
PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "datasets", "ray", "pyarrow")
"""The packages whose versions a record names: a figure is reproducible only at the versions that made it."""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_kernels() -> str:
    """The vector instructions torch's CPU kernels use here (AVX512, AVX2, ...): at the same package versions, two
    machines whose kernels differ round the update differently, and the MLM-only run's losses part after hundreds
    of steps (docs/troubleshooting.md)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def packages() -> dict[str, str]:
    """The installed version of each of PACKAGES (this process's, which should be the sweep's)."""
    return {name: metadata.version(name) for name in PACKAGES}


def cell(score: float, ci: float) -> str:
    """A table cell as the README writes it: 83.0 ± 5.1; 70.2 [21.5, 100.0] when the interval passes the metric's
    range and is clipped to it, as the report prints it (raybiphase.results.tables.mean_ci); the mean alone without
    an interval."""
    if math.isnan(score):
        return "n/a"
    if math.isnan(ci):
        return f"{score:.1f}"
    low, high = clipped(score, ci, POINTS)
    return f"{score:.1f} ± {ci:.1f}" if (low, high) == (score - ci, score + ci) else f"{score:.1f} [{low:.1f}, {high:.1f}]"


def record(results: Path) -> dict:
    summary = enriched_summary(results)
    final = summary[summary["final"] | (summary["source"] == "baseline")]
    scores = {}
    for family, task in FAMILIES.items():
        rows = final[final["task"] == task]
        scores[task] = {"family": family, "metric": str(rows["metric"].iloc[0]) if len(rows) else ""}
        for objective in COLUMNS:
            match = rows[(rows["objective"] == objective) & (rows["source"] == "raybiphase")]
            if len(match):
                row = match.iloc[0]
                scores[task][objective] = {"score": round(float(row["score"]), 2), "ci": round(float(row["ci"]), 2)
                                           if not math.isnan(row["ci"]) else None, "n_seeds": int(row["n_seeds"]),
                                           "n_diverged": int(row.get("n_diverged", 0) or 0)}
        for _, row in rows[rows["source"] == "baseline"].iterrows():
            scores[task][f"baseline {row['run']}"] = round(float(row["score"]), 2)
    pretrain = read_rows(results / PRETRAIN_FILE)
    last = pretrain.sort_values("step").groupby("run").tail(1)
    losses = {run: {k: round(float(v), 3) for k, v in row.items() if k.startswith("val/") and pd.notna(v)}
              for run, row in last.set_index("run").iterrows()}
    entropy = pd.to_numeric(pretrain.get("unigram_entropy", pd.Series(dtype=float)), errors="coerce").dropna()
    trials = read_rows(results / FINETUNE_FILE)
    return {"benchmark": "quickstart_record", "command": "python -m raybiphase.sweep sweeps/quickstart.yaml",
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "kernels": cpu_kernels()}, "packages": packages(),
            "code": (read_json(str(results / RUN_INFO)) or {}).get("code", ""),
            "trials": int((trials["source"] == "raybiphase").sum()), "held_out_loss": losses,
            "unigram_entropy": round(float(entropy.iloc[0]), 3) if len(entropy) else None, "scores": scores}


def bounds(entry: dict, objective: str) -> tuple[float, float] | None:
    """The clipped 95% interval of one objective's score on one task, None without one."""
    if objective not in entry or entry[objective]["ci"] is None:
        return None
    return clipped(entry[objective]["score"], entry[objective]["ci"], POINTS)


def above_control(entry: dict, objective: str) -> bool:
    """Whether the objective's interval lies wholly above the untrained control's (the report's test)."""
    mine, control = bounds(entry, objective), bounds(entry, "untrained")
    return mine is not None and control is not None and mine[0] > control[1]


def names(families: list[str]) -> str:
    """'SC', 'SC and TC', 'SC, TC and QA'."""
    return families[0] if len(families) == 1 else ", ".join(families[:-1]) + " and " + families[-1]


def separation(rec: dict) -> str:
    """The line under the table: which families separate from the control at this scale, which do not."""
    apart = [e["family"] for e in rec["scores"].values() if any(above_control(e, o) for o in COLUMNS[:3])]
    rest = [e["family"] for e in rec["scores"].values() if e["family"] not in apart]
    if not rest:
        return "At this scale every family separates from the control."
    if not apart:
        return f"At this scale no family separates from the control ({names(rest)})."
    return (f"At this scale {names(rest)} do not separate from the control (no pretrained model's interval lies "
            f"above the control's); {names(apart)} do.")


def table(rec: dict) -> str:
    lines = ["| family | task (metric) | CLM then MLM | CLM only | MLM only | control | baseline |",
             "|---|---|---|---|---|---|---|"]
    for task, entry in rec["scores"].items():
        cells = [cell(entry[o]["score"], math.nan if entry[o]["ci"] is None else entry[o]["ci"]) if o in entry
                 else "n/a" for o in COLUMNS]
        cells = [f"**{c}**" if above_control(entry, o) else c for c, o in zip(cells, COLUMNS)]
        baselines = ", ".join(f"{k.split(' ', 1)[1]} {v:.1f}" for k, v in entry.items() if k.startswith("baseline"))
        lines.append(f"| {entry['family']} | `{task}` ({entry['metric']}) | " + " | ".join(cells) + f" | {baselines} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="the quickstart's results folder (results/quickstart)")
    parser.add_argument("--out", type=Path, help="where to write the JSON record")
    parser.add_argument("--log", type=Path, help="the sweep driver's output, whose last line is the run's time")
    parser.add_argument("--shared", default="unknown",
                        help="what else ran on the machine during the run ('nothing' when it ran alone)")
    args = parser.parse_args()
    rec = record(args.results)
    rec["machine"]["shared"] = args.shared
    rec["time"] = timing(args.log.read_text()) if args.log else "not measured"
    rec["environment"] = environment()
    rec["headline"] = f"{rec['trials']} trials. {separation(rec)}"
    if args.out:
        args.out.write_text(json.dumps(rec, indent=2, ensure_ascii=False) + "\n")
    print(table(rec))
    print(f"\n{separation(rec)}\n\n{time_line(rec)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
