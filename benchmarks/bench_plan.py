"""Planning a large grid: `make_plan` and the whole dry run (`raybiphase.planning.preflight.plan_sweep(spec,
dry_run=True)`, what `python -m raybiphase.sweep SPEC --dry-run` runs) at 100, 400 and 1,600 grid points.

The grid is sweeps/split_grid.yaml's base (610m, WSD 2k/2k, the paper's fine-tuning grid) with
    phases.steps:      N / 20 budgets, 12,000 to 42,000 steps (rounded to 100)
    phases.clm_share:  0, 0.25, 0.5, 0.75, 1
    phases.mask_ratio: 0.2, 0.3, 0.4, 0.5
so N grid points (pure CLM at four ratios is one run: N x 17 / 20 distinct runs). Each size runs in its own process:
the seconds of `make_plan` and of the whole dry run (which plans again), wall-clock and CPU (the process's own: on a
machine shared with other work the CPU seconds are the steadier figure), the process's resident memory once the
modules are loaded and its peak (ru_maxrss) after; the dry run's text is hashed, so two versions of the planner
can be shown to print the same plan. The figures are printed per size with the ratio to the first size.

    python benchmarks/bench_plan.py [--sizes 100 400 1600] [--before RECORD] [--out RECORD]

`--before` reads a record this script wrote on other code (the planner before a change) and puts its figures
beside these, with a check that every size both measured printed the same text.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without install
SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
RATIOS = (0.2, 0.3, 0.4, 0.5)


def grid(points: int) -> str:
    """The `sweep.grid` override of `points` grid points (module docstring)."""
    count = points // (len(SHARES) * len(RATIOS))
    budgets = [12_000 + round(i * 30_000 / max(count - 1, 1), -2) for i in range(count)]
    return (f"sweep.grid={{phases.steps: {[int(b) for b in budgets]}, phases.clm_share: {list(SHARES)}, "
            f"phases.mask_ratio: {list(RATIOS)}}}")


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def measure(points: int) -> dict:
    """One size, in this process: seconds of make_plan and of the dry run, RSS and peak RSS (MiB), text digest."""
    import hashlib

    from raybiphase.config import SweepSpec, load
    from raybiphase.planning.plan import make_plan
    from raybiphase.planning.preflight import plan_sweep
    from raybiphase.telemetry.console import Console

    spec = load(SweepSpec, REPO / "sweeps" / "split_grid.yaml", [grid(points)])
    before = _rss_mib()
    began, cpu = time.perf_counter(), time.process_time()
    plan = make_plan(spec)
    planned, planned_cpu = time.perf_counter() - began, time.process_time() - cpu
    text = io.StringIO()
    began, cpu = time.perf_counter(), time.process_time()
    plan_sweep(spec, dry_run=True, console=Console(text))
    dry_run, dry_run_cpu = time.perf_counter() - began, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"grid_points": points, "runs": len(plan.runs), "segments": len(plan.segments),
            "make_plan_s": round(planned, 2), "dry_run_s": round(dry_run, 2), "make_plan_cpu_s": round(planned_cpu, 2),
            "dry_run_cpu_s": round(dry_run_cpu, 2), "rss_before_mib": round(before),
            "peak_rss_mib": round(peak), "torch_loaded": "torch" in sys.modules,
            "text_sha256": hashlib.sha256(text.getvalue().encode()).hexdigest()[:16]}


def _child(points: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--measure", str(points)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode:
        raise SystemExit(f"{points} grid points failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print(label: str, sizes: list[dict]) -> None:
    first = sizes[0]
    for m in sizes:
        print(f"{label} {m['grid_points']:>5,} grid points ({m['runs']:,} runs, {m['segments']:,} segments): "
              f"make_plan {m['make_plan_s']:.2f} s, dry run {m['dry_run_s']:.2f} s "
              f"({'CPU %.2f s' % m['dry_run_cpu_s'] if 'dry_run_cpu_s' in m else 'CPU not recorded'}; "
              f"{m['dry_run_s'] / max(first['dry_run_s'], 0.01):.1f}x the first size's wall time), peak RSS "
              f"{m['peak_rss_mib']:,} MiB ({m['peak_rss_mib'] - m['rss_before_mib']:,} MiB over the loaded modules), "
              f"torch loaded: {'yes' if m['torch_loaded'] else 'no'}")


def _compare(sizes: list[dict], before: dict) -> dict:
    """Per size both records measured: the before / after ratios and whether the dry run printed the same text."""
    old = {m["grid_points"]: m for m in before["sizes"]}
    out = {}
    for m in sizes:
        if (b := old.get(m["grid_points"])) is not None:
            out[str(m["grid_points"])] = {"dry_run_time": round(b["dry_run_s"] / max(m["dry_run_s"], 0.01), 1),
                                          "dry_run_cpu": round(b["dry_run_cpu_s"] / max(m["dry_run_cpu_s"], 0.01), 1)
                                          if "dry_run_cpu_s" in b else None,
                                          "peak_rss": round(b["peak_rss_mib"] / m["peak_rss_mib"], 1),
                                          "same_text": b["text_sha256"] == m["text_sha256"]}
    if not all(c["same_text"] for c in out.values()):
        raise SystemExit(f"the dry run's text differs from the record's: {out}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 400, 1600])
    parser.add_argument("--before", type=Path, help="a record of this benchmark on other code, to compare with")
    parser.add_argument("--out", help="write the record (JSON) here")
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    from raybiphase.telemetry.provenance import code_version

    sizes = [_child(points) for points in args.sizes]
    _print("now   ", sizes)
    record = {"benchmark": "bench_plan", "date": datetime.date.today().isoformat(),
              "command": "python benchmarks/bench_plan.py " + " ".join(sys.argv[1:]), "code": code_version(),
              "machine": {"cpu": platform.machine(), "cores": len(os.sched_getaffinity(0))},
              "grid": "sweeps/split_grid.yaml base; " + grid(args.sizes[-1]), "sizes": sizes}
    last = sizes[-1]
    record["headline"] = (f"dry run of {last['grid_points']:,} grid points ({last['runs']:,} runs): "
                          f"{last['dry_run_s']:.1f} s ({last['dry_run_cpu_s']:.1f} s CPU), peak RSS "
                          f"{last['peak_rss_mib']:,} MiB")
    if args.before:
        before = json.loads(args.before.read_text())
        _print("before", before["sizes"])
        record["before"] = {"code": before["code"], "sizes": before["sizes"]}
        record["before_over_now"] = _compare(sizes, before)
        old = next((m for m in before["sizes"] if m["grid_points"] == last["grid_points"]), None)
        if old is not None:
            record["headline"] += (f"; before ({before['code']}): {old['dry_run_s']:.1f} s, peak RSS "
                                   f"{old['peak_rss_mib']:,} MiB, the same text")
        for points, ratio in record["before_over_now"].items():
            cpu = f" ({ratio['dry_run_cpu']}x the CPU time)" if ratio["dry_run_cpu"] is not None else ""
            print(f"{int(points):>5,} grid points: before / now {ratio['dry_run_time']}x the wall time{cpu}, "
                  f"{ratio['peak_rss']}x the peak memory, same dry-run text: yes")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
