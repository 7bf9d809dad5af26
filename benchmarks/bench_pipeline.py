"""Throughput of the data pipeline on this machine: `prepare`'s tokenization and the stream a Train worker reads.

It uses a real prepared dataset: `raybiphase.data.prepare.prepare(DataConfig(...))` on the offline corpus
(default: 4,000 documents, a 4,096-token byte-level BPE, 512-token blocks, 1,024-row shards; made once into the
raybiphase cache, reused afterwards), on the local Ray that `raybiphase.raycluster.ensure_ray()` starts
(all the machine's CPUs; 2 here). Every ratio's two sides run in the same process, interleaved repeat by repeat,
and each side reports its best (shortest) of `--repeats` runs; a first, cold run is shown where it differs.
Preparation itself (streaming, memory, tokens/s) is measured by bench_prepare.py.

The stream a Train worker sees, tokens/s (every token of every (input_ids) row delivered as a torch tensor):
    * Ray readers: 1 or 2 Ray actors with `--cpus-per-reader` CPUs each (0.45: what a Train worker holds),
      standing for the Train workers of a 1- or 2-worker run. Each builds
      `raybiphase.data.stream.phase_stream(manifest, objective=..., rank=r, world=W, ...)` and iterates
      `.iter_torch_batches(batch_size=micro, dtypes=torch.long)` to the end; the clock runs from just before the
      dataset is built until the last reader has its last batch (readers start together). The masking tasks
      (0.5 CPU each) share the machine with the readers, as they do with Train workers.
    * Plain loop (the baseline of the ratio): the same sample ids (`raybiphase.data.stream.worker_sample_ids` of the
      whole global batches, i.e. the union of the readers' ids), in micro-batches, through
      `raybiphase.data.stream.read_samples` and `raybiphase.data.masking.mlm_mask` (or `clm_labels`, via `make_inputs`),
      then `torch.from_numpy`, in one process. Shard reads are cached per process (`_load_blocks`) on both sides:
      the best-of-N numbers are warm on both.
    MLM at `--mask-ratio` (0.4) and CLM are measured separately.

    python benchmarks/bench_pipeline.py [--max-documents 4000] [--vocab-size 4096] [--seq-len 512] \
        [--shard-rows 1024] [--tokenize-docs 8000] [--rows-per-step 32] [--micro 8] [--steps 256] [--repeats 3]

The summary line's ratio is Ray / baseline: above 1 means Ray Data beats the single-process loop.

Seen here (2 cores, quiet machine): the stream delivered 2-4M tokens/s to its readers, 0.1-0.26x the plain loop (Ray Data's per-batch
scheduling and transfers, not the masking), still two orders of magnitude above what training consumes here
(about 10k tokens/s, bench_train.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

import torch  # noqa: E402

from raybiphase.config import DataConfig  # noqa: E402
from raybiphase.data.masking import MaskingSpec  # noqa: E402
from raybiphase.data.prepare import prepare  # noqa: E402
from raybiphase.raycluster import ensure_ray  # noqa: E402
from raybiphase.data.stream import make_inputs, open_dataset, phase_stream, read_samples, worker_sample_ids  # noqa: E402



def quiet_ray_data_console() -> None:
    """Ray Data prints one INFO line per dataset execution in the driver; keep the console to the table."""

    for handler in logging.getLogger("ray.data").handlers:
        if not hasattr(handler, "_filename"):  # the console handler (the file handler keeps everything)
            handler.setLevel(logging.WARNING)
            handler.addFilter(lambda record: "Progress bars disabled" not in record.getMessage())


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# ------------------------------------------------------------------------------------------------ streaming


def make_reader_class(cpus: float):
    import ray

    @ray.remote(num_cpus=cpus)
    class Reader:
        """Stands for a Train worker: builds its phase stream and drains it as torch batches."""

        def run(self, manifest, objective, mask, seed, steps, rows_per_step, rank, world, micro, start_at):
            from raybiphase.raycluster import quiet_data

            quiet_data()
            while time.time() < start_at:  # start together
                time.sleep(0.001)
            t0 = time.time()
            ds = phase_stream(manifest, objective=objective, mask=mask, seed=seed, first_step=0, steps=steps,
                              rows_per_step=rows_per_step, rank=rank, world=world)
            tokens = 0
            for batch in ds.iter_torch_batches(batch_size=micro, dtypes=torch.long):
                tokens += batch["input_ids"].numel()
            return t0, time.time(), tokens

    return Reader


def stream_ray(readers, manifest, objective, mask, seed, steps, rows_per_step, micro) -> tuple[float, int]:
    import ray

    start_at = time.time() + 0.2
    world = len(readers)
    out = ray.get([r.run.remote(manifest, objective, mask, seed, steps, rows_per_step, rank, world, micro, start_at)
                   for rank, r in enumerate(readers)])
    return max(t1 for _, t1, _ in out) - min(t0 for t0, _, _ in out), sum(n for _, _, n in out)


def stream_plain(manifest, objective, mask, seed, steps, rows_per_step, micro) -> tuple[float, int]:
    ids = worker_sample_ids(0, steps, rows_per_step, rank=0, world=1)
    t0 = time.perf_counter()
    tokens = 0
    for start in range(0, len(ids), micro):
        sample_ids = ids[start:start + micro]
        blocks = read_samples(manifest, sample_ids, seed)
        batch = make_inputs(blocks, sample_ids, objective, manifest, seed, mask)
        tensors = {k: torch.from_numpy(batch[k]) for k in ("input_ids", "labels")}
        tokens += tensors["input_ids"].numel()
    return time.perf_counter() - t0, tokens


def bench_stream(manifest, args) -> dict[str, tuple[float, float]]:
    import ray

    Reader = make_reader_class(args.cpus_per_reader)
    actors = [Reader.remote() for _ in range(2)]
    ray.get([a.__ray_ready__.remote() for a in actors])
    cases = [("mlm", MaskingSpec(mask_ratio=args.mask_ratio)), ("clm", None)]
    kinds = ["plain", 1, 2]
    first: dict[tuple, float] = {}
    best: dict[tuple, float] = {}
    tokens: dict[tuple, int] = {}
    common = dict(seed=args.seed, steps=args.steps, rows_per_step=args.rows_per_step, micro=args.micro)
    for _ in range(args.repeats):
        for objective, mask in cases:
            for kind in kinds:
                if kind == "plain":
                    seconds, n = stream_plain(manifest, objective, mask, **common)
                else:
                    seconds, n = stream_ray(actors[:kind], manifest, objective, mask, **common)
                key = (objective, kind)
                first.setdefault(key, seconds)
                best[key] = min(best.get(key, float("inf")), seconds)
                tokens[key] = n
    for a in actors:
        ray.kill(a)

    total_rows = args.steps * args.rows_per_step
    print(f"\nstreaming to a Train worker: {total_rows:,} rows x {manifest.seq_len} tokens "
          f"({args.steps} steps x {args.rows_per_step} rows), micro-batch {args.micro}, "
          f"{args.cpus_per_reader} CPU per Ray reader, best of {args.repeats}")
    print(f"{'objective':<10} {'method':<46} {'1st s':>7} {'best s':>7} {'Mtok/s':>7} {'vs plain':>9}")
    rates: dict[str, tuple[float, float]] = {}
    for objective, mask in cases:
        label = f"mlm {mask.mask_ratio:.0%}" if mask else "clm"
        base = tokens[objective, "plain"] / best[objective, "plain"]
        for kind in kinds:
            key = (objective, kind)
            assert tokens[key] == total_rows * manifest.seq_len, f"{key}: {tokens[key]} tokens"
            name = ("plain loop read_samples+masking, 1 process" if kind == "plain"
                    else f"Ray phase_stream.iter_torch_batches, {kind} reader{'s' if kind > 1 else ''}")
            rate = tokens[key] / best[key]
            print(f"{label:<10} {name:<46} {first[key]:>7.2f} {best[key]:>7.2f} {rate / 1e6:>7.3f} {rate / base:>8.3f}x")
        rates[objective] = (tokens[objective, 2] / best[objective, 2], base)
    return rates


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--max-documents", type=int, default=4000, help="documents of the prepared dataset")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--shard-rows", type=int, default=1024)
    p.add_argument("--data-dir", default="", help="where the shards go; empty: the raybiphase cache")
    p.add_argument("--rows-per-step", type=int, default=32, help="global batch in rows (split over the readers)")
    p.add_argument("--micro", type=int, default=8, help="rows per iter_torch_batches batch")
    p.add_argument("--steps", type=int, default=256, help="global batches streamed per measurement")
    p.add_argument("--mask-ratio", type=float, default=0.4)
    p.add_argument("--cpus-per-reader", type=float, default=0.45)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if args.rows_per_step % 2 or (args.rows_per_step // 2) % args.micro:
        p.error("--rows-per-step must split into 2 readers of whole micro-batches")

    started, load0 = time.perf_counter(), load_average()
    t0 = time.perf_counter()
    ensure_ray()
    quiet_ray_data_console()
    import ray

    ray_s = time.perf_counter() - t0
    data = DataConfig(max_documents=args.max_documents, vocab_size=args.vocab_size, seq_len=args.seq_len,
                      shard_rows=args.shard_rows, dir=args.data_dir)
    t0 = time.perf_counter()
    path = prepare(data, quiet=True)
    prep_s = time.perf_counter() - t0
    manifest = open_dataset(path, seq_len=args.seq_len)
    print(f"# ray {ray.__version__}, torch {torch.__version__}, {int(ray.cluster_resources().get('CPU', 0))} "
          f"CPUs in Ray, {os.cpu_count()} on the machine; ray.init {ray_s:.1f}s; prepare {prep_s:.1f}s "
          f"({'cached' if prep_s < 5 else 'built'}) -> {path}")
    print(f"# dataset: {manifest.train_rows:,} train blocks of {manifest.seq_len} tokens in "
          f"{len(manifest.shard_files)} shards, vocab {manifest.vocab_size}")

    summary = []
    rates = bench_stream(manifest, args)
    for objective in ("mlm", "clm"):
        ray_rate, plain_rate = rates[objective]
        summary.append(f"{objective} stream 2 readers/plain {ray_rate / plain_rate:.3f}x "
                       f"({ray_rate / 1e6:.2f} vs {plain_rate / 1e6:.2f} Mtok/s)")
    print(f"\n# total {time.perf_counter() - started:.0f}s; load average (1, 5, 15 min) at start {load0}, at end "
          f"{load_average()} (other processes share these 2 cores: compare runs made under a similar load)")
    print("summary: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
