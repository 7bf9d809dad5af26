"""Pretraining on one GPU at the paper's scale: tokens/s, MFU and peak memory of our step, the same step under Ray
Train, and a plain transformers baseline; one fine-tuning trial's examples/s.

The data has the paper's shape: a Llama-3-shaped tokenizer (128,000 byte-level BPE ids, the first ones learned
from the offline corpus, the rest unused, then 256 special ids: <|begin_of_text|> 128000, <|end_of_text|> 128001,
<|reserved_special_token_0|> 128002 as the mask token), so the embedding and the LM head have 128,256 rows, and
the offline corpus packed into 2,048-token blocks. `prepare` builds it on any machine (a CPU is enough); `run`
measures on CUDA:

(a) plain: our step in one process, as `raybiphase.pretrain.loop.train_loop` runs it on one GPU: EuroBERT in fp32
    weights under bf16 autocast, the sparse LM head with the fused/chunked cross-entropy (`loss_terms`), token
    weighting, gradient clipping, fused AdamW; the batches of the loop (`read_samples` + `make_inputs`);
(b) Ray Train: `run_pretrain` with one worker holding the GPU (`resources.gpus_per_worker=1`), CLM then MLM over
    the same batches; its steady rate comes from the loop's own reports (tokens_per_s, peak_mem_gb);
(c) baseline: `EuroBertForMaskedLM(input_ids).logits` (full logits), fp32 cross-entropy over the labelled positions,
    stock `torch.optim.AdamW`, bf16 autocast, the same batches and micro-batch (or the largest that fits, with
    more accumulation).

Micro-batch: the largest power of two (up to `--max-micro`) whose CLM step (every position labelled: the head's
largest case) fits, found per size and side by trying it. MFU = FLOPs per token (PaLM: 6 x matmul parameters with
the LM head, + 12 x layers x hidden x sequence; `raybiphase.config.sizes.flops_per_token`) x tokens/s / peak
(989 TFLOP/s dense bf16 on an H100). For MLM the sparse head computes logits for the masked 40% only, so the
formula (which counts the head for every token) credits work the step skips: the CLM figure is the strict one.

Each measurement warms up (`--warmup` steps, more with `--compile`), then times `--steps` optimizer steps with the
device synchronised at each step's end. Results: a table, and one JSON record per (size, side, objective) written to
`--json` (device, torch, transformers, size, mode, micro_batch, tokens_per_s, mfu, peak_mem_gb, date).

    python benchmarks/bench_train_gpu.py prepare .gpu/bench            # here: tokenizer + shards (CPU, ~1 min)
    python benchmarks/bench_train_gpu.py run --data .gpu/bench --sizes 210m 610m --json out.json   # on the GPU
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # less fragmentation at the largest batch
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

SEQ = 2048
LLAMA3_REGULAR, LLAMA3_SPECIAL = 128_000, 256


# ------------------------------------------------------------------------------------------------ data


def llama3_shaped_tokenizer(docs: list[str], out: Path, learned: int = 16_000) -> Path:
    """A fast tokenizer with Llama-3's id layout: `learned` BPE ids from `docs`, unused ids up to 128,000, then the
    256 special tokens (bos 128000, eos 128001, reserved_special_token_0 = 128002, ...)."""
    from tokenizers import ByteLevelBPETokenizer, Tokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=learned, min_frequency=2)
    spec = json.loads(bpe._tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(len(vocab), LLAMA3_REGULAR):
        vocab[f"<|unused_{i}|>"] = i
    tok = Tokenizer.from_str(json.dumps(spec))
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>"
                                                          for i in range(LLAMA3_SPECIAL - 2)]
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0], eos_token=specials[1])
    assert len(fast) == LLAMA3_REGULAR + LLAMA3_SPECIAL and fast.convert_tokens_to_ids(specials[2]) == 128_002
    fast.save_pretrained(str(out))
    return out


def data_config(root: Path):
    from raybiphase.config import DataConfig

    return DataConfig(tokenizer=str((root / "tokenizer").resolve()), seq_len=SEQ, shard_rows=256,
                      dir=str((root / "data").resolve()))


def cmd_prepare(args) -> int:
    from raybiphase.data.pieces import offline_documents
    from raybiphase.data.prepare import prepare
    from raybiphase.data.stream import open_dataset

    root = Path(args.out)
    llama3_shaped_tokenizer(list(offline_documents(0)), root / "tokenizer")
    manifest = open_dataset(prepare(data_config(root), on_ray=False), seq_len=SEQ)
    print(f"prepare: vocabulary {manifest.vocab_size:,}, specials {manifest.special_ids}, "
          f"{manifest.train_rows:,} blocks of {SEQ} -> {root}")
    return 0


# ------------------------------------------------------------------------------------------------ GPU cases


def _batches(manifest, objective: str, micro: int, accum: int, step: int, device):
    import numpy as np
    import torch

    from raybiphase.data.masking import MaskingSpec
    from raybiphase.data.stream import make_inputs, read_samples

    rows = micro * accum
    mask = MaskingSpec(mask_ratio=0.4) if objective == "mlm" else None
    out = []
    for j in range(accum):
        ids = np.arange(step * rows + j * micro, step * rows + (j + 1) * micro, dtype=np.int64) % manifest.train_rows
        b = make_inputs(read_samples(manifest, ids, 0), ids, objective, manifest, 0, mask)
        out.append({k: torch.from_numpy(b[k]).to(device, non_blocking=True) for k in ("input_ids", "labels")})
    return out


class Side:
    """One way of training: builds its model and optimizer, runs one optimizer step over given micro-batches."""

    def __init__(self, mode: str, size: str, manifest, device, compile: bool = False, attn: str = "sdpa"):
        import torch

        from raybiphase.optim import adamw
        from raybiphase.pretrain.model import build_model
        from raybiphase.pretrain.parallel import wrap_blocks

        self.mode = mode
        with device:  # initialised on the GPU: seconds instead of a minute for 610m on the host
            self.model = build_model(size, vocab_size=manifest.vocab_size, special_ids=manifest.special_ids, seed=0,
                                     attn_implementation=attn).train()
        if mode == "plain":
            wrap_blocks(self.model, activation_checkpointing=False, compile=compile)
            self.optimizer = adamw(self.model, lr=3e-4, betas=(0.9, 0.95), eps=1e-5, weight_decay=0.1, fused=True)
        else:  # stock: every parameter decays, the default (foreach) implementation
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-5,
                                               weight_decay=0.1)

    def step(self, micro_batches, objective: str) -> float:
        import torch

        from raybiphase.pretrain.loop import step_tokens
        from raybiphase.pretrain.loss import token_weighted
        from raybiphase.pretrain.model import loss_terms, token_loss

        total = torch.zeros((), device=micro_batches[0]["input_ids"].device)
        tokens = step_tokens(micro_batches, world=1)
        for b in micro_batches:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if self.mode == "plain":
                    loss_sum, _ = loss_terms(self.model, b, objective)
                    loss = token_weighted(loss_sum, tokens, world=1)
                else:
                    logits = self.model(input_ids=b["input_ids"], is_causal=objective == "clm").logits
                    loss = token_loss(logits, b["labels"]) / len(micro_batches)
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(total)  # waits for the device


SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}


def sdpa_priority(order: str):
    """Torch's SDPA kernels tried in this order ("cudnn,flash,efficient,math"); "default" keeps torch's own."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if order == "default":
        return contextlib.nullcontext()
    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[name]) for name in order.split(",")], set_priority=True)


@contextlib.contextmanager
def fused_head(head: str):
    """"ours": the step's head as `raybiphase.pretrain.loss` calls liger-kernel (chunks of at most CHUNK_ROWS rows,
    the weight cast once under autocast); "liger-defaults": liger's own chunking (about rows / (vocabulary /
    hidden)) and the fp32 weight as it is, the baseline that call improves on."""
    from raybiphase.pretrain import loss

    if head == "ours" or not loss.fused_kernel_available():
        yield
        return

    def liger_defaults(rows, weight, labels, bias, chunk_rows):
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        out = liger_fused_linear_cross_entropy(rows, weight, labels, bias, reduction="sum")
        return out[0] if isinstance(out, tuple) else out

    ours, loss._fused = loss._fused, liger_defaults
    try:
        yield
    finally:
        loss._fused = ours


def _free():
    import torch

    torch._dynamo.reset()  # compiled graphs hold on to the last model's weights
    gc.collect()
    torch.cuda.empty_cache()


def largest_micro(mode: str, size: str, manifest, device, max_micro: int) -> int:
    """The largest power-of-two micro-batch whose CLM step (every position labelled: the head's largest case, plus
    the optimizer state after the first step) fits."""
    import torch

    side, best, micro = Side(mode, size, manifest, device), 0, 1
    while micro <= max_micro:
        try:
            side.step(_batches(manifest, "clm", micro, 2, 0, device), "clm")
            best, micro = micro, micro * 2
        except torch.OutOfMemoryError:
            break
        finally:
            side.optimizer.zero_grad(set_to_none=True)
            _free()
    del side
    _free()
    return best


def measure(mode: str, size: str, manifest, device, *, micro: int, accum: int, objective: str, steps: int,
            warmup: int, compile: bool = False, deterministic: bool = True, profiled: bool = False,
            attn: str = "sdpa") -> dict:
    import torch

    from raybiphase.pretrain.loop import model_flops_per_token, peak_flops

    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    side = Side(mode, size, manifest, device, compile=compile, attn=attn)
    for s in range(warmup):
        side.step(_batches(manifest, objective, micro, accum, s, device), objective)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    seconds, losses = [], []
    for s in range(warmup, warmup + steps):
        batches = _batches(manifest, objective, micro, accum, s, device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(side.step(batches, objective))
        seconds.append(time.perf_counter() - t0)
    top = profile(side, manifest, device, micro, accum, objective, warmup + steps) if profiled else None
    tokens = micro * accum * SEQ
    rate = tokens * steps / sum(seconds)
    fpt, peak = model_flops_per_token(side.model, SEQ), peak_flops()
    out = {"size": size, "attn": attn,
           "mode": mode + ("+compile" if compile else "") + ("" if deterministic else "+nondeterministic"),
           "objective": objective, "micro_batch": micro, "accumulation": accum, "seq_len": SEQ,
           "tokens_per_s": rate, "mfu": fpt * rate / peak if peak else None,
           "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9, "step_s_median": sorted(seconds)[len(seconds) // 2],
           "loss_first": losses[0], "loss_last": losses[-1], "flops_per_token": fpt,
           **({"top_kernels": top} if top else {})}
    del side
    _free()
    torch.use_deterministic_algorithms(False)
    return out


def profile(side, manifest, device, micro: int, accum: int, objective: str, first: int, top: int = 15) -> list:
    """The kernels that take the device's time over two more steps: (name, share of the kernel time, ms/step)."""
    import torch
    from torch.profiler import ProfilerActivity

    batches = [_batches(manifest, objective, micro, accum, first + i, device) for i in range(2)]
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for b in batches:
            side.step(b, objective)
        torch.cuda.synchronize()
    kernels = [(e.key, e.self_device_time_total) for e in prof.key_averages()]
    total = sum(t for _, t in kernels) or 1.0
    kernels.sort(key=lambda k: -k[1])
    rows = [(name[:110], t / total, t / 2 / 1e3) for name, t in kernels[:top]]
    print(f"# top kernels ({objective}, {total / 2 / 1e3:.0f} ms of kernels per step):")
    for name, share, ms in rows:
        print(f"#   {share:6.1%} {ms:8.1f} ms  {name}")
    return rows


def ray_side(size: str, root: Path, *, micro: int, accum: int, steps: int, report_every: int,
             compile: bool) -> list[dict]:
    """run_pretrain with one GPU worker, CLM for `steps` then MLM 40% for `steps`; the steady rate of each phase
    (its windows after the first) from the loop's reports."""
    from raybiphase.config import SweepSpec, from_dict
    from raybiphase.pretrain.trainer import run_pretrain
    from raybiphase.telemetry.history import read_history

    data = data_config(root)
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as storage:
        spec = from_dict(SweepSpec, {
            "model": {"size": size},
            "data": {"tokenizer": data.tokenizer, "seq_len": SEQ, "shard_rows": data.shard_rows, "dir": data.dir},
            "phases": {"steps": 2 * steps, "clm_share": 0.5, "mask_ratio": 0.4},
            "optim": {"warmup_steps": 2, "decay_steps": 0},
            "train": {"global_batch_tokens": micro * accum * SEQ, "micro_batch_size": micro, "precision": "bf16",
                      "eval_every": report_every, "eval_batches": 1, "checkpoint_every": 10**9, "export_steps": [],
                      "compile": compile},
            "resources": {"num_workers": 1, "cpus_per_worker": 4, "gpus_per_worker": 1},
            "sweep": {"name": "bench_gpu", "storage": storage},
        })
        t0 = time.perf_counter()
        result = run_pretrain(spec)
        wall = time.perf_counter() - t0
        if result.error:
            raise RuntimeError(f"Ray Train run failed: {result.error}")
        history = read_history(result.path)
    out = []
    for objective in ("clm", "mlm"):
        rows = [r for r in history if r["objective"] == objective]
        steady, previous = rows[1:], rows[0]["step"]
        tokens = seconds = 0.0
        for r in steady:
            n = (r["step"] - previous) * micro * accum * SEQ
            tokens, seconds, previous = tokens + n, seconds + n / r["tokens_per_s"], r["step"]
        rate = tokens / seconds
        out.append({"size": size, "mode": "ray_train" + ("+compile" if compile else ""), "objective": objective, "micro_batch": micro,
                    "accumulation": accum, "seq_len": SEQ, "tokens_per_s": rate,
                    "mfu": rows[-1].get("mfu", 0) * rate / rows[-1]["tokens_per_s"] if rows[-1].get("mfu") else None,
                    "peak_mem_gb": max(r.get("peak_mem_gb", float("nan")) for r in rows),
                    "steady_steps": rows[-1]["step"] - rows[0]["step"], "fit_wall_s": wall,
                    "loss_last": rows[-1].get(f"train/{objective}_loss")})
    return out


def finetune_rate(size: str, root: Path, task: str, batch_size: int, steps: int, max_len: int) -> dict:
    """One fine-tuning trial (the fan-out's `run_trial`) on the GPU from a freshly initialised `size` export."""
    from transformers import AutoTokenizer

    from raybiphase.config import FinetuneConfig
    from raybiphase.data.stream import open_dataset
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial
    from raybiphase.pretrain.model import build_model

    manifest = open_dataset(data_config(root).dir, seq_len=SEQ)
    with tempfile.TemporaryDirectory(prefix="bench_ft-") as tmp:
        build_model(size, vocab_size=manifest.vocab_size, special_ids=manifest.special_ids, seed=0).save_pretrained(tmp)
        AutoTokenizer.from_pretrained(str(manifest.local_tokenizer())).save_pretrained(tmp)
        cfg = FinetuneConfig(batch_size=batch_size, max_steps=steps, max_len=max_len, gpus_per_trial=1,
                             eval_every=10**6)
        result = run_trial(TrialSpec.plain(tmp, task, lr=3e-5, seed=0), cfg=cfg)
    import torch

    return {"size": size, "mode": "finetune_trial", "task": task, "batch_size": batch_size, "max_len": max_len,
            "steps": result.steps, "seconds": result.seconds,
            "examples_per_s": result.steps * batch_size / result.seconds,
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9, "test_score": result.test_score}


def cmd_run(args) -> int:
    import torch
    import transformers

    if not torch.cuda.is_available():
        print("run: skipped: no CUDA device here")
        return 0
    from raybiphase.data.stream import open_dataset
    from raybiphase.pretrain.loss import fused_kernel_available

    root = Path(args.data)
    manifest = open_dataset(data_config(root).dir, seq_len=SEQ)
    device = torch.device("cuda", 0)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformers": transformers.__version__, "fused_ce": fused_kernel_available(),
            "date": datetime.date.today().isoformat(), "vocab_size": manifest.vocab_size}
    print(f"# {meta}", flush=True)
    records: list[dict] = []

    def keep(r: dict) -> None:
        r = {**meta, **r}
        records.append(r)
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "-"
        print(f"{r['size']:>5} {r['mode']:<24} {r.get('objective', '-'):>4} micro {r.get('micro_batch', '-'):>3} "
              f"{r.get('tokens_per_s', 0):>10,.0f} tok/s  MFU {mfu:>6}  peak {r['peak_mem_gb']:6.1f} GB", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(records, indent=1))

    for size in args.sizes:
        micro = {m: (args.micro if m == "plain" and args.micro else largest_micro(m, size, manifest, device,
                                                                                  args.max_micro))
                 for m in args.modes if m in ("plain", "baseline")}
        print(f"# {size}: largest micro-batch {micro}", flush=True)
        ours = micro.get("plain") or args.micro
        for mode in [m for m in args.modes if m in ("plain", "baseline")]:
            m = micro[mode]
            if not m:
                print(f"# {size} {mode}: not even one sequence fits")
                continue
            accum = max(1, ours * args.accum // m)  # the same global batch as ours
            variants = args.variants if mode == "plain" else ["eager"]
            orders = args.sdpa if mode == "plain" else ["default"]
            heads = args.heads if mode == "plain" else ["ours"]
            for objective in args.objectives:
                for variant, order, head in itertools.product(variants, orders, heads):
                    compile = variant in ("compile", "compile+nondeterministic")
                    with sdpa_priority(order), fused_head(head):  # held while compiling: kernels chosen at trace
                        r = measure(mode, size, manifest, device, micro=m, accum=accum, objective=objective,
                                    steps=args.steps, warmup=args.warmup + (3 if compile else 0), compile=compile,
                                    deterministic="nondeterministic" not in variant,
                                    profiled=args.profile and mode == "plain" and variant == variants[-1],
                                    attn=args.attn if mode == "plain" else "sdpa")
                    keep({**r, **({"sdpa_priority": order} if order != "default" else {}),
                          **({"head": head} if mode == "plain" and fused_kernel_available() else {})})
        if "ray" in args.modes:
            for r in ray_side(size, root, micro=ours, accum=args.accum, steps=args.ray_steps,
                              report_every=args.report_every, compile="compile" in args.variants):
                keep(r)
        if "finetune" in args.modes:
            keep(finetune_rate(size, root, args.finetune_task, args.finetune_batch, args.finetune_steps,
                               args.finetune_max_len))
    return 0


def _sdpa_order(text: str) -> str:
    if text != "default" and not set(text.split(",")) <= set(SDPA_BACKENDS):
        raise argparse.ArgumentTypeError(f"{text!r}: expected 'default' or names from {', '.join(SDPA_BACKENDS)}")
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="build the Llama-3-shaped tokenizer and the 2,048-token shards")
    prep.add_argument("out")
    run = sub.add_parser("run", help="measure on CUDA")
    run.add_argument("--data", required=True, help="the folder `prepare` made")
    run.add_argument("--sizes", nargs="+", default=["210m", "610m"])
    run.add_argument("--modes", nargs="+", default=["plain", "baseline", "ray", "finetune"],
                     choices=["plain", "baseline", "ray", "finetune"],
                     help="in the order given")
    run.add_argument("--objectives", nargs="+", default=["clm", "mlm"])
    run.add_argument("--micro", type=int, default=0, help="micro-batch; 0: the largest that fits, per side")
    run.add_argument("--max-micro", type=int, default=64)
    run.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step (ours)")
    run.add_argument("--steps", type=int, default=8, help="timed optimizer steps per case")
    run.add_argument("--warmup", type=int, default=2)
    run.add_argument("--variants", nargs="+", default=["eager", "compile"],
                     choices=["eager", "compile", "nondeterministic", "compile+nondeterministic"],
                     help="ways to run our step: torch.compile per block (train.compile), without deterministic "
                          "algorithms; Ray Train compiles when 'compile' is listed")
    run.add_argument("--attn", default="sdpa", choices=["sdpa", "flex_attention", "flash_attention_2"],
                     help="our step's attention backend (model.attn_implementation); the baseline keeps sdpa")
    run.add_argument("--sdpa", nargs="+", default=["default"], type=_sdpa_order,
                     help="ours: SDPA kernel priority orders to measure, each comma-separated from "
                          f"{','.join(SDPA_BACKENDS)} (\"cudnn,flash,efficient,math\"), or \"default\" (torch's)")
    run.add_argument("--heads", nargs="+", default=["ours"], choices=["ours", "liger-defaults"],
                     help="ours: how the LM head's fused cross-entropy is called (see fused_head), each measured")
    run.add_argument("--profile", action="store_true", help="print the top kernels of the last variant of ours")
    run.add_argument("--ray-steps", type=int, default=16, help="steps per phase under Ray Train")
    run.add_argument("--report-every", type=int, default=4)
    run.add_argument("--finetune-task", default="tweets")
    run.add_argument("--finetune-batch", type=int, default=32)
    run.add_argument("--finetune-steps", type=int, default=60)
    run.add_argument("--finetune-max-len", type=int, default=512)
    run.add_argument("--json", help="write the records here")
    args = p.parse_args(argv)
    return cmd_prepare(args) if args.command == "prepare" else cmd_run(args)


if __name__ == "__main__":
    raise SystemExit(main())
