"""Corpus preparation streams: the driver's peak memory stays flat while a corpus several times larger goes through.

A synthetic corpus is written first as Parquet files (a `text` column, row groups of 2,000 documents): documents of
words drawn with Zipf frequencies from the vocabulary of the offline Wikipedia leads, lengths log-normal around
`--words` words. Then, in this process (the driver):

* Ray Data (measured): `raybiphase.data.prepare.prepare(DataConfig(source=<corpus>, ...))` on the local Ray that
  `raybiphase.raycluster.ensure_ray()` starts (all the machine's CPUs), a BPE of `--vocab-size` trained on the first
  `--tokenizer-documents` documents, `--seq-len`-token blocks. The driver's resident memory is sampled every 20 ms
  from /proc/self/statm for the whole call; its peak above the level before the call (imports and Ray started) and
  the absolute peak are printed.
* In-process baseline: the same `prepare` with `on_ray=False` (the same piece function, in this one process) on
  the first `--baseline-documents` documents of the corpus, for tokens/s on the same data in the same run.

It prints the corpus size, the driver's peak RSS, their ratio (corpus / peak: how many times the driver's memory the
corpus is), and tokens/s of both sides with their ratio.

    python benchmarks/bench_prepare.py [--corpus-mib 1024] [--files 16] [--words 400] [--vocab-size 8192] \
        [--seq-len 2048] [--shard-rows 1024] [--piece-documents 10000] [--baseline-documents 8000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from raybiphase.config import DataConfig  # noqa: E402
from raybiphase.data.prepare import prepare  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """Samples this process's resident memory every 20 ms while the block runs."""

    def __enter__(self):
        self.peak, self._stop = rss(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def write_corpus(folder: Path, mib: int, files: int, words: int, seed: int = 0) -> int:
    """Synthetic documents as Parquet files, one file in memory at a time; returns the text bytes written (also
    kept in corpus.json, so that measuring never reads the corpus into this process)."""
    from raybiphase.data import sources

    counts: dict[str, int] = {}
    for article in sources.wiki_articles():
        for word in article["text"].split():
            counts[word] = counts.get(word, 0) + 1
    vocab = np.array(sorted(counts, key=counts.get, reverse=True))
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()
    rng = np.random.default_rng(seed)
    per_file, written = mib * MIB // files, 0
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(files):
        docs, size = [], 0
        while size < per_file:
            n = int(np.clip(rng.lognormal(np.log(words), 0.6), 20, 20 * words))
            doc = " ".join(vocab[rng.choice(len(vocab), n, p=p)])
            docs.append(doc)
            size += len(doc)
        pq.write_table(pa.table({"text": docs}), folder / f"part-{index:04d}.parquet", row_group_size=2000)
        written += size
    (folder / "corpus.json").write_text(json.dumps({"text_bytes": written}))
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--corpus-mib", type=int, default=1024, help="text in the synthetic corpus")
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--words", type=int, default=400, help="median words per document")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--tokenizer-documents", type=int, default=20_000)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--shard-rows", type=int, default=1024)
    p.add_argument("--piece-documents", type=int, default=10_000)
    p.add_argument("--baseline-documents", type=int, default=8000, help="documents the in-process baseline prepares")
    p.add_argument("--workdir", default="", help="where the corpus and the shards go (default: a temp folder)")
    args = p.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-prepare-"))
    corpus = work / "corpus"
    t0 = time.perf_counter()
    if not (corpus / "corpus.json").is_file():  # in a child process: the driver's memory stays untouched
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(
            target=write_corpus, args=(corpus, args.corpus_mib, args.files, args.words))
        child.start()
        child.join()
        assert child.exitcode == 0, "writing the corpus failed"
    files = sorted(corpus.glob("*.parquet"))
    docs = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    print(f"# corpus: {len(files)} Parquet files, {docs:,} documents, "
          f"{sum(f.stat().st_size for f in files) / MIB:,.0f} MiB on disk, built in {time.perf_counter() - t0:.0f}s")
    text_mib = json.loads((corpus / "corpus.json").read_text())["text_bytes"] / MIB

    from raybiphase.raycluster import ensure_ray

    ensure_ray()
    settings = dict(vocab_size=args.vocab_size, tokenizer_documents=args.tokenizer_documents, seq_len=args.seq_len,
                    shard_rows=args.shard_rows, piece_documents=args.piece_documents, val_blocks=16)
    out = work / "shards"
    shutil.rmtree(out, ignore_errors=True)
    before = rss()
    t0 = time.perf_counter()
    with PeakRSS() as driver:
        prepare(DataConfig(source=str(corpus), dir=str(out), **settings), quiet=True)
    ray_s = time.perf_counter() - t0
    tokens = json.loads((out / "manifest.json").read_text())["tokens"]

    baseline_corpus = work / "baseline-corpus"
    shutil.rmtree(baseline_corpus, ignore_errors=True)
    baseline_corpus.mkdir()
    first = pq.ParquetFile(files[0])
    rows = next(first.iter_batches(batch_size=args.baseline_documents, columns=["text"]))
    pq.write_table(pa.Table.from_batches([rows]), baseline_corpus / "part-0000.parquet", row_group_size=2000)
    base_out = work / "baseline-shards"
    shutil.rmtree(base_out, ignore_errors=True)
    t0 = time.perf_counter()
    prepare(DataConfig(source=str(baseline_corpus), dir=str(base_out), **settings), quiet=True, on_ray=False)
    base_s = time.perf_counter() - t0
    base_tokens = json.loads((base_out / "manifest.json").read_text())["tokens"]

    import ray

    cpus = int(ray.cluster_resources().get("CPU", 0))
    ray_rate, base_rate = tokens / ray_s, base_tokens / base_s
    print(f"# ray {ray.__version__}, {cpus} CPUs in Ray, {os.cpu_count()} on the machine; "
          f"vocab {args.vocab_size}, {args.seq_len}-token blocks, {args.piece_documents:,} documents per window")
    print(f"corpus text: {text_mib:,.0f} MiB, {tokens:,} tokens")
    print(f"driver RSS before prepare: {before / MIB:,.0f} MiB; peak during prepare: {driver.peak / MIB:,.0f} MiB "
          f"(+{(driver.peak - before) / MIB:,.0f} MiB)")
    print(f"Ray Data prepare: {ray_s:,.0f}s, {ray_rate:,.0f} tokens/s; in-process baseline on the first "
          f"{args.baseline_documents:,} documents: {base_s:,.0f}s, {base_rate:,.0f} tokens/s")
    print(f"tokens/s ratio (Ray Data / in-process): {ray_rate / base_rate:.2f}")
    print(f"corpus / driver peak RSS: {text_mib * MIB / driver.peak:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
