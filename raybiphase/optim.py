"""The optimizer, set up one way for pretraining and fine-tuning alike: AdamW, one weight-decay rule, one LR shape.

Weight decay: matrices decay; norms and biases (1-D parameters) never do; embedding matrices decay unless
`decay_embeddings=False` (pretraining: `optim.decay_embeddings`). The learning rate is warmup-stable-decay
(raybiphase.phases.wsd_lr, pure so that planning needs no torch): linear warmup from 0 to the peak over `warmup`
steps, constant, then linear decay towards 0 over the last `decay` steps. Fine-tuning is the special case that
decays from the end of its warmup (`decay = total - warmup`).

    optimizer = adamw(model, lr=5e-4, betas=(0.9, 0.95), eps=1e-5, weight_decay=0.1)
    set_lr(optimizer, wsd_lr(step, peak=5e-4, total=100, warmup=10, decay=10))
"""

from __future__ import annotations

import torch


def param_groups(model: torch.nn.Module, weight_decay: float, *, decay_embeddings: bool = True) -> list[dict]:
    """Two AdamW groups: the decayed matrices and the rest (norms, biases, and embeddings unless decayed)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decayed, plain = [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        is_matrix = param.ndim >= 2 and (decay_embeddings or id(param) not in embeddings)
        (decayed if is_matrix else plain).append(param)
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def adamw(model: torch.nn.Module, *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
          decay_embeddings: bool = True, **options) -> torch.optim.AdamW:
    """AdamW over `param_groups`; `options` go to torch (foreach, fused)."""
    groups = param_groups(model, weight_decay, decay_embeddings=decay_embeddings)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **options)


def reset_moments(optimizer: torch.optim.Optimizer) -> None:
    """Forget AdamW's moments and step counts: the next step is a fresh optimizer's first (bias correction
    included), on the same parameter groups and learning rate."""
    optimizer.state.clear()


def fill_fresh_state(optimizer: torch.optim.AdamW) -> None:
    """Give every parameter without AdamW state the state AdamW would create lazily at its first update (step 0,
    zero moments), so a checkpoint holds every parameter's state, frozen ones included, and resuming from it (which
    initialises the missing state with a step of its own) continues exactly as the uninterrupted run does."""
    from torch.optim.optimizer import _get_scalar_dtype

    for group in optimizer.param_groups:
        fused_or_capturable = bool(group.get("fused") or group.get("capturable"))
        for param in group["params"]:
            state = optimizer.state[param]
            if state:
                continue
            if fused_or_capturable:
                state["step"] = torch.zeros((), dtype=_get_scalar_dtype(is_fused=bool(group.get("fused"))),
                                            device=param.device)
            else:
                state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            if group.get("amsgrad"):
                state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)


def drop_grads(params: list[torch.nn.Parameter]) -> None:
    """Leave `params` out of this update: no gradient, so clipping ignores them and AdamW skips them (no decay,
    moments kept as they are)."""
    for param in params:
        param.grad = None


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
