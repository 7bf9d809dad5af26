"""The phase-aware pretraining loop that runs on every Ray Train worker.

Read top to bottom: set up (model, FSDP2, AdamW, restore), then one optimizer step per iteration in fixed
sections: schedule, micro-steps, clip and step, what this step does (decided once), eval and report, checkpoint. The phase of a step (CLM with
a causal mask, MLM bidirectional at its ratio) and its learning rate come from `Schedule.at(step)`; data for
step k is global batch k (raybiphase.data.stream), so resuming or branching at any step is exact.

Metrics (one dotted namespace): step, tokens_seen, phase, objective, train/{clm,mlm}_loss, val/clm_loss,
val/mlm_loss, lr, tokens_per_s, unigram_entropy (with the evaluations: the corpus' unigram entropy, a reference),
and on GPU mfu and peak_mem_gb (this worker's peak allocated memory), where
    model FLOPs per token = 6 * (N_nonembedding + LM head) + 12 * layers * hidden * seq_len   (PaLM, appendix B;
                            raybiphase.config.sizes.flops_per_token)
    mfu = FLOPs per token * tokens_per_s / (peak bf16 FLOP/s of the device * world size).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from raybiphase import storage
from raybiphase.config import RunConfig, flatten, from_dict
from raybiphase.optim import adamw, set_lr
from raybiphase.pretrain import checkpoint
from raybiphase.pretrain.checkpoint import CheckpointMeta
from raybiphase.telemetry import wandb as wandb_log
from raybiphase.data.masking import MaskingSpec
from raybiphase.data.masking import IGNORE_INDEX
from raybiphase.pretrain.loss import token_weighted
from raybiphase.pretrain.model import build_model, from_decoder, loss_terms
from raybiphase.pretrain.parallel import apply_fsdp, use_bf16, wrap_blocks
from raybiphase.pretrain.schedule import Schedule
from raybiphase.config.sizes import PEAK_BF16_TFLOPS, flops_per_token
from raybiphase.data.stream import epochs_read, open_dataset, phase_stream, validation_batches
from raybiphase.telemetry.progress import Beacon
from raybiphase.data.assets import cache_dir

def model_flops_per_token(model, seq_len: int) -> float:
    config = model.config
    embeddings = 2 * config.vocab_size * config.hidden_size  # input embedding and LM head
    return flops_per_token(layers=config.num_hidden_layers, hidden=config.hidden_size, vocab_size=config.vocab_size,
                           non_embedding_params=sum(p.numel() for p in model.parameters()) - embeddings, seq_len=seq_len)


def peak_flops() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((tflops * 1e12 for key, tflops in PEAK_BF16_TFLOPS.items() if key in name), None)


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def initial_model(run: RunConfig, manifest):
    """Random init, or an HF decoder's weights (continued pretraining from a Llama-family model); a raybiphase
    checkpoint in model.init_from is loaded by `restore`."""
    common = dict(vocab_size=manifest.vocab_size, special_ids=manifest.special_ids,
                  attn_implementation=run.model.attn_implementation)
    source = run.model.init_from
    if source and not storage.is_checkpoint(source):  # a decoder in a bucket is copied once to this node

        return from_decoder(storage.local_copy(source, cache_dir()), **common)
    return build_model(run.model.size, seed=run.train.seed, **common)


def export_initial(run: RunConfig, data_dir: str, dest: str) -> None:
    """The run's step-0 weights (what `train_loop` starts from before any step) as an HF folder at `dest` (a folder
    or a bucket URI): the sweep's untrained control."""
    from transformers.utils import logging as hf_logging

    manifest = open_dataset(data_dir, seq_len=run.data.seq_len)
    model = initial_model(run, manifest)
    hf_logging.disable_progress_bar()  # one small folder: no "Writing model shards" bar in the sweep's output
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.export_hf(Path(tmp) / "hf", model, manifest.local_tokenizer(), seq_len=run.data.seq_len)
        storage.upload(Path(tmp) / "hf", dest)


def restore(run: RunConfig, model, optimizer, resume_from: str | None) -> tuple[int, int]:
    """Where this worker starts, as (step, data_start); the one resume path.

    In order: Ray Train's latest checkpoint of this run (a worker died and the group restarted), else `resume_from`
    (a sweep segment continuing its parent's checkpoint, same schedule), else a raybiphase checkpoint in
    model.init_from (continued pretraining: its weights, and its data stream carries on after the source's
    samples), else the fresh model at step 0.
    """
    import ray.train

    latest = ray.train.get_checkpoint()
    resume = latest.path if latest is not None else resume_from
    if resume:
        with ray.train.Checkpoint(resume).as_directory() as local:
            meta = checkpoint.load(local, model, optimizer)
        return meta.step, meta.data_start
    source = run.model.init_from
    if source and storage.is_checkpoint(source):
        with ray.train.Checkpoint(source).as_directory() as local:
            return 0, checkpoint.load(local, model).data_end
    return 0, 0


def step_tokens(micro_batches: list[dict], world: int) -> torch.Tensor:
    """Labelled tokens of one optimizer step over all micro-batches of all workers."""
    tokens = sum((b["labels"] != IGNORE_INDEX).sum() for b in micro_batches)
    if world > 1:
        dist.all_reduce(tokens)
    return tokens


@torch.no_grad()
def evaluate(model, val: dict[str, list[dict]], device) -> dict[str, float]:
    model.eval()
    out = {}
    for objective, batches in val.items():
        terms = [loss_terms(model, {k: torch.as_tensor(v, device=device) for k, v in b.items()}, objective)
                 for b in batches]
        tokens = sum(int(n) for _, n in terms)
        out[f"val/{objective}_loss"] = float(sum(s for s, _ in terms)) / tokens if tokens else float("nan")
    model.train()
    return out


def train_loop(loop_config: dict) -> None:
    """Ray Train worker entry point.

    loop_config: {"run": the RunConfig as a dict, "name": run or segment name, "data_dir": prepared shards,
    "resume_from": a checkpoint to continue (same schedule) or None, "stop_at": the last step of a sweep segment
    (default: the end of the run), "exports": the steps exported as HF folders (default: train.export_steps and
    the run's end; a sweep segment passes the union its runs fine-tune), "serves": the runs a segment's checkpoints
    belong to (recorded in their meta), "wandb": {"project", "group"} or None, "progress": where rank 0 writes its
    progress beat (raybiphase.telemetry.progress) every "progress_every" seconds, or None}.
    """
    import ray.train

    run = from_dict(RunConfig, loop_config["run"])
    rank, world = _rank_world()
    device = ray.train.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")
    torch.use_deterministic_algorithms(True, warn_only=True)
    manifest = open_dataset(loop_config["data_dir"], seq_len=run.data.seq_len)
    schedule = Schedule.from_config(run)
    rows_per_step = run.train.global_batch_tokens // run.data.seq_len
    micro = run.train.micro_batch_size
    accum = rows_per_step // world // micro

    # --- model, FSDP2, optimizer, restore
    model = initial_model(run, manifest)
    model.to(device).train()
    bf16 = use_bf16(run.train.precision)
    compile = run.train.compile if run.train.compile is not None else device.type == "cuda"
    model = wrap_blocks(model, activation_checkpointing=run.train.activation_checkpointing, compile=compile)
    model = apply_fsdp(model, bf16=bf16, reshard_after_forward=run.train.reshard_after_forward)
    optim = run.optim
    fused = {"fused": True} if device.type == "cuda" else {"foreach": False}  # CPU: the reference loop's order
    optimizer = adamw(model, lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay,
                      decay_embeddings=optim.decay_embeddings, **fused)
    step, data_start = restore(run, model, optimizer, loop_config.get("resume_from"))

    wandb = loop_config.get("wandb") or {}
    tracker = wandb_log.init_run("pretrain", loop_config.get("name", "pretrain"), wandb.get("group", ""),
                                 flatten(run), wandb.get("project"), rank=rank, mode=wandb.get("mode"),
                                 sync_to=wandb.get("sync_to"))
    val = validation_batches(manifest, batch_size=micro, batches=run.train.eval_batches,
                             mask_ratio=run.train.eval_mask_ratio)
    fpt, peak = model_flops_per_token(model, run.data.seq_len), peak_flops()
    tokens_per_step = rows_per_step * run.data.seq_len
    stop_at = min(loop_config.get("stop_at") or schedule.total_steps, schedule.total_steps)  # a sweep segment's end
    exports = set(loop_config["exports"]) if loop_config.get("exports") is not None else {
        *run.train.export_steps, schedule.total_steps}
    milestones = {*schedule.boundaries[1:], schedule.decay_start, stop_at, *exports}  # always evaluated and saved
    beacon = Beacon(loop_config.get("progress") if rank == 0 else None, stop_at=stop_at,
                    tokens_per_step=tokens_per_step, every_s=loop_config.get("progress_every", 0))

    while step < stop_at:
        # --- phase: a fresh stream from this step to the phase's end (pure function of the sample ids)
        phase_idx = schedule.phase_index(step)
        phase = schedule.phases[phase_idx]
        phase_end = min(schedule.boundaries[phase_idx + 1], stop_at)
        mask = MaskingSpec(mask_ratio=phase.mask_ratio, mask_prob=run.phases.mask_prob,
                           random_prob=run.phases.random_prob) if phase.objective == "mlm" else None
        stream = phase_stream(manifest, objective=phase.objective, mask=mask, seed=run.train.seed,
                              first_step=step, steps=phase_end - step, sample_offset=data_start,
                              rows_per_step=rows_per_step, rank=rank, world=world)
        batches = iter(stream.iter_torch_batches(batch_size=micro, dtypes=torch.long, device=device))
        window_start, window_tokens = time.perf_counter(), 0
        while step < phase_end:
            # --- schedule
            _, lr = schedule.at(step)
            set_lr(optimizer, lr)

            # --- micro-steps (gradient accumulation to the global batch), each token weighing the same
            micro_batches = [next(batches) for _ in range(accum)]
            tokens = step_tokens(micro_batches, world)
            total = torch.zeros((), device=device)
            for batch in micro_batches:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda"):
                    loss_sum, count = loss_terms(model, batch, phase.objective, run.train.head_chunk_rows)
                    if run.train.loss_weighting == "tokens":
                        loss = token_weighted(loss_sum, tokens, world)
                    else:  # the mean of micro-batch means (FSDP then averages the workers)
                        loss = loss_sum / count.clamp(min=1) / accum
                loss.backward()
                total += loss_sum.detach()

            # --- clip and step
            if optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window_tokens += tokens_per_step
            beacon.beat(step, phase.objective,  # this rank's loss of the step, read only when a beat is written
                        lambda: total / sum((b["labels"] != IGNORE_INDEX).sum() for b in micro_batches),
                        fpt / (peak * world) if peak else None)

            # --- what this step does, decided once
            do_eval = step % run.train.eval_every == 0 or step in milestones
            do_save = step % run.train.checkpoint_every == 0 or step in milestones
            if not (do_eval or do_save):
                continue

            # --- eval and report
            if world > 1:
                dist.all_reduce(total)
            total /= tokens.clamp(min=1)  # the step's loss: every labelled token of the global batch, once
            seconds = time.perf_counter() - window_start
            metrics = {"step": step, "tokens_seen": step * tokens_per_step, "phase": phase_idx,
                       "objective": phase.objective, f"train/{phase.objective}_loss": float(total), "lr": lr,
                       "tokens_per_s": window_tokens / max(seconds, 1e-9),
                       "data_epochs": epochs_read(data_start + step * rows_per_step, manifest.train_rows)}
            if peak:
                metrics["mfu"] = fpt * metrics["tokens_per_s"] / (peak * world)
            if device.type == "cuda":
                metrics["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
            if do_eval:
                metrics.update(evaluate(model, val, device))
                if manifest.unigram_entropy is not None:  # the reference the held-out losses should fall below
                    metrics["unigram_entropy"] = manifest.unigram_entropy

            # --- checkpoint (and HF export) with the report, or the report alone
            if do_save:
                meta = CheckpointMeta(run=loop_config["run"], step=step, data_start=data_start, metrics=metrics,
                                      serves=list(loop_config.get("serves") or []))
                with tempfile.TemporaryDirectory() as tmp:
                    checkpoint.save(Path(tmp), model, optimizer, meta)
                    if step in exports:
                        checkpoint.export_hf(Path(storage.hf_dir(tmp)), model, manifest.local_tokenizer(),
                                             seq_len=run.data.seq_len)
                    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp),
                                     checkpoint_dir_name=storage.checkpoint_name(step))
            else:
                ray.train.report(metrics)
            wandb_log.log(tracker, {k: v for k, v in metrics.items() if k != "objective"}, step=step)
            window_start, window_tokens = time.perf_counter(), 0
    wandb_log.finish(tracker)
