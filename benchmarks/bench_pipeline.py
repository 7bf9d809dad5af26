"""Throughput of the data pipeline on this machine: `prepare`'s tokenization and the stream a Train worker reads.

Both parts use a real prepared dataset: `raybiphase.data.prepare.prepare(DataConfig(...))` on the offline corpus
(default: 4,000 documents, a 4,096-token byte-level BPE, 512-token blocks, 1,024-row shards; made once into the
raybiphase cache, reused afterwards), on the local Ray that `raybiphase.raycluster.ensure_ray()` starts
(all the machine's CPUs; 2 here). Every ratio's two sides run in the same process, interleaved repeat by repeat,
and each side reports its best (shortest) of `--repeats` runs; a first, cold run is shown where it differs.

(a) Tokenization, documents/s and tokens/s (tokens = BPE ids, specials not counted):
    * Ray Data: `raybiphase.data.prepare.tokenize_on_ray(docs, tokenizer_dir)`, the call `prepare` makes: build the
      dataset from the documents, `map_batches` (2,048 documents per task, each task loads the tokenizer), collect
      and reorder. Its "cold" row is the first call in this Ray session (task workers start, import transformers).
    * Driver loop (the baseline of the ratio): the same tokenizer, loaded once with AutoTokenizer, called on the
      same 2,048-document batches in one plain Python loop in the driver, with TOKENIZERS_PARALLELISM=false
      (one thread, as Ray's tasks run it). The load of the tokenizer is inside the timing on both sides.
    * Driver loop, tokenizers' threads: the same with TOKENIZERS_PARALLELISM=true (the Rust tokenizer's own
      thread pool over the machine's cores): shown for reference, not used in the ratio.
    The outputs of the two sides are checked to be identical.

(b) The stream a Train worker sees, tokens/s (every token of every (input_ids) row delivered as a torch tensor):
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

Seen here (2 cores, quiet machine): Ray Data tokenization at 0.8-0.9x the one-thread driver loop (each task
loads the tokenizer, the rows go through the object store and are sorted back into order; the first call
also starts task workers that import transformers), while the tokenizer's own threads in the driver ran at
1.65x. The stream delivered 2-4M tokens/s to its readers, 0.1-0.26x the plain loop (Ray Data's per-batch
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

import numpy as np  # noqa: E402
import torch  # noqa: E402

from raybiphase.config import DataConfig  # noqa: E402
from raybiphase.data.masking import MaskingSpec  # noqa: E402
from raybiphase.data.prepare import dataset_dir, prepare, read_documents, tokenize_on_ray  # noqa: E402
from raybiphase.raycluster import ensure_ray  # noqa: E402
from raybiphase.data.stream import make_inputs, open_dataset, phase_stream, read_samples, worker_sample_ids  # noqa: E402

TOKENIZE_BATCH = 2048  # documents per batch: tokenize_on_ray's map_batches batch size


def quiet_ray_data_console() -> None:
    """Ray Data prints one INFO line per dataset execution in the driver; keep the console to the table."""
    import ray.data  # noqa: F401  (configures Ray Data's logging)

    for handler in logging.getLogger("ray.data").handlers:
        if not hasattr(handler, "_filename"):  # the console handler (the file handler keeps everything)
            handler.setLevel(logging.WARNING)
            handler.addFilter(lambda record: "Progress bars disabled" not in record.getMessage())


# --------------------------------------------------------------------------------------------- tokenization


def tokenize_driver(docs: list[str], tokenizer_dir: Path, parallel: bool) -> list[np.ndarray]:
    """The same tokenizer in one plain loop over the same batches, in this process."""
    from transformers import AutoTokenizer

    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"  # read by the Rust side at every call
    try:
        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        out: list[np.ndarray] = []
        for start in range(0, len(docs), TOKENIZE_BATCH):
            ids = tok(docs[start:start + TOKENIZE_BATCH], add_special_tokens=False)["input_ids"]
            out.extend(np.asarray(x, dtype=np.int32) for x in ids)
        return out
    finally:
        os.environ["TOKENIZERS_PARALLELISM"] = previous or "false"


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_tokenize(docs: list[str], tokenizer_dir: Path, repeats: int) -> tuple[float, float]:
    n_docs = len(docs)
    cold, ray_ids = timed(lambda: tokenize_on_ray(docs, tokenizer_dir))
    n_tok = int(sum(len(x) for x in ray_ids))
    best = {"ray": float("inf"), "loop": float("inf"), "loop_threads": float("inf")}
    for _ in range(repeats):  # interleaved: one of each per repeat
        seconds, out = timed(lambda: tokenize_driver(docs, tokenizer_dir, parallel=False))
        best["loop"] = min(best["loop"], seconds)
        assert len(out) == n_docs and all(np.array_equal(a, b) for a, b in zip(out, ray_ids)), "outputs differ"
        seconds, _ = timed(lambda: tokenize_on_ray(docs, tokenizer_dir))
        best["ray"] = min(best["ray"], seconds)
        seconds, _ = timed(lambda: tokenize_driver(docs, tokenizer_dir, parallel=True))
        best["loop_threads"] = min(best["loop_threads"], seconds)

    print(f"\n(a) tokenization: {n_docs:,} documents, {n_tok:,} tokens, {TOKENIZE_BATCH} documents per batch, "
          f"best of {repeats}")
    print(f"{'method':<48} {'seconds':>8} {'docs/s':>9} {'Mtok/s':>7} {'vs loop':>8}")
    rows = [("Ray Data tokenize_on_ray, cold (1st call)", cold),
            ("Ray Data tokenize_on_ray, warm", best["ray"]),
            ("driver loop, 1 thread (baseline)", best["loop"]),
            ("driver loop, tokenizers' threads (reference)", best["loop_threads"])]
    for name, seconds in rows:
        print(f"{name:<48} {seconds:>8.2f} {n_docs / seconds:>9,.0f} {n_tok / seconds / 1e6:>7.3f} "
              f"{best['loop'] / seconds:>7.2f}x")
    return n_tok / best["ray"], n_tok / best["loop"]


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
    print(f"\n(b) streaming to a Train worker: {total_rows:,} rows x {manifest.seq_len} tokens "
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
    p.add_argument("--tokenize-docs", type=int, default=8000,
                   help="documents of the offline corpus to tokenize in (a); 0 = all of it")
    p.add_argument("--rows-per-step", type=int, default=32, help="global batch in rows (split over the readers)")
    p.add_argument("--micro", type=int, default=8, help="rows per iter_torch_batches batch")
    p.add_argument("--steps", type=int, default=256, help="global batches streamed per measurement")
    p.add_argument("--mask-ratio", type=float, default=0.4)
    p.add_argument("--cpus-per-reader", type=float, default=0.45)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-tokenize", action="store_true")
    p.add_argument("--skip-stream", action="store_true")
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
    if not args.skip_tokenize:
        docs = read_documents(DataConfig(max_documents=args.tokenize_docs))
        ray_rate, loop_rate = bench_tokenize(docs, dataset_dir(data) / "tokenizer", args.repeats)
        summary.append(f"tokenize Ray/loop {ray_rate / loop_rate:.2f}x ({ray_rate / 1e6:.3f} vs "
                       f"{loop_rate / 1e6:.3f} Mtok/s)")
    if not args.skip_stream:
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
