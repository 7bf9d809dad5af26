"""What a sweep segment's start costs: one Ray Train fit per segment (what the sweep does) against the same segments
run one after another by one worker group.

One run (the tiny EuroBERT, CLM then MLM, the test suite's small offline dataset: 2,000 documents, 2,048-token BPE,
64-token blocks) is cut into `--segments` segments of `--steps` steps each, the way the sweep cuts a run at its
branch points: each segment is a `SegmentJob` with its own `stop_at` that continues the previous segment's
committed checkpoint (`raybiphase.pretrain.loop.restore`), on the local Ray that `raybiphase.raycluster.ensure_ray`
starts.

    per fit    each segment is its own `TorchTrainer.fit()` (`raybiphase.pretrain.trainer.make_trainer`): a Train
               controller, a placement group, worker actors, their process group, the import of the training
               loop, then the segment's steps and checkpoints, then teardown. The sweep's way.
    one group  one `fit()` whose train function runs the same jobs in turn in the same workers (a fresh
               `Worker` per segment: model build, restore from the checkpoint before it, a new data stream).

Both sides write the same checkpoints into the same kind of run folder and must end with the same weights, bit for
bit (checked). Printed: each side's wall time, its time per segment, and the ratio; the difference per segment is
what a kept worker group would save a segment here. With `--json OUT` the figures are written as a record.

    python benchmarks/bench_segment_start.py [--segments 4] [--steps 4] [--workers 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

import ray  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from raybiphase import storage  # noqa: E402
from raybiphase.config import DataConfig, SweepSpec, from_dict  # noqa: E402
from raybiphase.data.assets import cache_dir  # noqa: E402
from raybiphase.data.prepare import prepare  # noqa: E402
from raybiphase.pretrain.job import SegmentJob  # noqa: E402
from raybiphase.pretrain.trainer import make_trainer  # noqa: E402
from raybiphase.raycluster import ensure_ray  # noqa: E402
from raybiphase.telemetry.provenance import code_version  # noqa: E402

DATA = {"max_documents": 2000, "vocab_size": 2048, "seq_len": 64, "val_blocks": 16, "shard_rows": 256,
        "decontaminate": False}


def run_segments(loop_config: dict, *, jobs: list[SegmentJob]) -> None:
    """A worker group's train function: every job of `jobs` in turn (the first is also `loop_config`'s)."""
    from raybiphase.pretrain.loop import Worker

    for job in jobs:
        Worker(job).train()


def jobs_for(run, run_dir: str, data_dir: str, segments: int, steps: int) -> list[SegmentJob]:
    return [SegmentJob(run=run, name=Path(run_dir).name, run_dir=run_dir, data_dir=data_dir,
                       stop_at=steps * (k + 1), exports=(steps * segments,)) for k in range(segments)]


def final_weights(run_dir: str, step: int) -> dict[str, torch.Tensor]:
    return load_file(storage.join(storage.hf_dir(storage.join(run_dir, storage.checkpoint_name(step))),
                                  "model.safetensors"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="steps per segment")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    ensure_ray()
    root = Path(tempfile.mkdtemp(prefix="bench-segment-start-"))
    cache = cache_dir() / "bench-segment-data"  # prepared once, reused by later runs
    data = DataConfig(**DATA, dir=str(cache))
    data_dir = prepare(data, quiet=True)
    total = args.segments * args.steps
    spec = from_dict(SweepSpec, {
        "sweep": {"name": "bench", "storage": str(root)}, "data": {**DATA, "dir": str(cache)},
        "model": {"size": "tiny"}, "phases": {"steps": total, "clm_share": 0.5},
        "optim": {"warmup_steps": 2, "decay_steps": 2},
        "train": {"global_batch_tokens": 2048, "micro_batch_size": 8, "eval_every": args.steps,
                  "checkpoint_every": args.steps, "eval_batches": 1},
        "resources": {"num_workers": args.workers, "cpus_per_worker": 0.45}})
    run = spec.run

    sides = {}
    for side in ("per fit", "one group"):
        run_dir = str(root / side.replace(" ", "-") / "runs" / "tiny-bench")
        jobs = jobs_for(run, run_dir, data_dir, args.segments, args.steps)
        started = time.perf_counter()
        if side == "per fit":
            for job in jobs:
                make_trainer(job).fit()
        else:
            make_trainer(jobs[0], train_fn=functools.partial(run_segments, jobs=jobs)).fit()
        seconds = time.perf_counter() - started
        sides[side] = {"seconds": round(seconds, 2), "seconds_per_segment": round(seconds / args.segments, 2),
                       "run_dir": run_dir}
        print(f"{side:>9}: {seconds:6.1f} s for {args.segments} segments of {args.steps} steps "
              f"({seconds / args.segments:.1f} s a segment)", flush=True)

    a, b = (final_weights(sides[s].pop("run_dir"), total) for s in ("per fit", "one group"))
    shutil.rmtree(root, ignore_errors=True)
    identical = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ratio = sides["per fit"]["seconds"] / sides["one group"]["seconds"]
    saved = (sides["per fit"]["seconds"] - sides["one group"]["seconds"]) / args.segments
    print(f"ratio (per fit / one group): {ratio:.2f}x; a kept worker group saves {saved:.1f} s a segment here; "
          f"final weights {'identical' if identical else 'DIFFER'}")
    if args.json:
        record = {"benchmark": "bench_segment_start", "date": time.strftime("%Y-%m-%d"),
                  "command": "python benchmarks/bench_segment_start.py " + " ".join(sys.argv[1:]),
                  "code": code_version(),
                  "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "gpu": None},
                  "versions": {"python": platform.python_version(), "ray": ray.__version__,
                               "torch": torch.__version__},
                  "segments": args.segments, "steps_per_segment": args.steps, "workers": args.workers,
                  **{side.replace(" ", "_"): figures for side, figures in sides.items()},
                  "ratio": round(ratio, 2), "saved_seconds_per_segment": round(saved, 2),
                  "final_weights_identical": identical,
                  "headline": f"{args.segments} segments of {args.steps} steps, {args.workers} worker(s): one fit "
                              f"each / one worker group: {ratio:.2f}x the time; a kept group saves {saved:.1f} s a "
                              f"segment"}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
