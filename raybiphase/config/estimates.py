"""What a run's steps and checkpoints cost on the sweep's GPUs, estimated before anything runs (no torch): a step's
hours at `sweep.mfu` of `sweep.gpu_peak_tflops`, a checkpoint's stall, a segment's mean time between preemptions,
and the checkpoint interval that loses least to both (Young's rule; raybiphase.planning.bill states the model).
`train.checkpoint_every: auto` is that interval, resolved here for each run before it is planned or trained."""

from __future__ import annotations

import dataclasses
import math

from raybiphase.config.run import RunConfig
from raybiphase.config.sizes import SIZES
from raybiphase.errors import ConfigError

LLAMA3_VOCAB = 128_256
CHECKPOINT_BYTES_PER_PARAM = 12
"""fp32 weights and AdamW's two fp32 moments: what a sharded checkpoint holds per parameter."""


def vocab_size(config: RunConfig) -> int:
    """A run's vocabulary for the estimates: Llama-3's 128,256 unless a tokenizer is trained, then data.vocab_size."""
    return config.data.vocab_size if config.data.tokenizer == "train-bpe" else LLAMA3_VOCAB


def segment_gpus(config: RunConfig) -> int:
    """GPUs one segment holds (a CPU run counts its workers, so the arithmetic stays the same); an elastic segment
    (num_workers [min, max]) is planned at its max."""
    res, workers = config.resources, config.resources.max_workers
    return max(1, round(workers * res.gpus_per_worker) if res.gpus_per_worker > 0 else workers)


def step_gpu_hours(config: RunConfig, sweep, steps: int = 1) -> float:
    """GPU-hours of `steps` optimizer steps: the model's FLOPs per token x train.global_batch_tokens at sweep.mfu
    of sweep.gpu_peak_tflops (`sweep`: a SweepConfig)."""
    flops = SIZES[config.model.size].flops_per_token(vocab_size(config), config.data.seq_len)
    return flops * config.train.global_batch_tokens * steps / (sweep.gpu_peak_tflops * 1e12 * sweep.mfu) / 3600


def checkpoint_hours(config: RunConfig, sweep) -> float:
    """The stall of one checkpoint: its bytes (12 per parameter) at sweep.checkpoint_gb_per_s."""
    params = SIZES[config.model.size].params(vocab_size(config))
    return params * CHECKPOINT_BYTES_PER_PARAM / (sweep.checkpoint_gb_per_s * 1e9) / 3600


def segment_nodes(config: RunConfig, sweep) -> int:
    return max(1, math.ceil(segment_gpus(config) / sweep.gpus_per_node))


def mtbf_hours(config: RunConfig, sweep) -> float:
    """A segment's mean hours between preemptions: any of its nodes may be taken; infinite at rate 0."""
    rate = sweep.preemptions_per_node_hour * segment_nodes(config, sweep)
    return 1 / rate if rate > 0 else math.inf


def best_interval_hours(checkpoint_h: float, mtbf_h: float) -> float:
    """Young's optimum sqrt(2 C M); infinite without preemptions (only the stall counts, so fewer is better)."""
    return math.sqrt(2 * checkpoint_h * mtbf_h) if math.isfinite(mtbf_h) else math.inf


def auto_checkpoint_every(config: RunConfig, sweep) -> int:
    """Young's interval in steps for this run on the sweep's cluster, at most the run's steps (then only its
    milestones and its end are saved)."""
    step_h = step_gpu_hours(config, sweep) / segment_gpus(config)
    best = best_interval_hours(checkpoint_hours(config, sweep), mtbf_hours(config, sweep))
    steps = sum(phase.steps for phase in config.phases.resolved())
    return steps if not math.isfinite(best) else max(1, min(steps, round(best / step_h)))


def resolve_checkpoint_every(config: RunConfig, sweep) -> RunConfig:
    """The run with `train.checkpoint_every: auto` replaced by `auto_checkpoint_every`; a run on CPUs has no step
    time to weigh, so auto is refused there with one line."""
    if config.train.checkpoint_every != "auto":
        return config
    if not config.resources.gpus_per_worker:
        raise ConfigError("train.checkpoint_every: auto weighs a step's GPU time against preemptions and needs GPU "
                          "workers (resources.gpus_per_worker > 0); set a number of steps")
    every = auto_checkpoint_every(config, sweep)
    return dataclasses.replace(config, train=dataclasses.replace(config.train, checkpoint_every=every))
