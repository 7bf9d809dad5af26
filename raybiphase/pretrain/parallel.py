"""FSDP2 for EuroBERT, kept outside the model: `fully_shard` per transformer block, then the root.

bf16 parameters with fp32 gradient reduction on CUDA; fp32 everywhere on CPU (gloo). A single process
(Ray Train local mode, or one worker) trains the plain module.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def use_bf16(precision: str) -> bool:
    return precision == "bf16" or (precision == "auto" and torch.cuda.is_available())


def apply_fsdp(model: torch.nn.Module, *, bf16: bool) -> torch.nn.Module:
    """Shard each block and the root across the default process group (a no-op without one)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for block in model.model.layers:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model
