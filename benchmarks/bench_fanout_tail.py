"""Two checkpoints' fine-tuning, one batch after the other (the sweep before issue 29's last point) against the
second batch starting on the slots the first one's tail leaves idle (raybiphase.sweep.finetuning today).

Two fan-outs of the same grid (tweets; LRs x seeds; ASHA with its completion pass) on two checkpoints, on one
local Ray (2 CPUs, 2 trial slots, one CPU per trial), measured twice in this run:

* one after the other: the second fan-out starts when the first has returned, its completion pass included;
* beside: both on shared trial slots (raybiphase.finetune.scheduling.TrialSlots), the second started as the
  sweep's stream starts a batch: once the first has no trial left to start and a slot is free.

Printed: the wall time of each and their ratio, the trial slots' occupancy (trial seconds / (slots x wall)), and
whether the two schedules gave every trial finished under both the same validation and test scores (trials are
deterministic given their seed; ASHA may stop a different trial when reports arrive in another order).

    python benchmarks/bench_fanout_tail.py [--out benchmarks/results/fanout-tail-DATE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
from benchmarks.bench_asha import tiny_checkpoint  # noqa: E402
from raybiphase.config import SweepSpec, from_dict  # noqa: E402
from raybiphase.finetune.fanout import Fanout, run_fanout  # noqa: E402
from raybiphase.finetune.scheduling import TrialSlots  # noqa: E402
from raybiphase.results.rows import FinetuneSource, trial_key  # noqa: E402
from raybiphase.telemetry.provenance import code_version  # noqa: E402

SLOTS = 2


def one_after_the_other(fanouts, cfg: Fanout, storage: str) -> list[dict]:
    rows = []
    for name, sources in fanouts:
        rows += run_fanout(sources, cfg, storage=storage, name=name)
    return rows


def beside(fanouts, cfg: Fanout, storage: str) -> list[dict]:
    """Each fan-out in a thread on shared slots, ranked in order; the next starts as the sweep's stream starts a
    batch: when every earlier one has made its claim and no trial is waiting for a free slot."""
    slots = TrialSlots(lambda: cfg.max_concurrent)
    rows, threads = [], []

    def run(priority: int, name: str, sources) -> None:
        rows.extend(run_fanout(sources, dataclasses.replace(cfg, slots=slots, priority=priority), storage=storage,
                               name=name))

    for priority, (name, sources) in enumerate(fanouts, start=1):
        while not slots.room_for_another(threads):
            time.sleep(0.2)
        threads.append(threading.Thread(target=run, args=(priority, name, sources)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-4, 1e-3, 5e-3])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--max-examples", type=int, default=480, help="training examples (steps past them repeat)")
    parser.add_argument("--asha", action=argparse.BooleanOptionalAction, default=True,
                        help="ASHA and its completion pass (off: the full grid, no completion pass)")
    parser.add_argument("--out", help="write the record (JSON) here")
    args = parser.parse_args()

    from raybiphase.raycluster import ensure_ray

    ensure_ray(num_cpus=2)
    work = Path(tempfile.mkdtemp(prefix="bench_fanout_tail_"))
    hf = str(tiny_checkpoint(work / "hf"))
    fanouts = [(f"ckpt-{c}", [FinetuneSource(f"ckpt-{c}", 0, hf)]) for c in "ab"]  # one folder, two checkpoints' keys
    spec = from_dict(SweepSpec, {"finetune": {"tasks": ["tweets"], "lrs": args.lrs, "seeds": args.seeds,
                                              "batch_size": 16, "max_steps": args.max_steps,
                                              "eval_every": args.eval_every, "max_examples": args.max_examples,
                                              "asha": args.asha},
                                 "resources": {"max_concurrent": SLOTS}})
    cfg = Fanout.of(spec)
    run_fanout(fanouts[0][1], cfg, storage=str(work / "warm-up"), name="warm-up")  # imports, caches: not timed
    measured = {}
    for mode, schedule in (("one_after_the_other", one_after_the_other), ("beside", beside)):
        began = time.perf_counter()
        rows = schedule(fanouts, cfg, str(work / mode))
        wall = time.perf_counter() - began
        measured[mode] = {"wall_s": round(wall, 1), "trials": len(rows),
                          "occupancy": round(sum(r["seconds"] for r in rows) / (SLOTS * wall), 3),
                          "rows": {trial_key(r): r for r in rows}}
        print(f"{mode:20s}: {wall:6.1f} s, {len(rows)} rows, slot occupancy {measured[mode]['occupancy']:.0%}")
    ratio = measured["beside"]["wall_s"] / measured["one_after_the_other"]["wall_s"]
    print(f"beside / one after the other: {ratio:.3f} of the wall time")
    first, second = (measured[m]["rows"] for m in ("one_after_the_other", "beside"))
    both = [k for k in first if k in second and not first[k]["stopped_early"] and not second[k]["stopped_early"]]
    same = sum(first[k]["val_score"] == second[k]["val_score"] and first[k]["test_score"] == second[k]["test_score"]
               for k in both)
    print(f"finished under both with the same validation and test scores: {same}/{len(both)}")
    if args.out:
        record = {"benchmark": "bench_fanout_tail", "date": datetime.date.today().isoformat(),
                  "command": " ".join(["python", "benchmarks/bench_fanout_tail.py", *sys.argv[1:]]),
                  "code": code_version(), "machine": {"cpu": platform.processor() or platform.machine(),
                                                   "ray_cpus": 2, "slots": SLOTS},
                  "grid": {"checkpoints": 2, "tasks": ["tweets"], "lrs": args.lrs, "seeds": args.seeds,
                           "max_steps": args.max_steps, "eval_every": args.eval_every,
                           "max_examples": args.max_examples, "asha": args.asha},
                  **{mode: {k: v for k, v in m.items() if k != "rows"} for mode, m in measured.items()},
                  "wall_ratio": round(ratio, 3), "same_scores": [same, len(both)],
                  "headline": f"wall time beside / one after the other: {round(ratio, 3)}"}  # docs/benchmarks.md
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.out}")


if __name__ == "__main__":
    main()
