"""Cross-entropy over the LM head without a full fp32 logits tensor, and the token-weighted batch loss.

At the paper's scale (vocabulary 128,256, 2,048-token blocks) the logits of one micro-batch are gigabytes, and
their fp32 copy and gradient twice that. The step never builds them:

* sparse prediction: only the rows whose label is not IGNORE_INDEX reach the head (MLM: the masked ~40%; CLM: every
  row but padding), gathered from the encoder's hidden states (`labelled_rows`);
* `linear_cross_entropy`: the head's matmul and the cross-entropy in chunks of `chunk_rows` rows, computing the
  gradients of the hidden rows and of the head's weight chunk by chunk in the forward pass (the technique of fused
  linear cross-entropy kernels), so at most one (chunk_rows x vocabulary) fp32 block exists at a time; the
  backward pass only scales the stored gradients. On CUDA with liger-kernel installed, its fused Triton kernel
  does the same work (`fused_kernel_available`).

Both return the *sum* of the token losses; the caller divides by the number of labelled tokens of the whole global
batch (`token_weighted`): every labelled token of a step weighs the same whatever the micro-batch and worker split.

    total = linear_cross_entropy(rows, model.lm_head.weight, labels)   # == F.cross_entropy(rows @ W.T, labels, reduction="sum")
"""

from __future__ import annotations

import functools
import importlib.util
import inspect

import torch
import torch.nn.functional as F

from raybiphase.data.masking import IGNORE_INDEX

CHUNK_ROWS = 2048  # rows of logits per chunk: 2,048 x 128,256 fp32 = 1 GiB at the paper's vocabulary


def labelled_rows(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows of `hidden` whose label is not IGNORE_INDEX, their labels): (B, S, H), (B, S) -> (N, H), (N,)."""
    keep = labels != IGNORE_INDEX
    return hidden[keep], labels[keep]


class _ChunkedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, weight, bias, labels, chunk_rows):
        grad_rows = torch.empty_like(rows)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if bias is not None else None
        total = torch.zeros((), dtype=torch.float32, device=rows.device)
        for start in range(0, rows.shape[0], chunk_rows):
            part, target = rows[start:start + chunk_rows], labels[start:start + chunk_rows]
            logits = F.linear(part, weight, bias).float()
            log_z = torch.logsumexp(logits, dim=-1)
            total += (log_z - logits.gather(1, target[:, None]).squeeze(1)).sum()
            # d(sum of losses)/d(logits) = softmax - one_hot
            grad_logits = torch.exp(logits - log_z[:, None])
            grad_logits[torch.arange(len(target), device=target.device), target] -= 1.0
            grad_rows[start:start + chunk_rows] = (grad_logits.to(weight.dtype) @ weight).to(rows.dtype)
            grad_weight += grad_logits.T @ part.float()
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
        ctx.save_for_backward(grad_rows, grad_weight, grad_bias)
        ctx.has_bias, ctx.weight_dtype = bias is not None, weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_rows, grad_weight, grad_bias = ctx.saved_tensors
        grad_bias = (grad_bias * grad_total).to(ctx.weight_dtype) if ctx.has_bias else None
        return (grad_rows * grad_total.to(grad_rows.dtype), (grad_weight * grad_total).to(ctx.weight_dtype),
                grad_bias, None, None)


def linear_cross_entropy(rows: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         bias: torch.Tensor | None = None, *, chunk_rows: int = CHUNK_ROWS) -> torch.Tensor:
    """Sum over rows of the cross-entropy of `rows @ weight.T + bias` against `labels` (no ignored labels here:
    gather the labelled rows first). Uses the fused kernel on CUDA when installed, else the chunked function."""
    if rows.shape[0] == 0:
        return (rows.sum() + weight.sum()) * 0.0  # keeps the graph (and FSDP's hooks) when a batch has no label
    if rows.is_cuda and fused_kernel_available():
        return _fused(rows, weight, labels, bias, chunk_rows)
    return _ChunkedLinearCE.apply(rows, weight, bias, labels, chunk_rows)  # fp32, whatever the weights' dtype


def _fused(rows: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: torch.Tensor | None,
           chunk_rows: int) -> torch.Tensor:
    """liger-kernel's fused linear cross-entropy in chunks of at most `chunk_rows` rows, summed.

    Its default chunks hold rows / ceil(vocabulary / hidden) rows, rounded up to a power of two (128 of an MLM
    micro-batch's 13,107 labelled rows at 610m), and each chunk adds its product into the fp32 gradient of the whole
    head, which makes that accumulation memory-bound. `chunk_mem_const` divides the rows into at least
    ceil(rows / chunk_rows) chunks instead (2,048 rows each for 610m's MLM and CLM micro-batches of 16 x 2,048
    tokens), so at most one chunk_rows x vocabulary block of logits exists, as in the chunked function (up to
    chunk_rows x vocabulary / hidden rows, over 150,000 at 1b; liger's own sizing beyond). Under
    autocast the weight is cast to the autocast dtype once here rather than once per chunk inside the kernel's
    matmuls, and the head's gradient accumulates in fp32 (`accum_dtype`) before its one rounding, as autocast rounds
    every other layer's."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    n, hidden = rows.shape
    vocabulary = weight.shape[0]
    # liger: chunk = next_power_of_2(ceil(n / ceil(V / (c * H)))); c <= V / (H * ceil(n / chunk_rows)) keeps it
    # within chunk_rows (a power of two)
    chunk_mem_const = max(1, vocabulary // (hidden * -(-n // chunk_rows)))
    if torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        rows, weight = rows.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    out = liger_fused_linear_cross_entropy(rows, weight, labels, bias, reduction="sum", accum_dtype=torch.float32,
                                           chunk_mem_const=chunk_mem_const)
    return out[0] if isinstance(out, tuple) else out  # some versions also return the z-loss


@functools.cache
def fused_kernel_available() -> bool:
    """liger-kernel's fused linear cross-entropy (the `gpu` extra, installed on the clusters' GPU workers) is
    importable, at a version that takes the chunk size and the accumulation dtype (0.8.5 or later); else the
    chunked function runs."""
    if importlib.util.find_spec("liger_kernel") is None:
        return False
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return {"chunk_mem_const", "accum_dtype"} <= set(inspect.signature(liger_fused_linear_cross_entropy).parameters)


def token_weighted(loss_sum: torch.Tensor, global_tokens: torch.Tensor, world: int) -> torch.Tensor:
    """The share of one micro-batch in a step's loss when every labelled token of the global batch weighs the same.

    FSDP averages gradients over the `world` workers, so each worker scales its sum by world / global_tokens: the
    averaged gradient is then that of (sum of all token losses) / global_tokens, the loss of one big batch.
    """
    return loss_sum * (world / global_tokens.clamp(min=1))
