"""How the model trains on its devices, kept outside the model: activation checkpointing and torch.compile per
transformer block, then FSDP2 (`fully_shard` per block, then the root).

bf16 parameters with fp32 gradient reduction on CUDA; fp32 everywhere on CPU (gloo). A single process
(one worker) trains the plain module. The step's loss (`raybiphase.pretrain.model.sparse_loss`:
the encoder, then the head on labelled rows) is registered as a forward method of the root, so FSDP gathers the
root's parameters (embeddings, final norm, LM head) around it as it does around `forward`.
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist

from raybiphase.pretrain.model import sparse_loss


def use_bf16(precision: str) -> bool:
    return precision == "bf16" or (precision == "auto" and torch.cuda.is_available())


def wrap_blocks(model: torch.nn.Module, *, activation_checkpointing: bool, compile: bool) -> torch.nn.Module:
    """Activation checkpointing (transformers' own, non-reentrant) and/or torch.compile of each transformer block,
    both in place: parameter names, checkpoints and HF exports stay those of the plain model."""
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if compile:
        for block in model.model.layers:
            block.compile()
    return model


def apply_fsdp(model: torch.nn.Module, *, bf16: bool, reshard_after_forward: bool = True) -> torch.nn.Module:
    """Shard each block and the root across the default process group (a no-op without one)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method


    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for block in model.model.layers:
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    model.sparse_loss = types.MethodType(sparse_loss, model)
    register_fsdp_forward_method(model, "sparse_loss")
    return model
