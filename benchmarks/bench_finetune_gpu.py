"""One fine-tuning trial of ours (`raybiphase.finetune.trial.run_trial`) against transformers' `Trainer` fine-tuning
the same checkpoint on the same examples: examples/s, wall time and its split, peak memory, test score.

The checkpoint is a freshly initialised `--size` EuroBERT with the Llama-3-shaped tokenizer of
`bench_train_gpu.py prepare` (its `finetune_rate` builds it the same way). Both sides then run the same trial:

- the same splits (`tasks.load_splits`, loaded once before either side, so neither pays for reading the files);
- the same inputs: `<bos> text <eos>` (a pair written as one text in its task's template, `Task.input_text`), at
  most `--max-len` tokens (the end trimmed), padded per batch to its longest with eos (Llama-3's pad); the Trainer
  gets them from the tokenizer's batch call and `DataCollatorWithPadding`;
- the same model class: `EuroBertForSequenceClassification` with mean pooling (the Trainer's through
  `AutoModelForSequenceClassification`), fp32 weights, seeded head;
- the same optimisation: batch `--batch-size`, `--steps` steps (at most one epoch), AdamW betas 0.9/0.95, eps 1e-5,
  weight decay 0.1, gradient norm clipped at 1.0, linear warmup over `finetune.warmup_ratio` of the steps then
  linear decay to zero; bf16 autocast on CUDA (Trainer: `bf16=True`), fp32 on the CPU;
- the same evaluation at the end: accuracy on validation and test (our EVAL_BATCH of 64; the Trainer at
  `per_device_eval_batch_size = --batch-size`, as fine-tuning scripts set it).
The batches differ (each side draws its own seeded order over the same training split), so the test scores agree
within seed noise, not exactly.

Measured per side: training examples/s over the train loop only (ours: from the model on the device to the first
evaluation; the Trainer: `on_train_begin` to `on_train_end`), the trial's wall time and its split into load (weights
onto the device; the Trainer's construction too), prepare (tokenizer, tokenized splits), train, evaluate and other,
the device synchronised at each boundary; peak `torch.cuda.max_memory_allocated` (reset between sides); the test
accuracy. Ours is timed by wrapping `trial._tokenized` and the head it returns, without changing `run_trial`. The
device is warmed up (context, cuBLAS) before either side; ours runs first.

    python benchmarks/bench_finetune_gpu.py --data .gpu/bench --json out.json            # on the GPU: 210m, tweets
    python benchmarks/bench_finetune_gpu.py --data .gpu/bench --size tiny --steps 5 --batch-size 4 --max-len 64 \\
        --device cpu --json /tmp/ft.json                                                 # a smoke run on a CPU
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from bench_train_gpu import SEQ, data_config  # noqa: E402  (this folder is on the path when run as a script)

PHASES = ("load", "prepare", "train", "evaluate")
SIDES = ("ours", "trainer")


# ------------------------------------------------------------------------------------------------ timing


class Stopwatch:
    """Seconds per phase of one trial; the device is synchronised at each boundary, so queued kernels count in
    the phase that launched them."""

    def __init__(self, device):
        self.device = device
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.started: dict[str, float] = {}

    def _now(self) -> float:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self, name: str) -> None:
        self.started[name] = self._now()

    def stop(self, name: str) -> None:
        if name in self.started:  # a second stop (the test evaluation after validation's) adds nothing
            self.seconds[name] += self._now() - self.started.pop(name)

    @contextlib.contextmanager
    def phase(self, name: str):
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)


def side_record(side: str, watch: Stopwatch, *, wall: float, steps: int, batch_size: int, test_score: float) -> dict:
    import torch

    split = {**watch.seconds, "other": max(0.0, wall - sum(watch.seconds.values()))}
    return {"steps": steps, "side": side, "examples_per_s": steps * batch_size / watch.seconds["train"],
            "wall_s": wall, "shares": {name: seconds / wall for name, seconds in split.items()},
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if watch.device.type == "cuda" else None,
            "test_score": test_score}


# ------------------------------------------------------------------------------------------------ the two sides


def checkpoint(size: str, root: Path, out: Path) -> None:
    """A freshly initialised `size` EuroBERT and its tokenizer, saved as an HF folder (as `finetune_rate` does)."""
    from transformers import AutoTokenizer

    from raybiphase.data.stream import open_dataset
    from raybiphase.pretrain.model import build_model

    manifest = open_dataset(data_config(root).dir, seq_len=SEQ)
    build_model(size, vocab_size=manifest.vocab_size, special_ids=manifest.special_ids, seed=0).save_pretrained(out)
    AutoTokenizer.from_pretrained(str(manifest.local_tokenizer())).save_pretrained(out)


def ours(hf_dir: Path, args, device) -> dict:
    """`run_trial` as the fan-out runs it, its phases timed through the head it tokenizes with."""
    from raybiphase.config import FinetuneConfig
    from raybiphase.finetune import trial
    from raybiphase.finetune.spec import TrialSpec

    watch, tokenized = Stopwatch(device), trial._tokenized

    def timed_tokenized(*call, **options):
        with watch.phase("prepare"):
            head, units, val, test = tokenized(*call, **options)
        load_model, evaluate = head.load_model, head.evaluate

        def timed_load(path):
            with watch.phase("load"):
                model = load_model(path).to(head.device)  # run_trial's own .to(device) is then a no-op
            watch.start("train")
            return model

        def timed_evaluate(model, prepared):
            watch.stop("train")
            with watch.phase("evaluate"):
                return evaluate(model, prepared)

        head.load_model, head.evaluate = timed_load, timed_evaluate
        return head, units, val, test

    cfg = FinetuneConfig(batch_size=args.batch_size, max_steps=args.steps, max_len=args.max_len,
                         gpus_per_trial=1 if device.type == "cuda" else 0, eval_every=10**9,
                         compile=args.compile)
    trial._tokenized = timed_tokenized
    try:
        began = time.perf_counter()
        result = trial.run_trial(TrialSpec.plain(hf_dir, args.task, lr=args.lr, seed=args.seed), cfg=cfg)
        watch.stop("train")  # a diverged trial returns without evaluating
        wall = time.perf_counter() - began
    finally:
        trial._tokenized = tokenized
    return side_record("ours", watch, wall=wall, steps=result.steps, batch_size=args.batch_size,
                       test_score=result.test_score)


def encode(tokenizer, task, records: list[dict], max_len: int) -> list[dict]:
    """Trainer examples from SC records: the token ids ours feeds (`<bos> text <eos>`, a pair written as one text in
    the task's template, at most `max_len`, the end trimmed), from the tokenizer's batch call."""
    opener = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    closer = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    texts = tokenizer([task.input_text(r) for r in records], add_special_tokens=False)["input_ids"]
    examples = []
    for record, ids in zip(records, texts):
        ids = opener + ids[:max_len - len(opener) - len(closer)] + closer
        examples.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": record["label"]})
    return examples


def trainer(hf_dir: Path, args, device, splits) -> dict:
    """transformers' `Trainer` on the same checkpoint, examples and schedule."""
    import numpy as np
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              TrainerCallback, TrainingArguments, set_seed)

    from raybiphase.config import FinetuneConfig
    from raybiphase.finetune.tasks import get_task
    from raybiphase.finetune.trial import ADAMW, GRAD_CLIP

    watch = Stopwatch(device)

    class TrainLoop(TrainerCallback):
        def on_train_begin(self, *_, **__):
            watch.start("train")

        def on_train_end(self, *_, **__):
            watch.stop("train")

    def accuracy(prediction) -> dict:
        return {"accuracy": float(np.mean(prediction.predictions.argmax(-1) == prediction.label_ids))}

    began = time.perf_counter()
    with watch.phase("prepare"):
        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token  # Llama-3's convention, and ours (heads.base.Head.pad_id)
        train, val, test = (encode(tokenizer, get_task(args.task), part, args.max_len)
                            for part in (splits.train, splits.val, splits.test))
    steps = min(args.steps, math.ceil(len(train) / args.batch_size))  # at most one epoch, as run_trial
    with tempfile.TemporaryDirectory(prefix="bench_ft_trainer-") as out:
        options = TrainingArguments(
            output_dir=out, max_steps=steps, per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=args.batch_size, learning_rate=args.lr, lr_scheduler_type="linear",
            warmup_steps=round(FinetuneConfig().warmup_ratio * steps), adam_beta1=ADAMW["betas"][0],
            adam_beta2=ADAMW["betas"][1], adam_epsilon=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
            max_grad_norm=GRAD_CLIP, bf16=device.type == "cuda", use_cpu=device.type != "cuda", seed=args.seed,
            data_seed=args.seed, eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none",
            disable_tqdm=True, remove_unused_columns=False)
        with watch.phase("load"):
            set_seed(args.seed)
            model = AutoModelForSequenceClassification.from_pretrained(
                str(hf_dir), num_labels=get_task(args.task).num_labels, classifier_pooling="mean", dtype=torch.float32)
            runner = Trainer(model=model, args=options, train_dataset=train,
                             data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy,
                             callbacks=[TrainLoop()])
        runner.train()
        with watch.phase("evaluate"):
            runner.evaluate(val, metric_key_prefix="val")
            test_score = runner.evaluate(test, metric_key_prefix="test")["test_accuracy"]
        wall = time.perf_counter() - began
    return side_record("trainer", watch, wall=wall, steps=steps, batch_size=args.batch_size, test_score=test_score)


# ------------------------------------------------------------------------------------------------ main


def _fresh(device) -> None:
    """Free the last side's memory and reset the peak, so each side's peak is its own."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _warm_up(device) -> None:
    """Start the CUDA context and cuBLAS before either side, so neither pays for it."""
    import torch

    a = torch.randn(512, 512, device=device)
    float((a @ a).sum())


def profile_ours(hf_dir: Path, args, device, top: int = 20) -> None:
    """Ours once more under torch.profiler: the operators that take the host's and the device's time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        ours(hf_dir, args, device)
    table = prof.key_averages()
    keys = ["self_cpu_time_total"] + (["self_cuda_time_total"] if device.type == "cuda" else [])
    for key in keys:
        print(f"# profile of ours, by {key}:")
        print(table.table(sort_by=key, row_limit=top, max_name_column_width=70))


def print_table(records: list[dict]) -> None:
    split = ("load", "prepare", "train", "evaluate", "other")
    print(f"{'side':<8} {'examples/s':>10} {'wall s':>8} " + " ".join(f"{name:>8}" for name in split)
          + f" {'peak GB':>8} {'test':>6}")
    for r in records:
        peak = f"{r['peak_mem_gb']:8.2f}" if r["peak_mem_gb"] is not None else f"{'-':>8}"
        print(f"{r['side']:<8} {r['examples_per_s']:10.1f} {r['wall_s']:8.1f} "
              + " ".join(f"{r['shares'][name]:8.1%}" for name in split) + f" {peak} {r['test_score']:6.3f}")
    rate = {r["side"]: r["examples_per_s"] for r in records}  # each side's last run
    if len(rate) == 2:
        print(f"ours / Trainer examples/s (each side's last run): {rate['ours'] / rate['trainer']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=".gpu/bench", help="the folder `bench_train_gpu.py prepare` made")
    p.add_argument("--size", default="210m")
    p.add_argument("--task", default="tweets", help="a sequence-classification task")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--sides", nargs="+", default=[*SIDES, *SIDES], choices=SIDES,
                   help="which sides run, in this order; the ratio compares each side's last run. The default runs "
                        "each twice, so both are compared warm: a process's first trial builds cuDNN/cuBLAS plans "
                        "for each new padded width (on an H100, 210m: 128 examples/s cold, 472 warm)")
    p.add_argument("--pad-multiple", type=int, default=None,
                   help="ours: round each batch's width up to this multiple on CUDA (default: the heads' "
                        "CUDA_PAD_MULTIPLE; 1 pads to the batch's longest, as the Trainer's collator does)")
    p.add_argument("--compile", action="store_true",
                   help="ours: finetune.compile, torch.compile each transformer block (the compilation counts in "
                        "the training time)")
    p.add_argument("--hf-dir", help="fine-tune this checkpoint folder, made there first if absent (default: a "
                                    "fresh one in a temporary folder); separate runs then start from the same weights")
    p.add_argument("--profile", action="store_true",
                   help="also run ours once more under torch.profiler and print the top operators (CPU and device)")
    p.add_argument("--json", help="write the records here")
    args = p.parse_args(argv)

    import transformers

    from raybiphase.finetune.heads import base
    from raybiphase.finetune.tasks import get_task, load_splits

    if args.pad_multiple is not None:
        base.CUDA_PAD_MULTIPLE = args.pad_multiple

    transformers.logging.set_verbosity_error()  # both sides load a head that is new by design: no load report
    transformers.logging.disable_progress_bar()

    task = get_task(args.task)
    if task.family != "SC":
        p.error(f"--task: {args.task} is a {task.family} task; this benchmark compares sequence classification")
    device = torch.device(args.device)
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.date.today().isoformat(), "command": shlex.join(["python", *sys.argv]),
            "size": args.size, "task": args.task, "batch_size": args.batch_size, "max_len": args.max_len}
    # each side's batch widths: ours rounded up to this multiple on CUDA; the Trainer's collator pads to the longest
    padding = {"ours": base.CUDA_PAD_MULTIPLE if device.type == "cuda" else 1, "trainer": 1}
    print(f"# {meta}", flush=True)
    splits = load_splits(task)  # read once for both sides (run_trial's call hits this cache)
    _warm_up(device)
    records = []
    with tempfile.TemporaryDirectory(prefix="bench_ft-") as tmp:
        hf_dir = Path(args.hf_dir or tmp)
        if not (hf_dir / "config.json").is_file():
            checkpoint(args.size, Path(args.data), hf_dir)
        for run, side in enumerate(args.sides):
            _fresh(device)
            record = ours(hf_dir, args, device) if side == "ours" else trainer(hf_dir, args, device, splits)
            records.append({**meta, "run": run, "pad_multiple": padding[side],
                            "compile": args.compile and side == "ours", **record})
            print(f"# {side}: {record['examples_per_s']:.1f} examples/s, test {record['test_score']:.4f}", flush=True)
        if args.profile:
            profile_ours(hf_dir, args, device)
    print_table(records)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
