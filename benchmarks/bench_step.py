"""One training micro-step at the paper's vocabulary and length: our loss vs the plain transformers forward.

Vocabulary 128,256 (Llama-3's, EuroBERT's), 2,048-token sequences, `--batch` sequences, a small EuroBERT
(`--size`, default "mini": 4 layers, hidden 128) so that it runs on a CPU; `--cuda` uses the GPU and `--size 610m`
the paper's shape. For each objective (MLM with 40% of the tokens masked, CLM) and each side, in a fresh process:

* ours: `raybiphase.pretrain.model.loss_terms` (the encoder, the LM head on the labelled rows only, chunked
  cross-entropy without a full fp32 logits tensor), then backward;
* baseline: `model(input_ids).logits` (the full batch x sequence x vocabulary logits) and
  `raybiphase.pretrain.model.token_loss` (fp32 cross-entropy over the labelled positions), then backward.

Each measures one warm-up step, then the step: its time and the peak memory above the level before it (on CPU the
process's resident memory sampled every 5 ms; on CUDA torch.cuda.max_memory_allocated). The losses of the two sides
are printed and must agree. The last two lines are the ratios.

    python benchmarks/bench_step.py [--size mini] [--batch 2] [--chunk-rows 1024] [--cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

VOCAB, SEQ = 128_256, 2048
SPECIALS = {"bos_token": 128000, "eos_token": 128001, "pad_token": 128001, "mask_token": 128002}
MIB = 1 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(side: str, objective: str, size: str, batch: int, chunk_rows: int, cuda: bool) -> dict:
    """One case, in this process: a warm-up step, then the measured one."""
    import numpy as np
    import torch

    from raybiphase.data.masking import MaskingSpec, clm_labels, mlm_mask
    from raybiphase.pretrain.model import build_model, loss_terms, token_loss

    torch.set_num_threads(os.cpu_count() or 1)
    device = torch.device("cuda" if cuda else "cpu")
    model = build_model(size, vocab_size=VOCAB, special_ids=SPECIALS, seed=0).to(device).train()
    x = np.random.default_rng(0).integers(0, 128000, (batch, SEQ))
    if objective == "clm":
        inputs, labels = clm_labels(x)
    else:
        inputs, labels = mlm_mask(x, np.arange(batch), seed=0, spec=MaskingSpec(mask_ratio=0.4), mask_token_id=128002,
                                  vocab_size=VOCAB, special_ids=list(SPECIALS.values()))
    b = {"input_ids": torch.as_tensor(inputs, device=device), "labels": torch.as_tensor(labels, device=device)}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

    def step() -> float:
        model.zero_grad(set_to_none=True)
        with autocast:
            if side == "ours":
                total, tokens = loss_terms(model, b, objective, chunk_rows)
                loss = total / tokens
            else:
                logits = model(input_ids=b["input_ids"], is_causal=objective == "clm").logits
                loss = token_loss(logits, b["labels"])
        loss.backward()
        return float(loss)

    step()  # warm-up: allocator pools, kernels
    model.zero_grad(set_to_none=True)
    peak, stop = [_rss()], threading.Event()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss()

        def sample():
            while not stop.wait(0.005):
                peak.append(_rss())

        threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    loss = step()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    stop.set()
    used = (torch.cuda.max_memory_allocated() if cuda else max(peak + [_rss()])) - before
    return {"side": side, "objective": objective, "seconds": seconds, "peak_mib": used / MIB, "loss": loss,
            "labelled": int((b["labels"] != -100).sum())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--size", default="mini")
    p.add_argument("--batch", type=int, default=2, help="sequences of 2,048 tokens per micro-step")
    p.add_argument("--chunk-rows", type=int, default=1024, help="rows per chunk of the head's cross-entropy (ours)")
    p.add_argument("--cuda", action="store_true")
    p.add_argument("--case", help=argparse.SUPPRESS)  # side,objective: run one case here, print JSON
    args = p.parse_args(argv)
    if args.case:
        side, objective = args.case.split(",")
        print(json.dumps(measure(side, objective, args.size, args.batch, args.chunk_rows, args.cuda)))
        return 0

    import torch

    print(f"# torch {torch.__version__}, {'CUDA ' + torch.cuda.get_device_name() if args.cuda else 'CPU'}, "
          f"{os.cpu_count()} cores; EuroBERT {args.size}, vocabulary {VOCAB:,}, {args.batch} x {SEQ} tokens")
    results = {}
    for objective in ("mlm", "clm"):
        for side in ("ours", "full logits"):
            cmd = [sys.executable, __file__, "--case", f"{'ours' if side == 'ours' else 'full'},{objective}",
                   "--size", args.size, "--batch", str(args.batch), "--chunk-rows", str(args.chunk_rows)]
            out = subprocess.run(cmd + (["--cuda"] if args.cuda else []), capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[objective, side] = r
            print(f"{objective:<4} {side:<12} {r['seconds']:>7.2f} s  peak +{r['peak_mib']:>8,.0f} MiB  "
                  f"loss {r['loss']:.5f}  ({r['labelled']:,} labelled tokens)")
        a, b = results[objective, "ours"], results[objective, "full logits"]
        assert abs(a["loss"] - b["loss"]) < 1e-3 * max(1.0, abs(b["loss"])), "the two sides disagree"
        print(f"{objective:<4} time ratio (ours / full logits): {a['seconds'] / b['seconds']:.2f}")
    for objective, name in (("mlm", "MLM"), ("clm", "CLM")):
        ratio = results[objective, "ours"]["peak_mib"] / results[objective, "full logits"]["peak_mib"]
        print(f"peak memory ratio (ours / full logits), {name}: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
