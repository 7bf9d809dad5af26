"""Parity with a peer: the project's pretraining against transformers' own `Trainer`, same settings, several seeds.

Both sides train the quickstart's base run as written in sweeps/quickstart.yaml (at this writing: tiny EuroBERT,
the offline corpus in 128-token blocks, 800 steps of 2,048 tokens, LR 3e-3 under WSD 40/80, AdamW (0.9, 0.95),
eps 1e-5, weight decay 0.1, clip 1.0, MLM at 40% with the mask token only; `--set data.seq_len=64` and the like
change a setting for both sides), once as MLM only and once as CLM only, per seed:

* ours: `raybiphase.pretrain.trainer.run_pretrain` with `resources.num_workers=1`: the production loop
  (`raybiphase.pretrain.loop.train_loop`) on one Ray Train worker, its batches masked and streamed by Ray Data as in
  every run. Its final HF export is loaded back.
* peer: `transformers.Trainer` on the same prepared train blocks (a map-style dataset of all of them, Trainer's own
  seeded random sampler), `DataCollatorForLanguageModeling` (MLM: the same ratio and mask/random/keep split,
  special tokens never masked; CLM: `mlm=False`, `is_causal=True` in the batch and the model's loss set to
  transformers' causal loss, which shifts the labels), the same initial weights (`build_model`, same seed), the
  same micro-batch and accumulation, weighted per token across micro-batches (Trainer's `num_items_in_batch`),
  AdamW with Trainer's own decay groups (checked to equal raybiphase.optim's: matrices and embeddings decay, norms
  do not), the same LR at every update (a LambdaLR written from the WSD definition, checked against
  `Schedule.lr`), clip 1.0, fp32.
* score: one evaluation, the same function on the same held-out blocks for both: `raybiphase.pretrain.loop.evaluate`
  on `validation_batches` (the run's `train.eval_batches` x `train.micro_batch_size` held-out blocks; MLM masked at
  `train.eval_mask_ratio` by the fixed evaluation seed). For ours it must equal what the loop itself reported.

It prints each seed's held-out losses, then per objective the mean difference (ours - Trainer) with its 95% t
interval over the seeds, and writes a JSON record (default benchmarks/results/parity-<date>.json). A record
accumulates: a later invocation at the same settings adds its seeds and orders, and a side the record already
holds for a seed is not trained again (both sides are deterministic on CPU at a fixed seed; `--fresh` retrains).

What the two sides may still do differently is the order of the blocks. The project's stream
(raybiphase.data.stream.locate) permutes whole shards per epoch and, with `data.row_order: shuffled` (the
default), each shard's rows too; with `stored` it reads a shard's rows in their stored order, and prepared
rows are consecutive text, so each batch is 2,048 consecutive tokens of about 11 documents, where a Trainer batch
draws its blocks from the whole corpus and touches about 26 (128-token blocks). The ablations:

* `--ours-order stream`: the project's loop with `data.row_order: stored` (the order the shards were written in);
  `rows-shuffled` (the default): with `shuffled`;
* `--peer-order ours`: the Trainer reads the project's global samples 0, 1, 2, ... in the stored order (sequential
  sampler);
* `--peer-masks ours`: the Trainer's batches carry the project's own masks (keyed by sample id).

    python benchmarks/bench_parity.py [--seeds 0 1 2] [--steps 800] [--objectives mlm clm] \
        [--peer-order shuffled|ours] [--ours-order rows-shuffled|stream] [--peer-masks collator|ours] [--set KEY=VALUE] [--json PATH]
    python benchmarks/bench_parity.py --seeds 0 --steps 4 --objectives mlm --json /tmp/parity.json   # a toy size
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without install

import numpy as np  # noqa: E402
import torch  # noqa: E402

from raybiphase.config import SweepSpec, from_dict  # noqa: E402
from raybiphase.config.load import parse_override, read_yaml  # noqa: E402
from raybiphase.data.stream import open_dataset, read_samples, validation_batches  # noqa: E402
from raybiphase.optim import param_groups  # noqa: E402
from raybiphase.phases import Schedule  # noqa: E402
from raybiphase.results.aggregate import mean_ci  # noqa: E402
from raybiphase.telemetry.provenance import code_version  # noqa: E402

QUICKSTART = REPO / "sweeps" / "quickstart.yaml"


ROW_ORDER = {"rows-shuffled": "shuffled", "stream": "stored"}  # --ours-order -> data.row_order


def run_spec(objective: str, seed: int, steps: int, storage: str, overrides: tuple[str, ...] = (),
             order: str = "rows-shuffled") -> SweepSpec:
    """The quickstart's base run as one MLM-only or CLM-only run of `steps` steps (warmup and decay scaled with the
    steps when they differ from the quickstart's), trained in this process; `overrides` are `--set` style dotted
    settings ('data.seq_len=64')."""
    data = read_yaml(QUICKSTART)
    data.pop("finetune", None)
    base_steps = data["phases"]["steps"]
    optim = data["optim"]
    if steps != base_steps:
        optim["warmup_steps"] = max(1, round(optim["warmup_steps"] * steps / base_steps))
        optim["decay_steps"] = max(1, round(optim["decay_steps"] * steps / base_steps))
    data["phases"].update(steps=steps, clm_share=1.0 if objective == "clm" else 0.0)
    data["train"].update(seed=seed, eval_every=10**9, checkpoint_every=10**9)  # one evaluation, at the end
    data["resources"] = {"num_workers": 1, "cpus_per_worker": 1}
    data["sweep"] = {"name": "parity", "storage": storage}
    data["data"]["row_order"] = ROW_ORDER[order]
    return from_dict(SweepSpec, data, dict(parse_override(o) for o in overrides))


# ------------------------------------------------------------------------------------------------------- ours


def train_ours(spec: SweepSpec):
    """The project's run, end to end (prepare finds the cached shards); returns its final weights (its last
    checkpoint's HF export) and the held-out losses its own loop reported at the last step."""
    from transformers import EuroBertForMaskedLM

    from raybiphase import storage
    from raybiphase.pretrain.trainer import run_pretrain

    result = run_pretrain(spec)
    if result.error:
        raise RuntimeError(f"run_pretrain failed: {result.error}")
    model = EuroBertForMaskedLM.from_pretrained(storage.hf_dir(result.checkpoint.path), dtype=torch.float32)
    return model, {k: v for k, v in (result.metrics or {}).items() if k.startswith("val/")}


# ------------------------------------------------------------------------------------------------------- peer


class Blocks(torch.utils.data.Dataset):
    """Prepared blocks as 1-D LongTensors: every train block (Trainer shuffles them), or, with `order="ours"`, the
    project's global samples 0..n-1 in its stored order (raybiphase.data.stream.read_samples, data.row_order
    "stored"). Item i is that global sample i either way; `with_ids` yields {"block", "sample_id"} for a collator that
    masks by sample id."""

    def __init__(self, manifest, order: str, samples: int, seed: int, with_ids: bool = False):
        count = samples if order == "ours" else manifest.train_rows
        self.blocks = read_samples(manifest, np.arange(count, dtype=np.int64), seed, shuffle_rows=False)
        self.with_ids = with_ids

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int):
        block = torch.from_numpy(self.blocks[index].astype(np.int64))
        return {"block": block, "sample_id": index} if self.with_ids else block


def wsd_factor(step: int, *, total: int, warmup: int, decay: int) -> float:
    """The WSD multiplier of update `step` (0-based), as raybiphase.optim documents it: linear warmup reaching the
    peak at update warmup-1, constant, then linear decay towards 0 over the last `decay` updates."""
    if step < warmup:
        return (step + 1) / warmup
    if step >= total - decay:
        return (total - step) / (decay + 1)
    return 1.0


def train_peer(spec: SweepSpec, manifest, objective: str, order: str, masks: str = "collator"):
    """transformers' Trainer at the run's settings; returns the trained model and its Trainer's train loss.
    `masks="ours"` (MLM): the batches carry the project's own masks (raybiphase.data.stream.make_inputs, keyed by
    sample id) instead of the collator's draws, the ablation that separates the masking draw from the step."""
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    from raybiphase.pretrain.model import build_model

    run = spec.run
    hf_logging.set_verbosity_error()
    schedule = Schedule.from_config(run)
    total, o = schedule.total_steps, run.optim
    factors = [wsd_factor(k, total=total, warmup=o.warmup_steps, decay=o.decay_steps) for k in range(total)]
    if not np.allclose([f * o.lr for f in factors], [schedule.lr(k) for k in range(total)], rtol=1e-12, atol=0):
        raise AssertionError("the peer's LR differs from raybiphase's Schedule.lr")
    rows = run.train.global_batch_tokens // run.data.seq_len
    micro = run.train.micro_batch_size

    tokenizer = AutoTokenizer.from_pretrained(str(manifest.local_tokenizer()))
    if sorted(tokenizer.all_special_ids) != sorted(set(manifest.special_ids.values())):
        raise AssertionError(f"the collator's special tokens {tokenizer.all_special_ids} differ from the project's "
                             f"{manifest.special_ids}")
    model = build_model(run.model.size, vocab_size=manifest.vocab_size, special_ids=manifest.special_ids,
                        seed=run.train.seed, attn_implementation=run.model.attn_implementation)
    if objective == "mlm" and masks == "ours":
        from raybiphase.data.masking import MaskingSpec
        from raybiphase.data.stream import make_inputs

        spec_mask = MaskingSpec(mask_ratio=run.phases.mask_ratio, mask_prob=run.phases.mask_prob,
                                random_prob=run.phases.random_prob)

        def collator(examples):  # what the project's stream yields for these sample ids
            ids = np.array([e["sample_id"] for e in examples], dtype=np.int64)
            out = make_inputs(np.stack([e["block"].numpy() for e in examples]), ids, "mlm", manifest,
                              run.train.seed, spec_mask)
            return {"input_ids": torch.from_numpy(out["input_ids"]), "labels": torch.from_numpy(out["labels"])}
    elif objective == "mlm":
        collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=run.phases.mask_ratio,
                                                   mask_replace_prob=run.phases.mask_prob,
                                                   random_replace_prob=run.phases.random_prob, seed=run.train.seed)
    else:
        model.loss_type = "ForCausalLM"  # the model's own loss becomes transformers' shifted next-token loss
        plain = DataCollatorForLanguageModeling(tokenizer, mlm=False)

        def collator(examples):  # the same encoder, causal: EuroBERT's attention takes is_causal as a kwarg
            return {**plain(examples), "is_causal": True}

    class WSDTrainer(Trainer):
        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer,
                                                                      lambda k: factors[min(k, total - 1)])
            return self.lr_scheduler

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, max_steps=total, per_device_train_batch_size=micro,
            gradient_accumulation_steps=rows // micro, learning_rate=o.lr, adam_beta1=o.betas[0],
            adam_beta2=o.betas[1], adam_epsilon=o.eps, weight_decay=o.weight_decay, max_grad_norm=o.grad_clip,
            optim="adamw_torch", seed=run.train.seed, use_cpu=True, bf16=False, report_to="none",
            save_strategy="no", eval_strategy="no", logging_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0, train_sampling_strategy="sequential" if order == "ours" else "random",
            remove_unused_columns=False)
        blocks = Blocks(manifest, order, total * rows, run.train.seed, with_ids=objective == "mlm" and masks == "ours")
        trainer = WSDTrainer(model=model, args=args, train_dataset=blocks, data_collator=collator)
        trainer.create_optimizer()
        check_decay_groups(trainer.optimizer, model, o.weight_decay, run.optim.decay_embeddings)
        output = trainer.train()
    return model, output.training_loss


def check_decay_groups(optimizer, model, weight_decay: float, decay_embeddings: bool) -> None:
    """Trainer's AdamW decays exactly the parameters raybiphase.optim decays."""
    ours = {id(p) for g in param_groups(model, weight_decay, decay_embeddings=decay_embeddings)
            if g["weight_decay"] > 0 for p in g["params"]}
    theirs = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    if ours != theirs:
        names = {id(p): n for n, p in model.named_parameters()}
        raise AssertionError(f"decay groups differ: only ours {[names[i] for i in ours - theirs]}, only Trainer's "
                             f"{[names[i] for i in theirs - ours]}")


# ------------------------------------------------------------------------------------------------------ score


def held_out(model, spec: SweepSpec, manifest, objective: str) -> float:
    """The one evaluation both sides get: the loop's own `evaluate` on the run's fixed held-out batches."""
    from raybiphase.pretrain.loop import evaluate

    run = spec.run
    val = validation_batches(manifest, batch_size=run.train.micro_batch_size, batches=run.train.eval_batches,
                             mask_ratio=run.train.eval_mask_ratio)
    return evaluate(model, {objective: val[objective]}, torch.device("cpu"))[f"val/{objective}_loss"]


def held_out_collator_masks(model, spec: SweepSpec, manifest) -> float:
    """A second MLM score on the same held-out blocks, masked this time by transformers' collator (seed 0) at the
    same ratio: a masking from another random family than the one ours trains on."""
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from raybiphase import storage
    from raybiphase.data.stream import _load_blocks
    from raybiphase.pretrain.loop import evaluate

    run = spec.run
    tokenizer = AutoTokenizer.from_pretrained(str(manifest.local_tokenizer()))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=run.train.eval_mask_ratio,
                                               mask_replace_prob=1.0, random_replace_prob=0.0, seed=0)
    blocks = _load_blocks(storage.join(manifest.dir, manifest.val_file), manifest.seq_len)
    n, micro = min(len(blocks), run.train.eval_batches * run.train.micro_batch_size), run.train.micro_batch_size
    val = []
    for start in range(0, n, micro):
        batch = collator([torch.from_numpy(block.astype(np.int64)) for block in blocks[start:start + micro]])
        val.append({k: v.numpy() for k, v in batch.items()})
    return evaluate(model, {"mlm": val}, torch.device("cpu"))["val/mlm_loss"]


def interval(diffs: list[float]) -> dict:
    ci = mean_ci(diffs)
    return {"mean": ci.mean, "half_width": ci.half_width, "low": ci.mean - ci.half_width,
            "high": ci.mean + ci.half_width, "n": ci.n}


def fmt(ci: dict) -> str:
    if ci["n"] < 2 or not math.isfinite(ci["half_width"]):
        return f"{ci['mean']:+.3f} (n={ci['n']}: no interval)"
    return f"{ci['mean']:+.3f} ± {ci['half_width']:.3f} (95% t, n={ci['n']}: [{ci['low']:+.3f}, {ci['high']:+.3f}])"


# ------------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="train.seed values (weights, data, masks)")
    p.add_argument("--steps", type=int, default=800, help="optimizer steps (warmup and decay scale from 800)")
    p.add_argument("--objectives", nargs="+", choices=["mlm", "clm"], default=["mlm", "clm"])
    p.add_argument("--peer-order", choices=["shuffled", "ours"], default="shuffled",
                   help="the peer's sample order: Trainer's random sampler, or the project's stream order")
    p.add_argument("--peer-masks", choices=["collator", "ours"], default="collator",
                   help="MLM: the Trainer's masks from its collator, or the project's own (keyed by sample id)")
    p.add_argument("--ours-order", choices=["rows-shuffled", "stream"], default="rows-shuffled",
                   help="the project's block order: data.row_order shuffled (the default) or stored ('stream')")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a quickstart setting changed for both sides, e.g. data.seq_len=64 (repeatable)")
    p.add_argument("--fresh", action="store_true", help="retrain a side the record already holds at these settings")
    p.add_argument("--threads", type=int, default=2, help="torch threads (both sides run in this process)")
    p.add_argument("--json", help="the record (read, then rewritten); default benchmarks/results/parity-<date>.json")
    args = p.parse_args(argv)

    from raybiphase.data.prepare import prepare

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    storage = tempfile.mkdtemp(prefix="bench_parity-")  # both sides' data and checkpoints: the record keeps the scores
    atexit.register(shutil.rmtree, storage, ignore_errors=True)
    overrides = tuple(sorted(args.overrides))
    first = run_spec(args.objectives[0], args.seeds[0], args.steps, storage, overrides)
    manifest = open_dataset(prepare(first.run.data, quiet=True), seq_len=first.run.data.seq_len)
    run = first.run
    settings = {"config": "sweeps/quickstart.yaml", "overrides": list(overrides), "size": run.model.size, "steps": args.steps,
                "rows_per_step": run.train.global_batch_tokens // run.data.seq_len, "seq_len": run.data.seq_len,
                "micro_batch_size": run.train.micro_batch_size, "lr": run.optim.lr,
                "warmup_steps": run.optim.warmup_steps, "decay_steps": run.optim.decay_steps,
                "betas": list(run.optim.betas), "eps": run.optim.eps, "weight_decay": run.optim.weight_decay,
                "grad_clip": run.optim.grad_clip, "mask_ratio": run.phases.mask_ratio,
                "mask_prob": run.phases.mask_prob, "random_prob": run.phases.random_prob,
                "eval_mask_ratio": run.train.eval_mask_ratio, "train_blocks": manifest.train_rows,
                "held_out_blocks": min(manifest.val_rows, run.train.eval_batches * run.train.micro_batch_size),
                "max_documents": run.data.max_documents}
    out = Path(args.json) if args.json else REPO / "benchmarks" / "results" / f"parity-{datetime.date.today()}.json"
    known = [] if args.fresh else previous_runs(out, settings)
    print(f"# parity: tiny EuroBERT ({run.model.size}), {', '.join(overrides) + ', ' if overrides else ''}{args.steps} steps of {settings['rows_per_step']} x "
          f"{run.data.seq_len} tokens, LR {run.optim.lr:g} WSD {run.optim.warmup_steps}/{run.optim.decay_steps}, "
          f"AdamW {run.optim.betas} eps {run.optim.eps:g} wd {run.optim.weight_decay:g} clip {run.optim.grad_clip:g}; "
          f"MLM {run.phases.mask_ratio:.0%} (mask {run.phases.mask_prob:g} / random {run.phases.random_prob:g}); "
          f"{manifest.train_rows:,} train blocks, {settings['held_out_blocks']} held-out; our order: "
          f"{args.ours_order}, Trainer's: {args.peer_order}; torch {torch.__version__}, {args.threads} threads",
          flush=True)

    invocation = {"command": "python benchmarks/bench_parity.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  "started": datetime.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
                  "load_average_start": os.getloadavg()}
    rows = []
    for objective in args.objectives:
        for seed in args.seeds:
            spec = run_spec(objective, seed, args.steps, storage, overrides, args.ours_order)
            row = {"objective": objective, "ours_order": args.ours_order, "peer_order": args.peer_order,
                   "peer_masks": args.peer_masks if objective == "mlm" else "none", "seed": seed}
            ours_row = find(known, objective=objective, ours_order=args.ours_order, seed=seed)
            if ours_row:  # both sides are deterministic at a given seed (CPU, fixed seeds): a side is trained once
                row.update(ours=ours_row["ours"], ours_seconds=ours_row["ours_seconds"], ours_reused=True,
                           **{k: ours_row[k] for k in ("ours_collator_masks",) if k in ours_row})
            else:
                t0 = time.perf_counter()
                ours_model, reported = train_ours(spec)
                row.update(ours=held_out(ours_model, spec, manifest, objective),
                           ours_seconds=round(time.perf_counter() - t0, 1))
                if objective == "mlm":
                    row["ours_collator_masks"] = held_out_collator_masks(ours_model, spec, manifest)
                loop_reported = reported.get(f"val/{objective}_loss", float("nan"))
                if not abs(row["ours"] - loop_reported) < 1e-4:  # the export holds the weights the loop evaluated
                    raise AssertionError(f"the re-scored export ({row['ours']}) differs from the loop's report "
                                         f"({loop_reported})")
            peer_row = find(known, objective=objective, peer_order=args.peer_order, peer_masks=row["peer_masks"],
                            seed=seed)
            if peer_row:
                row.update(peer=peer_row["peer"], peer_seconds=peer_row["peer_seconds"],
                           peer_train_loss=peer_row["peer_train_loss"], peer_reused=True,
                           **{k: peer_row[k] for k in ("peer_collator_masks",) if k in peer_row})
            else:
                t0 = time.perf_counter()
                peer_model, peer_train = train_peer(spec, manifest, objective, args.peer_order, args.peer_masks)
                row.update(peer=held_out(peer_model, spec, manifest, objective), peer_train_loss=peer_train,
                           peer_seconds=round(time.perf_counter() - t0, 1))
                if objective == "mlm":
                    row["peer_collator_masks"] = held_out_collator_masks(peer_model, spec, manifest)
            row["diff"] = row["ours"] - row["peer"]
            rows.append(row)
            reused = " ".join(f"({side} from {out.name})" for side in ("ours", "peer") if row.get(f"{side}_reused"))
            second = (f"; under the collator's eval masks {row['ours_collator_masks']:.4f} / "
                      f"{row['peer_collator_masks']:.4f}" if "ours_collator_masks" in row and "peer_collator_masks" in row
                      else "")
            print(f"{objective} seed {seed}: held-out loss ours {row['ours']:.4f}  Trainer {row['peer']:.4f}  "
                  f"diff {row['diff']:+.4f}{second}   ({row['ours_seconds']:.0f}s / {row['peer_seconds']:.0f}s) "
                  f"{reused}", flush=True)
            invocation.update(seconds=round(time.perf_counter() - started, 1), load_average_end=os.getloadavg())
            record = write_record(out, settings, rows, invocation)  # after every seed: a stopped run keeps its seeds

    print()
    for res in summarize(rows):
        masks = f", Trainer's masks: {res['peer_masks']}" if res["objective"] == "mlm" else ""
        print(f"{res['objective']} (our order {res['ours_order']}, Trainer's {res['peer_order']}{masks}): ours "
              f"{res['ours']['mean']:.3f}, Trainer {res['peer']['mean']:.3f}; difference (ours - Trainer) "
              f"{fmt(res['diff'])}")
    print(f"# {time.perf_counter() - started:.0f}s in all; record: {out} ({len(record['runs'])} runs)")
    return 0


KEY = ("objective", "ours_order", "peer_order", "peer_masks", "seed")


def key_of(run: dict, fields=KEY) -> tuple:
    """The run's values of `fields`; rows written before peer_masks existed used the collator's."""
    masks = run.get("peer_masks") or ("collator" if run["objective"] == "mlm" else "none")
    return tuple(masks if k == "peer_masks" else run[k] for k in fields)


def find(runs: list[dict], **match) -> dict | None:
    return next((r for r in runs if all(key_of(r, (k,))[0] == v for k, v in match.items())), None)


def previous_runs(out: Path, settings: dict) -> list[dict]:
    """The runs a record already holds at the same settings (none when it does not exist)."""
    if not out.exists():
        return []
    previous = json.loads(out.read_text())
    differ = {k for k in {*previous.get("settings", {}), *settings}
              if previous.get("settings", {}).get(k) != strict(settings).get(k)}
    if differ:
        raise SystemExit(f"{out} holds runs at other settings ({', '.join(sorted(differ))}); pass --json to write "
                         f"elsewhere")
    return previous["runs"]


def summarize(runs: list[dict]) -> list[dict]:
    """Per (objective, our order, Trainer's order): the mean held-out loss of each side and the mean paired
    difference, each with its 95% t interval over the seeds."""
    fields = KEY[:-1]
    groups = sorted({key_of(r, fields) for r in runs},
                    key=lambda g: (g[0] != "mlm", g[1] != "stream", g[2] != "shuffled", g[3] != "collator"))
    out = []
    for group in groups:
        mine = sorted((r for r in runs if key_of(r, fields) == group), key=lambda r: r["seed"])
        res = {**dict(zip(fields, group)), "seeds": [r["seed"] for r in mine],
               **{side: interval([r[side] for r in mine]) for side in ("ours", "peer", "diff")}}
        if all("ours_collator_masks" in r and "peer_collator_masks" in r for r in mine):
            res["diff_under_collator_eval_masks"] = interval([r["ours_collator_masks"] - r["peer_collator_masks"]
                                                              for r in mine])
        out.append(res)
    return out


def headline(results: list[dict]) -> str:
    """Each objective's held-out loss difference, ours - Trainer, at its first group (summarize's order), the group
    named: the figure docs/benchmarks.md shows."""
    firsts = {r["objective"]: r for r in reversed(results)}

    def line(r: dict) -> str:
        spread = "" if r["diff"]["half_width"] is None else f" ± {r['diff']['half_width']:.3f}"
        orders = ", ".join(f"{k} {r[k]}" for k in KEY[1:-1] if k in r)
        return f"{r['objective'].upper()} ({orders}): {r['diff']['mean']:+.3f}{spread}, {len(r['seeds'])} seed(s)"

    return "ours - Trainer held-out loss: " + "; ".join(line(r) for _, r in sorted(firsts.items()))


def write_record(out: Path, settings: dict, rows: list[dict], invocation: dict) -> dict:
    """One record per file: this invocation's runs join those already there at the same settings (a rerun of a
    seed replaces it), and the summary is recomputed over all of them."""
    runs, invocations = {}, []
    if out.exists():
        previous = json.loads(out.read_text())
        runs = {key_of(r): r for r in previous["runs"]}
        invocations = [i for i in previous.get("invocations", []) if i.get("started") != invocation["started"]]
    runs.update({key_of(r): r for r in rows})
    merged = list(runs.values())
    results = summarize(merged)
    record = {"benchmark": "bench_parity", "settings": settings, "results": results, "runs": merged,
              "date": invocation["started"][:10], "code": code_version(), "headline": headline(results),
              "invocations": [*invocations, invocation],
              "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(strict(record), indent=2, allow_nan=False) + "\n")
    return record


def strict(value):
    """The record with NaN (a single seed's interval) as null: strict JSON."""
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


if __name__ == "__main__":
    raise SystemExit(main())
