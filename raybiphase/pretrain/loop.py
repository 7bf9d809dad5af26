"""The phase-aware pretraining loop that runs on every Ray Train worker.

Read top to bottom: set up (model, FSDP2, AdamW, restore), then one optimizer step per iteration in fixed
sections: schedule, micro-steps, clip and step, what this step does (decided once), eval and report, checkpoint. The phase of a step (CLM with
a causal mask, MLM bidirectional at its ratio) and its learning rate come from `Schedule.at(step)`; data for
step k is global batch k (raybiphase.data.stream), so resuming or branching at any step is exact.

Metrics (one dotted namespace, each a field of raybiphase.telemetry.metrics.PretrainReport): step, tokens_seen,
phase, objective, train/{clm,mlm}_loss, val/clm_loss, val/mlm_loss, lr, tokens_per_s, unigram_entropy (with the
evaluations: the corpus' unigram entropy, a reference), and on GPU mfu and peak_mem_gb (this worker's peak
allocated memory), where
    model FLOPs per token = 6 * (N_nonembedding + LM head) + 12 * layers * hidden * seq_len   (PaLM, appendix B;
                            raybiphase.config.sizes.flops_per_token)
    mfu = FLOPs per token * tokens_per_s / (peak bf16 FLOP/s of the device * world size).
"""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path

import ray.train
import torch
import torch.distributed as dist

from raybiphase import locks, storage
from raybiphase.checkpoint_meta import CheckpointMeta
from raybiphase.config import MASKED, Phase, RunConfig, flatten, to_dict
from raybiphase.config.sizes import PEAK_BF16_TFLOPS, flops_per_token
from raybiphase.data.masking import IGNORE_INDEX, MaskingSpec
from raybiphase.data.stream import epochs_read, open_dataset, phase_stream, validation_batches
from raybiphase.failures import FailurePolicy
from raybiphase.optim import adamw, drop_grads, fill_fresh_state, reset_moments, set_lr
from raybiphase.phases import Schedule
from raybiphase.pretrain import checkpoint, preemption
from raybiphase.pretrain.job import SegmentJob
from raybiphase.pretrain.loss import token_weighted
from raybiphase.pretrain.model import block_parameters, initial_model, loss_terms
from raybiphase.pretrain.parallel import apply_fsdp, use_bf16, wrap_blocks
from raybiphase.telemetry import wandb as wandb_log
from raybiphase.telemetry import wandb_live
from raybiphase.telemetry.history import RESUME_POINT, History
from raybiphase.telemetry.metrics import PretrainReport
from raybiphase.telemetry.progress import ProgressWriter


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


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def restore(run: RunConfig, model, optimizer, resume_from: str | None, run_dir: str) -> tuple[int, int]:
    """Where this worker starts, as (step, data_start); the one resume path.

    In order: the newest committed checkpoint in this run's folder (a worker or a whole node died and the group
    restarted, or the run is started again; committed means its meta was written after every shard, so one whose
    upload was cut short is passed over, and one that was committed before Ray Train registered it still counts:
    a node lost between the two would otherwise restart the segment from its start; one whose files are not those
    its meta recorded, sizes and SHA-256, is passed over with a line for the one before it), else `resume_from` (a sweep
    segment continuing its parent's checkpoint, same schedule), else a raybiphase checkpoint in model.init_from
    (continued pretraining: its weights, and its data stream carries on after the source's samples), else the
    fresh model at step 0.
    """
    for resume in itertools.chain(checkpoint.committed(run_dir), [resume_from] if resume_from else []):
        try:
            with ray.train.Checkpoint(resume).as_directory() as local:
                meta = checkpoint.load(local, model, optimizer, name=resume)
        except checkpoint.Damaged as err:  # checked before any weight is set: the policy passes it over, or raises
            print(FailurePolicy().damaged(err, older=resume != resume_from), flush=True)
            continue
        return meta.step, meta.data_start
    source = run.model.init_from
    if source and storage.is_checkpoint(source):
        with ray.train.Checkpoint(source).as_directory() as local:
            return 0, checkpoint.load(local, model, name=source).data_end
    return 0, 0


def masking_spec(phase: Phase, run: RunConfig, *, first_sample: int, rows_per_step: int) -> MaskingSpec:
    """An MLM phase's masking: its ratio, fixed, scheduled over the phase's steps (from the phase's first sample id)
    or drawn per sequence, and the run's mask/random split."""
    ramp = (first_sample, rows_per_step, phase.steps) if phase.mask_ratio_end is not None else None
    return MaskingSpec(mask_ratio=phase.mask_ratio, mask_prob=run.phases.mask_prob, random_prob=run.phases.random_prob,
                       ratio_end=phase.mask_ratio_end, ramp=ramp, ratio_range=phase.mask_ratio_range)


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


def train_loop(loop_config: dict) -> list[dict] | None:
    """Ray Train worker entry point: `loop_config["job"]` is the worker's SegmentJob (raybiphase.pretrain.job).
    Returns, on rank 0, every report of the run folder in step order (its history's: what an earlier attempt
    reported, then this one's), which Ray Train hands the driver as the fit's `Result.return_value`; None on the
    other ranks. Once the driver's lease is lost, the worker's writes to the sweep folder are refused
    (raybiphase.locks.fence): it commits no checkpoint more."""
    locks.fence_from_env()
    return Worker(loop_config["job"]).train()


class Worker:
    """One worker's training: set up in __init__ (model, FSDP2, AdamW, restore, validation batches, telemetry),
    then `train` runs phase after phase, one optimizer step at a time."""

    def __init__(self, job: SegmentJob):
        self.job, self.run = job, job.run
        run = job.run
        self.rank, self.world = rank_world()
        self.device = ray.train.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")
        torch.use_deterministic_algorithms(True, warn_only=True)
        self.manifest = open_dataset(job.data_dir, seq_len=run.data.seq_len)
        self.schedule = Schedule.from_config(run)
        self.rows_per_step = run.rows_per_step
        self.accum = self.rows_per_step // self.world // run.train.micro_batch_size
        self.tokens_per_step = self.rows_per_step * run.data.seq_len
        self.bf16 = use_bf16(run.train.precision)
        self.model, self.optimizer = self._model_and_optimizer()
        self.step, self.data_start = restore(run, self.model, self.optimizer, job.resume_from, job.run_dir)

        # rank 0 logs live to the segment's W&B run (stable id: a restart continues it)
        self.tracker = wandb_live.segment_run(job.wandb, job.name, flatten(run), self.rank)
        self.val = validation_batches(self.manifest, batch_size=run.train.micro_batch_size,
                                      batches=run.train.eval_batches, mask_ratio=run.train.eval_mask_ratio,
                                      mntp=any(p.objective == "mntp" for p in self.schedule.phases))
        self.fpt, self.peak = model_flops_per_token(self.model, run.data.seq_len), peak_flops()
        self.policy = job.policy()  # which steps are evaluated and saved (raybiphase.pretrain.policy)
        self.stop_at = self.policy.stop_at  # a sweep segment's end
        # rank 0 keeps the run's history.json as it reports (raybiphase.telemetry.history)
        self.history = History(job.run_dir) if self.rank == 0 else None
        self.beacon = ProgressWriter(job.progress if self.rank == 0 else None, stop_at=self.stop_at,
                             tokens_per_step=self.tokens_per_step, every_s=job.progress_every)
        # SIGTERM, a spot VM's notice: checkpoint after the step, restart from it
        preemption.install(self.world)
        self.drain_saved = False  # a drain notice checkpoints once; training goes on until Ray Train's restart

    def _model_and_optimizer(self):
        run, device = self.run, self.device
        model = initial_model(run, self.manifest)
        model.to(device).train()
        compile = run.train.compile if run.train.compile is not None else device.type == "cuda"
        model = wrap_blocks(model, activation_checkpointing=run.train.activation_checkpointing, compile=compile)
        model = apply_fsdp(model, bf16=self.bf16, reshard_after_forward=run.train.reshard_after_forward)
        optim = run.optim
        fused = {"fused": True} if device.type == "cuda" else {"foreach": False}  # CPU: the reference loop's order
        optimizer = adamw(model, lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay,
                          decay_embeddings=optim.decay_embeddings, **fused)
        return model, optimizer

    def train(self) -> list[dict] | None:
        """Train to the segment's end; rank 0's reports (train_loop), None on the other ranks."""
        while self.step < self.stop_at:
            self._phase()
        wandb_log.finish(self.tracker)
        return self.history.reports() if self.history is not None else None

    def _phase(self) -> None:
        """From this step to the end of its phase (or of the segment): a fresh stream, a pure function of the
        sample ids."""
        run, schedule = self.run, self.schedule
        phase_idx = schedule.phase_index(self.step)
        phase = schedule.phases[phase_idx]
        phase_end = min(schedule.boundaries[phase_idx + 1], self.stop_at)
        mask = masking_spec(phase, run, first_sample=self.data_start + schedule.boundaries[phase_idx] * self.rows_per_step,
                            rows_per_step=self.rows_per_step) if phase.objective in MASKED else None
        stream = phase_stream(self.manifest, objective=phase.objective, mask=mask, seed=run.train.seed,
                              first_step=self.step, steps=phase_end - self.step, sample_offset=self.data_start,
                              rows_per_step=self.rows_per_step, rank=self.rank, world=self.world,
                              shuffle_rows=run.data.row_order == "shuffled")
        batches = iter(stream.iter_torch_batches(batch_size=run.train.micro_batch_size, dtypes=torch.long,
                                                 device=self.device))
        if schedule.resets_optimizer(self.step):  # a phase that starts from the weights only (optimizer: reset)
            reset_moments(self.optimizer)
        frozen = block_parameters(self.model, phase.frozen_layers)
        if frozen:  # their state must be in every checkpoint, as it is when they train
            fill_fresh_state(self.optimizer)
        window_start, window_tokens = time.perf_counter(), 0
        while self.step < phase_end:
            _, lr = schedule.at(self.step)
            set_lr(self.optimizer, lr)
            total, tokens = self._optimizer_step([next(batches) for _ in range(self.accum)], phase.objective,
                                                 frozen)
            window_tokens += self.tokens_per_step
            notice = preemption.requested(self.world)
            save_for = ("signal" if notice == preemption.SIGNAL else  # a drain checkpoints once, then trains on
                        "drain" if notice == preemption.DRAIN and not self.drain_saved else "")
            self.drain_saved = self.drain_saved or notice == preemption.DRAIN
            if self._report(phase_idx, phase.objective, lr, total, tokens, time.perf_counter() - window_start,
                            window_tokens, save_for=save_for):
                window_start, window_tokens = time.perf_counter(), 0
            if notice == preemption.SIGNAL and self.step < self.stop_at:  # at the segment's end it is simply done
                preemption.wait_for_controller()
                raise preemption.Preempted(f"preemption notice: checkpoint written at step {self.step}; Ray Train "
                                           "restarts the segment from it")

    def _optimizer_step(self, micro_batches: list[dict], objective: str,
                        frozen: list[torch.nn.Parameter]) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-steps (gradient accumulation to the global batch, each token weighing the same), the frozen
        blocks' gradients dropped, clip and step; returns this rank's summed loss and the global batch's labelled
        tokens."""
        run, device = self.run, self.device
        tokens = step_tokens(micro_batches, self.world)
        total = torch.zeros((), device=device)
        for batch in micro_batches:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16 and device.type == "cuda"):
                loss_sum, count = loss_terms(self.model, batch, objective, run.train.head_chunk_rows)
                if run.train.loss_weighting == "tokens":
                    loss = token_weighted(loss_sum, tokens, self.world)
                else:  # the mean of micro-batch means (FSDP then averages the workers)
                    loss = loss_sum / count.clamp(min=1) / self.accum
            loss.backward()
            total += loss_sum.detach()
        drop_grads(frozen)
        if run.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), run.optim.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.beacon.beat(self.step, objective,  # this rank's loss of the step, read only when a beat is written
                         lambda: total / sum((b["labels"] != IGNORE_INDEX).sum() for b in micro_batches),
                         self.fpt / (self.peak * self.world) if self.peak else None)
        return total, tokens

    def _report(self, phase_idx: int, objective: str, lr: float, total: torch.Tensor, tokens: torch.Tensor,
                seconds: float, window_tokens: int, save_for: str = "") -> bool:
        """Eval and report at this step when it is due, with a checkpoint (and an HF export) when that is due or a
        notice asks for one (`save_for`: "signal" or "drain"); whether it reported."""
        step = self.step
        do_eval, due_save = self.policy.evaluates(step), self.policy.saves(step)
        do_save = bool(save_for) or due_save
        if not (do_eval or do_save):
            return False
        if self.world > 1:
            dist.all_reduce(total)
        total /= tokens.clamp(min=1)  # the step's loss: every labelled token of the global batch, once
        metrics = {"step": step, "tokens_seen": step * self.tokens_per_step, "phase": phase_idx,
                   "objective": objective, f"train/{objective}_loss": float(total), "lr": lr,
                   "tokens_per_s": window_tokens / max(seconds, 1e-9), "workers": self.world,
                   "data_epochs": epochs_read(self.data_start + step * self.rows_per_step, self.manifest.train_rows)}
        if self.peak:
            metrics["mfu"] = self.fpt * metrics["tokens_per_s"] / (self.peak * self.world)
        if not (do_eval or due_save):  # only a preemption notice's checkpoint: a resume point, not a result
            metrics[RESUME_POINT] = True
        if self.device.type == "cuda":
            metrics["peak_mem_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
        if do_eval:
            metrics.update(evaluate(self.model, self.val, self.device))
            if self.manifest.unigram_entropy is not None:  # the reference the held-out losses should fall below
                metrics["unigram_entropy"] = self.manifest.unigram_entropy
        metrics = PretrainReport.from_columns(metrics).columns()  # every metric a declared, described field
        if do_save:
            self._save(metrics, save_for)
        else:
            ray.train.report(metrics)
            if self.history is not None:
                self.history.add(metrics)
        wandb_log.log(self.tracker, {k: v for k, v in metrics.items() if k != "objective"}, step=step)
        return True

    def _save(self, metrics: dict, notice: str = "") -> None:
        """A checkpoint (and, at an export step, the HF folder inside it) reported with the metrics: Ray Train
        uploads each rank's part into the run's folder (its run folder is `job.run_dir`); once every rank's part is
        uploaded, rank 0 commits it (its meta, written last)."""
        meta = CheckpointMeta(run=to_dict(self.run), step=self.step, data_start=self.data_start, metrics=metrics,
                              serves=list(self.job.serves), notice=notice)
        name = storage.checkpoint_name(self.step)
        location = storage.join(self.job.run_dir, name)
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint.save_shards(Path(tmp), self.model, self.optimizer)
            if self.step in self.policy.exports:
                checkpoint.export_hf(Path(storage.hf_dir(tmp)), self.model, self.manifest.local_tokenizer(),
                                     seq_len=self.run.data.seq_len)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp), checkpoint_dir_name=name)
        if self.world > 1 and dist.is_initialized():
            dist.barrier()  # every rank's upload has returned: a shard still being copied is never committed
        if self.rank == 0:
            checkpoint.commit(location, meta, ranks=self.world)
            wandb_live.log_checkpoint(self.tracker, location, name=self.job.name, step=self.step,
                                      export=self.step in self.policy.exports)
        if self.history is not None:
            self.history.add(metrics, location)
