"""Ranking a retrieval corpus at the paper's scale: the bi-encoder's exact top-k over passage chunks
(`raybiphase.finetune.heads.ir.top_k`, what evaluation runs) against the full score matrix it replaced, on random
unit embeddings (the ranking's cost does not depend on what the embeddings mean).

* chunked: `top_k(queries, passages, k=10)`: QUERY_BLOCK x PASSAGE_CHUNK scores at a time, a running top 10.
* full: `(queries @ passages.T).numpy()` then `scoring.rank_by_scores` (a stable argsort of every row): the old
  path, O(queries x passages) memory (7k x 1M is 28 GB of float32 scores before the argsort's int64 indices), so it
  is measured at a shape this machine holds, beside the chunked path at that same shape.

Each measurement runs in its own process: wall time of the ranking alone, the process's resident memory just before
it (the embeddings) and its peak (ru_maxrss) after; the difference is what the ranking itself held. Both paths'
rankings are compared at the shared shape (identical, or the run fails).

    python benchmarks/bench_ir_rank.py [--queries 7000] [--passages 1000000] [--dim 768]
                                       [--old-queries 7000] [--old-passages 50000] [--out record.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without install


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def _embeddings(rows: int, dim: int, seed: int):
    import torch

    vectors = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))
    vectors /= vectors.norm(dim=1, keepdim=True)  # in place: no second copy of a 1M-row matrix
    return vectors


def measure(path: str, queries: int, passages: int, dim: int) -> dict:
    """One path at one shape, in this process: seconds, RSS before the ranking and peak RSS (MiB), top-10 digest."""
    import hashlib

    import torch

    from raybiphase.finetune import scoring
    from raybiphase.finetune.heads.ir import top_k

    q, p = _embeddings(queries, dim, 0), _embeddings(passages, dim, 1)
    before = _rss_mib()
    began = time.perf_counter()
    if path == "chunked":
        ranked = top_k(q, p, 10).tolist()
    else:
        ranked = scoring.rank_by_scores((q @ p.T).numpy(), range(passages), 10)
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"path": path, "queries": queries, "passages": passages, "dim": dim, "seconds": round(seconds, 2),
            "rss_before_mib": round(before), "peak_rss_mib": round(peak), "ranking_mib": round(peak - before),
            "torch_threads": torch.get_num_threads(),
            "top10_sha256": hashlib.sha256(json.dumps(ranked).encode()).hexdigest()[:16]}


def _child(path: str, queries: int, passages: int, dim: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--measure", path, "--queries", str(queries), "--passages",
                           str(passages), "--dim", str(dim)], capture_output=True, text=True, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"{path} {queries}x{passages} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _code() -> str:
    from raybiphase import __version__

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return f"{__version__}+{commit.stdout.strip()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=7000)
    parser.add_argument("--passages", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--old-queries", type=int, default=7000)
    parser.add_argument("--old-passages", type=int, default=50_000)
    parser.add_argument("--out", help="write the record (JSON) here")
    parser.add_argument("--measure", choices=("chunked", "full"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.queries, args.passages, args.dim)))
        return
    shared = [_child(path, args.old_queries, args.old_passages, args.dim) for path in ("full", "chunked")]
    full, chunked = shared
    if full["top10_sha256"] != chunked["top10_sha256"]:
        raise SystemExit("the chunked top 10 differs from the full matrix's")
    large = _child("chunked", args.queries, args.passages, args.dim)
    for m in (*shared, large):
        print(f"{m['path']:>7} {m['queries']:,} queries x {m['passages']:,} passages (dim {m['dim']}): "
              f"{m['seconds']:.1f} s, ranking held {m['ranking_mib']:,} MiB (peak RSS {m['peak_rss_mib']:,} MiB)")
    ratio = {"memory": round(full["ranking_mib"] / max(1, chunked["ranking_mib"]), 1),
             "time": round(full["seconds"] / chunked["seconds"], 2)}
    print(f"full / chunked at {args.old_queries:,} x {args.old_passages:,}: memory {ratio['memory']}x, "
          f"time {ratio['time']}x; same top 10: yes")
    record = {"benchmark": "bench_ir_rank", "date": datetime.date.today().isoformat(),
              "command": "python benchmarks/bench_ir_rank.py " + " ".join(sys.argv[1:]), "code": _code(),
              "machine": {"cpu": platform.machine(), "cores": len(__import__("os").sched_getaffinity(0))},
              "same_shape": {"full": full, "chunked": chunked, "full_over_chunked": ratio, "same_top10": True},
              "paper_scale": large,
              "headline": f"full matrix / chunked ranking: {ratio['memory']}x the memory, {ratio['time']}x the time"}
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
