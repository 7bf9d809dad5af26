"""The step's loss at the paper's scale, checked on CPU against the plain references: the chunked linear
cross-entropy equals `F.cross_entropy` on full logits (value and gradients), the sparse MLM head equals the full
head, the token-weighted loss of any micro-batch and worker split equals one big batch's, and activation
checkpointing or torch.compile change nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raybiphase.data.masking import MaskingSpec, clm_labels, mlm_mask
from raybiphase.pretrain.loss import linear_cross_entropy, token_weighted
from raybiphase.pretrain.model import build_model, loss_terms, token_loss
from raybiphase.pretrain.parallel import wrap_blocks

VOCAB = 96
SPECIALS = {"bos_token": 0, "eos_token": 1, "pad_token": 2, "mask_token": 3}


def _grads(params) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in params]


@pytest.mark.parametrize("chunk_rows", [1, 7, 4096])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_linear_cross_entropy_equals_full_logits(chunk_rows, bias):
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(37, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(VOCAB, 16, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(VOCAB, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    labels = torch.randint(0, VOCAB, (37,), generator=g)
    ours = linear_cross_entropy(rows, weight, labels, b, chunk_rows=chunk_rows)
    ours.backward()
    mine = _grads([rows, weight, *([b] if bias else [])])
    for p in (rows, weight, b):
        if p is not None:
            p.grad = None
    reference = F.cross_entropy(F.linear(rows, weight, b), labels, reduction="sum")
    reference.backward()
    torch.testing.assert_close(ours.double(), reference, rtol=1e-6, atol=1e-6)  # the loss is accumulated in fp32
    for a, r in zip(mine, _grads([rows, weight, *([b] if bias else [])])):
        torch.testing.assert_close(a, r, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=0)


def _batch(objective: str, seed: int, rows: int = 4, length: int = 24) -> dict[str, torch.Tensor]:
    x = np.random.default_rng(seed).integers(4, VOCAB, (rows, length))
    if objective == "clm":
        inputs, labels = clm_labels(x)
    else:
        inputs, labels = mlm_mask(x, np.arange(seed * rows, (seed + 1) * rows), seed=seed,
                                  spec=MaskingSpec(mask_ratio=0.4), mask_token_id=3, vocab_size=VOCAB,
                                  special_ids=list(SPECIALS.values()))
    return {"input_ids": torch.as_tensor(inputs), "labels": torch.as_tensor(labels)}


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_sparse_head_gives_the_full_logits_loss_and_gradients(model, objective):
    batch = _batch(objective, seed=1)
    model.zero_grad()
    total, tokens = loss_terms(model, batch, objective, chunk_rows=5)
    (total / tokens).backward()
    sparse = _grads(model.parameters())
    model.zero_grad()
    logits = model(input_ids=batch["input_ids"], is_causal=objective == "clm").logits  # full B x S x V logits
    full = token_loss(logits, batch["labels"])
    full.backward()
    torch.testing.assert_close(total / tokens, full, rtol=1e-6, atol=1e-6)
    assert int(tokens) == int((batch["labels"] != -100).sum())
    for a, b in zip(sparse, _grads(model.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def _split_gradients(model, batches, objective, world: int, weighting: str) -> list[torch.Tensor]:
    """Gradients of one step when `batches` (micro-batches in order) are dealt to `world` workers in contiguous
    slices, each worker accumulating its own, then averaged as FSDP averages them."""
    per_worker = len(batches) // world
    tokens = sum((b["labels"] != -100).sum() for b in batches)  # what step_tokens all-reduces
    summed = None
    for rank in range(world):
        model.zero_grad()
        for batch in batches[rank * per_worker:(rank + 1) * per_worker]:
            loss_sum, count = loss_terms(model, batch, objective)
            if weighting == "tokens":
                loss = token_weighted(loss_sum, tokens, world)
            else:
                loss = loss_sum / count / per_worker
            loss.backward()
        grads = _grads(model.parameters())
        summed = grads if summed is None else [a + b for a, b in zip(summed, grads)]
    return [g / world for g in summed]


@pytest.mark.slow  # seconds of model training
def test_token_weighted_loss_equals_one_big_batch_whatever_the_split(model):
    # MLM micro-batches with different numbers of masked tokens (different lengths of rows masked at 40%)
    batches = [_batch("mlm", seed=s, rows=2, length=length) for s, length in enumerate((8, 16, 24, 32))]
    # the reference: one batch holding every labelled token, each weighing the same
    model.zero_grad()
    sums, counts = zip(*(loss_terms(model, b, "mlm") for b in batches))
    (sum(sums) / sum(counts)).backward()
    big = _grads(model.parameters())
    for world in (1, 2, 4):
        split = _split_gradients(model, batches, "mlm", world, "tokens")
        for a, b in zip(split, big):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # the old mean of micro-batch means weighs the tokens of short micro-batches more: not the big batch
    old = _split_gradients(model, batches, "mlm", 1, "micro_batch_mean")
    assert not all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(old, big))


def test_activation_checkpointing_changes_no_gradient():
    batch = _batch("mlm", seed=2)
    plain = build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=0)
    checkpointed = wrap_blocks(build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=0),
                               activation_checkpointing=True, compile=False)
    checkpointed.train()
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()  # checkpoints and exports unchanged
    grads = []
    for m in (plain, checkpointed):
        total, tokens = loss_terms(m, batch, "mlm")
        (total / tokens).backward()
        grads.append(_grads(m.parameters()))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.slow
def test_a_compiled_step_equals_an_eager_one():
    """torch.compile of each block (inductor, on CPU here) gives the same loss and gradients."""
    batch = _batch("clm", seed=3)
    eager = build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=0)
    compiled = wrap_blocks(build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=0),
                           activation_checkpointing=False, compile=True)
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    out = []
    for m in (eager, compiled):
        total, tokens = loss_terms(m, batch, "clm")
        (total / tokens).backward()
        out.append((total.detach(), _grads(m.parameters())))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(out[0][1], out[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
