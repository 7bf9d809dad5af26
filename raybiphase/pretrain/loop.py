"""The phase-aware pretraining loop that runs on every Ray Train worker.

Read top to bottom: set up (model, FSDP2, AdamW, resume), then one optimizer step per iteration in fixed
sections: schedule, micro-steps, clip, step, eval and report, checkpoint, stop. The phase of a step (CLM with
a causal mask, MLM bidirectional at its ratio) and its learning rate come from `Schedule.at(step)`; data for
step k is global batch k (raybiphase.data.stream), so resuming or branching at any step is exact.

Metrics (one dotted namespace): step, tokens_seen, phase, objective, train/{clm,mlm}_loss, val/clm_loss,
val/mlm_loss, lr, tokens_per_s, and mfu on GPU, where
    model FLOPs per token = 6 * (N_nonembedding + LM head) + 12 * layers * hidden * seq_len   (PaLM, appendix B;
                            raybiphase.pretrain.sizes.flops_per_token)
    mfu = FLOPs per token * tokens_per_s / (peak bf16 FLOP/s of the device * world size).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from raybiphase.pretrain import checkpoint
from raybiphase.results import wandb as wandb_log
from raybiphase.config import config_from_dict, flatten
from raybiphase.data.masking import MaskingSpec
from raybiphase.pretrain.model import build_model, forward_loss, from_decoder
from raybiphase.pretrain.parallel import apply_fsdp, use_bf16
from raybiphase.pretrain.schedule import Schedule
from raybiphase.pretrain.sizes import flops_per_token
from raybiphase.data.stream import open_dataset, phase_stream, validation_batches

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def model_flops_per_token(model, seq_len: int) -> float:
    config = model.config
    embeddings = 2 * config.vocab_size * config.hidden_size  # input embedding and LM head
    return flops_per_token(layers=config.num_hidden_layers, hidden=config.hidden_size, vocab_size=config.vocab_size,
                           non_embedding_params=sum(p.numel() for p in model.parameters()) - embeddings, seq_len=seq_len)


def peak_flops() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _initial_model(cfg, manifest):
    """Random init, or weights (only) from a raybiphase checkpoint or an HF decoder (continued pretraining)."""
    common = dict(vocab_size=manifest.vocab_size, special_ids=manifest.special_ids,
                  attn_implementation=cfg.model.attn_implementation)
    source = cfg.model.init_from
    if source and ("://" in source or (Path(source) / checkpoint.META).is_file()):  # ours (local or cloud)
        model = build_model(cfg.model.size, seed=cfg.train.seed, **common)
        return model, source
    if source:
        return from_decoder(source, **common), None
    return build_model(cfg.model.size, seed=cfg.train.seed, **common), None


@torch.no_grad()
def evaluate(model, val: dict[str, list[dict]], device) -> dict[str, float]:
    model.eval()
    out = {}
    for objective, batches in val.items():
        losses = [forward_loss(model, {k: torch.as_tensor(v, device=device) for k, v in b.items()}, objective) for b in batches]
        out[f"val/{objective}_loss"] = float(torch.stack(losses).mean()) if losses else float("nan")
    model.train()
    return out


def train_loop(loop_config: dict) -> None:
    """Ray Train worker entry point.

    loop_config: {"config": nested config dict, "name": run or segment name (W&B), "data_dir": prepared shards,
    "resume_from": checkpoint or None,
    "stop_at": the last step of a sweep segment (default: the end of the run), and for the fault-tolerance test
    only "fail_at_step" and "fail_marker"}.
    """
    import ray.train

    cfg = config_from_dict(loop_config["config"])
    rank, world = _rank_world()
    device = ray.train.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")
    torch.use_deterministic_algorithms(True, warn_only=True)
    manifest = open_dataset(loop_config["data_dir"], seq_len=cfg.data.seq_len)
    schedule = Schedule.from_config(cfg)
    rows_per_step = cfg.train.global_batch_tokens // cfg.data.seq_len
    micro = cfg.train.micro_batch_size
    accum = rows_per_step // world // micro

    # --- model, FSDP2, optimizer
    model, weights_from = _initial_model(cfg, manifest)
    model.to(device).train()
    bf16 = use_bf16(cfg.train.precision)
    model = apply_fsdp(model, bf16=bf16)
    optim = cfg.optim
    optimizer = torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=optim.betas, eps=optim.eps,
                                  weight_decay=optim.weight_decay, foreach=False)

    # --- resume: Ray Train's latest checkpoint (after a failure), else an explicit branch point
    step, data_start = 0, 0
    resume = ray.train.get_checkpoint()
    if weights_from:
        with _local(weights_from) as local:
            data_start = checkpoint.read_meta(local)["data_end"]
            checkpoint.load(local, model)
    if resume is not None or loop_config.get("resume_from"):
        path = resume.path if resume is not None else loop_config["resume_from"]
        with (resume.as_directory() if resume is not None else _local(path)) as local:
            meta = checkpoint.load(local, model, optimizer)
        step, data_start = meta["step"], meta["data_start"]
    tracker = wandb_log.init_run("pretrain", loop_config.get("name", "pretrain"), cfg.sweep.name, flatten(cfg),
                                 cfg.sweep.wandb_project, rank=rank)
    val = validation_batches(manifest, batch_size=micro, batches=cfg.train.eval_batches, mask_ratio=cfg.train.eval_mask_ratio)
    fpt, peak = model_flops_per_token(model, cfg.data.seq_len), peak_flops()
    tokens_per_step = rows_per_step * cfg.data.seq_len
    decay_start = schedule.decay_start
    stop_at = min(loop_config.get("stop_at") or schedule.total_steps, schedule.total_steps)  # a sweep segment's end
    exports = {*cfg.train.export_steps, schedule.total_steps}
    saves = {*schedule.boundaries[1:], decay_start, schedule.total_steps, stop_at, *exports}

    while step < stop_at:
        # --- phase: a fresh stream from this step to the phase's end (pure function of the sample ids)
        phase_idx = schedule.phase_index(step)
        phase = schedule.phases[phase_idx]
        phase_end = min(schedule.boundaries[phase_idx + 1], stop_at)
        mask = MaskingSpec(mask_ratio=phase.mask_ratio, mask_prob=cfg.phases.mask_prob,
                           random_prob=cfg.phases.random_prob) if phase.objective == "mlm" else None
        stream = phase_stream(manifest, objective=phase.objective, mask=mask, seed=cfg.train.seed,
                              first_step=step, steps=phase_end - step, sample_offset=data_start,
                              rows_per_step=rows_per_step, rank=rank, world=world)
        batches = iter(stream.iter_torch_batches(batch_size=micro, dtypes=torch.long, device=device))
        window_start, window_tokens = time.perf_counter(), 0
        while step < phase_end:
            # --- schedule
            _, lr = schedule.at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # --- micro-steps (gradient accumulation to the global batch)
            total = torch.zeros((), device=device)
            for _ in range(accum):
                batch = next(batches)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda"):
                    loss = forward_loss(model, batch, phase.objective) / accum
                loss.backward()
                total += loss.detach()

            # --- clip and step
            if optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window_tokens += tokens_per_step

            # --- eval, report, checkpoint
            if step % cfg.train.eval_every and step not in saves and step % cfg.train.checkpoint_every:
                continue
            if world > 1:
                dist.all_reduce(total)
                total /= world
            seconds = time.perf_counter() - window_start
            metrics = {"step": step, "tokens_seen": step * tokens_per_step, "phase": phase_idx,
                       "objective": phase.objective, f"train/{phase.objective}_loss": float(total), "lr": lr,
                       "tokens_per_s": window_tokens / max(seconds, 1e-9)}
            if peak:
                metrics["mfu"] = fpt * metrics["tokens_per_s"] / (peak * world)
            if step % cfg.train.eval_every == 0 or step in saves:
                metrics.update(evaluate(model, val, device))
            if step in saves or step % cfg.train.checkpoint_every == 0:
                meta = {"config": loop_config["config"], "step": step, "tokens_seen": metrics["tokens_seen"],
                        "phase": phase_idx, "objective": phase.objective, "data_start": data_start,
                        "data_end": data_start + step * rows_per_step, "decayed": step > decay_start,
                        "total_steps": schedule.total_steps, "metrics": metrics}
                with tempfile.TemporaryDirectory() as tmp:
                    checkpoint.save(Path(tmp), model, optimizer, meta)
                    if step in exports:
                        checkpoint.export_hf(Path(tmp) / checkpoint.HF_DIR, model, manifest.tokenizer_dir)
                    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp),
                                     checkpoint_dir_name=f"step-{step:08d}")
            else:
                ray.train.report(metrics)
            wandb_log.log(tracker, {k: v for k, v in metrics.items() if k != "objective"}, step=step)
            window_start, window_tokens = time.perf_counter(), 0
            if loop_config.get("fail_at_step") == step and rank == world - 1:
                _fail_once(step, Path(loop_config["fail_marker"]))
    wandb_log.finish(tracker)


class _local:
    """Context manager giving a local directory for a checkpoint path (local or a cloud URI)."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self) -> str:
        import ray.train

        self._ctx = ray.train.Checkpoint(self.path).as_directory()
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def _fail_once(step: int, marker: Path) -> None:
    """Fault injection for the fault-tolerance test: kill this worker process once, hard, at `step`."""
    if not marker.exists():
        marker.write_text(str(step))
        os._exit(1)

