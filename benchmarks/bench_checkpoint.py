"""What a checkpoint costs the step loop, and what that stall is worth at the paper's sizes.

Per model size it builds EuroBERT and AdamW with their state (one optimizer step), then times what the loop does
at a checkpoint step today: DCP writes every tensor to a local folder (`save_shards`), then the folder is copied to
the sweep's storage before training goes on (`transfer.upload`, what Ray Train's synchronous report does). The
baseline is that synchronous stall, save plus upload; beside it, the stall a background upload would leave (the
save alone), and their ratio.

Then, for each model size of `sweeps/paper.yaml`, the measured rates give the stall of one of its checkpoints
(12 bytes per parameter) and the dry run's arithmetic (raybiphase.config.estimates) gives the checkpoint interval
that loses least on spot capacity (Young's rule) and the share of that interval spent stalled, synchronous and in
the background. A share of a few percent or more is what would make a background upload worth its complexity.

    python benchmarks/bench_checkpoint.py [--sizes tiny mini 210m] [--to DIR_OR_URI] [--out RECORD]

`--to` is where checkpoints are uploaded (default: a temporary folder on this machine's disk, standing for a
bucket; an s3:// URI uses the bucket the AWS_* environment names). The rates are this machine's disk and network:
measure on the cluster's nodes before relying on the figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without install

import torch  # noqa: E402

from raybiphase import storage, transfer  # noqa: E402
from raybiphase.config import SweepSpec, load  # noqa: E402
from raybiphase.config.estimates import (  # noqa: E402
    LLAMA3_VOCAB,
    best_interval_hours,
    checkpoint_hours,
    mtbf_hours,
)
from raybiphase.optim import adamw  # noqa: E402
from raybiphase.pretrain import checkpoint  # noqa: E402
from raybiphase.pretrain.model import build_model  # noqa: E402
from raybiphase.planning.plan import make_plan  # noqa: E402
from raybiphase.telemetry.provenance import code_version  # noqa: E402

SPECIAL = {"bos_token": 1, "eos_token": 2, "pad_token": 0, "mask_token": 3}


def state_bytes(model, optimizer) -> int:
    tensors = [*model.parameters(), *(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))]
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(size: str, target: str) -> dict:
    """One size: the state's bytes, the seconds of the local save and of the upload to `target`."""
    model = build_model(size, vocab_size=LLAMA3_VOCAB, special_ids=SPECIAL, seed=0)
    optimizer = adamw(model, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW's moments exist, as at any checkpoint after the first step
    size_bytes = state_bytes(model, optimizer)
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        checkpoint.save_shards(Path(tmp), model, optimizer)
        saved = time.perf_counter()
        destination = storage.join(target, f"{size}-{int(time.time())}")
        transfer.upload(Path(tmp), destination)
        uploaded = time.perf_counter()
    storage.delete(destination)
    save_s, upload_s = saved - began, uploaded - saved
    return {"size": size, "gb": size_bytes / 1e9, "save_s": save_s, "upload_s": upload_s,
            "sync_stall_s": save_s + upload_s, "background_stall_s": save_s,
            "ratio_sync_over_background": (save_s + upload_s) / save_s}


def at_paper_scale(rows: list[dict]) -> list[dict]:
    """Each paper size's checkpoint stall at the measured rates, and its share of the advised interval."""
    sync_rate = sum(r["gb"] for r in rows) / sum(r["sync_stall_s"] for r in rows)
    save_rate = sum(r["gb"] for r in rows) / sum(r["background_stall_s"] for r in rows)
    spec = load(SweepSpec, REPO / "sweeps/paper.yaml")
    configs = {run.config.model.size: run.config for run in make_plan(spec).runs.values()}
    out = []
    for size, config in sorted(configs.items()):
        mtbf = mtbf_hours(config, spec.sweep)
        entry = {"size": size, "mtbf_hours": mtbf}
        for mode, rate in (("sync", sync_rate), ("background", save_rate)):
            stall = checkpoint_hours(config, dataclasses.replace(spec.sweep, checkpoint_gb_per_s=rate))
            interval = best_interval_hours(stall, mtbf)
            entry[mode] = {"gb_per_s": rate, "stall_s": stall * 3600, "interval_hours": interval,
                           "stalled_share": stall / interval}
        out.append(entry)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "mini", "210m"])
    parser.add_argument("--to", help="where checkpoints are uploaded (default: a temporary local folder)")
    parser.add_argument("--out", type=Path, help="where to write the JSON record")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as bucket:
        target = args.to or bucket
        rows = [measure(size, target) for size in args.sizes]
    for r in rows:
        print(f"{r['size']:>5}: {r['gb']:.2f} GB; save {r['save_s']:.2f} s + upload {r['upload_s']:.2f} s = stall "
              f"{r['sync_stall_s']:.2f} s today; {r['background_stall_s']:.2f} s with a background upload "
              f"({r['ratio_sync_over_background']:.2f}x)")
    paper = at_paper_scale(rows)
    for p in paper:
        s, b = p["sync"], p["background"]
        print(f"paper {p['size']:>5}: stall {s['stall_s']:.1f} s at {s['gb_per_s']:.2f} GB/s, advised interval "
              f"{s['interval_hours'] * 60:.0f} min, {100 * s['stalled_share']:.2f}% of it stalled; with a background "
              f"upload {b['stall_s']:.1f} s, {100 * b['stalled_share']:.2f}%")
    if args.out:
        worst = max(paper, key=lambda p: p["sync"]["stalled_share"])
        record = {"benchmark": "bench_checkpoint", "date": datetime.date.today().isoformat(),
                  "command": "python benchmarks/bench_checkpoint.py " + " ".join(sys.argv[1:]), "code": code_version(),
                  "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                              "load_average_1min": round(os.getloadavg()[0], 1), "torch": torch.__version__},
                  "target": "local folder" if not args.to else args.to, "sizes": rows, "paper": paper,
                  "headline": f"a checkpoint stalls the loop {100 * worst['sync']['stalled_share']:.1f}% of the advised "
                              f"interval at {worst['size']} ({100 * worst['background']['stalled_share']:.1f}% with a "
                              f"background upload); save {rows[-1]['save_s']:.1f} s + upload "
                              f"{rows[-1]['upload_s']:.1f} s at {rows[-1]['size']}"}
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
