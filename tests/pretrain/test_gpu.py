"""The step on CUDA (`pytest -m gpu`; skipped where torch sees no GPU): bf16 against fp32, causal attention on
every SDPA kernel, the fused head's loss, a checkpoint saved on the GPU resuming to the same next step."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from raybiphase.pretrain.model import build_model, loss_terms

pytestmark = pytest.mark.gpu

SPECIALS = {"bos_token": 0, "eos_token": 1, "pad_token": 2, "mask_token": 3}
VOCAB = 4096
CUDA = torch.device("cuda", 0) if torch.cuda.is_available() else None


def _model(size: str = "mini", attn: str = "sdpa", seed: int = 0):
    return build_model(size, vocab_size=VOCAB, special_ids=SPECIALS, seed=seed, attn_implementation=attn).to(CUDA)


def _batch(objective: str, rows: int = 4, seq: int = 256, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, VOCAB, (rows, seq + 1), generator=g)
    if objective == "clm":
        return {"input_ids": x[:, :-1].to(CUDA), "labels": x[:, 1:].to(CUDA)}
    labels = torch.full((rows, seq), -100)
    keep = torch.rand((rows, seq), generator=g) < 0.4
    labels[keep] = x[:, :-1][keep]
    inputs = x[:, :-1].clone()
    inputs[keep] = SPECIALS["mask_token"]
    return {"input_ids": inputs.to(CUDA), "labels": labels.to(CUDA)}


def _loss_and_grads(model, batch, objective, bf16: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        total, tokens = loss_terms(model, batch, objective)
        loss = total / tokens
    loss.backward()
    return float(loss.detach()), torch.cat([p.grad.flatten().float() for p in model.parameters()])


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_a_bf16_step_agrees_with_fp32(objective):
    """bf16 autocast (the training precision on CUDA) against fp32 on the same weights and batch: the loss within
    1% and the full gradient within 5% relative norm (bf16 keeps 8 bits of mantissa)."""
    model, batch = _model(), _batch(objective)
    torch.backends.cuda.matmul.allow_tf32 = False
    loss32, grad32 = _loss_and_grads(model, batch, objective, bf16=False)
    loss16, grad16 = _loss_and_grads(model, batch, objective, bf16=True)
    assert abs(loss16 - loss32) / loss32 < 1e-2, (loss16, loss32)
    assert float((grad16 - grad32).norm() / grad32.norm()) < 5e-2


def _backends():
    from torch.nn.attention import SDPBackend

    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]


@pytest.mark.parametrize("backend", _backends(), ids=lambda b: b.name.lower())
def test_causal_attention_never_looks_ahead_on_every_sdpa_kernel(backend):
    """Changing token 100 leaves every position before it unchanged in causal mode, and changes them in
    bidirectional mode, whichever SDPA kernel runs (the 210m shape: head dim 64, bf16)."""
    from torch.nn.attention import sdpa_kernel

    model = _model("210m").eval()
    x = _batch("clm", rows=2, seq=256)["input_ids"]
    y = x.clone()
    y[:, 100] = (y[:, 100] + 1) % VOCAB
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel([backend]):
        try:
            causal = [model.model(input_ids=t, is_causal=True).last_hidden_state for t in (x, y)]
        except RuntimeError as err:
            if "No available kernel" in str(err):
                pytest.skip(f"{backend.name} does not run here: {err}")
            raise
        bidirectional = [model.model(input_ids=t).last_hidden_state for t in (x, y)]
    assert torch.equal(causal[0][:, :100], causal[1][:, :100])
    assert not torch.equal(causal[0][:, 100:], causal[1][:, 100:])
    assert not torch.allclose(bidirectional[0][:, :100], bidirectional[1][:, :100])


def test_causal_attention_never_looks_ahead_with_flash_attention_2():
    pytest.importorskip("flash_attn")
    model = _model("210m", attn="flash_attention_2").eval()
    x = _batch("clm", rows=2, seq=256)["input_ids"]
    y = x.clone()
    y[:, 100] = (y[:, 100] + 1) % VOCAB
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = (model.model(input_ids=t, is_causal=True).last_hidden_state for t in (x, y))
    assert torch.equal(a[:, :100], b[:, :100]) and not torch.equal(a[:, 100:], b[:, 100:])


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_the_fused_head_gives_the_full_logits_loss_on_cuda(objective):
    """The step's head (liger-kernel's fused linear cross-entropy when installed, else the chunked one) against
    full fp32 logits, under bf16 autocast as in training."""
    from raybiphase.pretrain.model import token_loss

    model, batch = _model(), _batch(objective)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        total, tokens = loss_terms(model, batch, objective)
        reference = token_loss(model(input_ids=batch["input_ids"], is_causal=objective == "clm").logits, batch["labels"])
    assert abs(float(total / tokens) - float(reference)) < 1e-2 * float(reference)


def test_the_fused_heads_gradients_are_those_of_full_fp32_logits_on_cuda():
    """Under bf16 autocast, in chunks (four here), the head's loss and the gradients of its weight and of the hidden
    rows agree with fp32 logits computed whole, up to bf16 rounding."""
    import torch.nn.functional as F

    from raybiphase.pretrain.loss import linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    rows = torch.randn(8192, 256, generator=g).to(CUDA).requires_grad_()
    weight = (torch.randn(32768, 256, generator=g) * 0.05).to(CUDA).requires_grad_()
    labels = torch.randint(0, 32768, (8192,), generator=g).to(CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        total = linear_cross_entropy(rows, weight, labels)
    total.backward()
    got = (float(total), rows.grad.clone(), weight.grad.clone())
    rows.grad = weight.grad = None
    reference = F.cross_entropy(rows @ weight.T, labels, reduction="sum")
    reference.backward()
    assert abs(got[0] - float(reference)) < 1e-2 * float(reference)
    for fused, full in zip(got[1:], (rows.grad, weight.grad)):
        assert fused.dtype == full.dtype == torch.float32
        assert float(F.cosine_similarity(fused.flatten(), full.flatten(), dim=0)) > 0.999
        assert abs(float(fused.norm() / full.norm()) - 1) < 1e-2


def test_a_checkpoint_saved_on_cuda_resumes_to_the_same_next_step(tmp_path):
    """Three bf16 steps on the GPU, save (DCP), load into other weights, one more step on each: the same loss and
    the same weights (the run's deterministic settings)."""
    from raybiphase.checkpoint_meta import CheckpointMeta
    from raybiphase.config import RunConfig, from_dict, to_dict
    from raybiphase.optim import adamw
    from raybiphase.pretrain import checkpoint

    torch.use_deterministic_algorithms(True, warn_only=True)

    def fresh(seed):
        model = _model(seed=seed)
        return model, adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)

    def step(model, optimizer, seed) -> float:
        loss, _ = _loss_and_grads(model, _batch("clm", seed=seed), "clm", bf16=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    run = from_dict(RunConfig, {"phases": {"steps": 10}, "data": {"seq_len": 256},
                                "optim": {"warmup_steps": 2, "decay_steps": 2},
                                "train": {"global_batch_tokens": 1024, "micro_batch_size": 4},
                                "resources": {"num_workers": 1}})
    model, optimizer = fresh(0)
    for s in range(3):
        step(model, optimizer, s)
    checkpoint.save(tmp_path, model, optimizer, CheckpointMeta(run=to_dict(run), step=3, data_start=0, metrics={}))
    restored, restored_optimizer = fresh(1)
    checkpoint.load(tmp_path, restored, restored_optimizer)
    assert all(p.is_cuda for p in restored.parameters())
    assert step(model, optimizer, 3) == step(restored, restored_optimizer, 3)
    for name, tensor in model.state_dict().items():
        assert torch.equal(restored.state_dict()[name], tensor), name
    torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_a_block_that_starts_with_the_pad_token_keeps_finite_gradients(objective):
    """Llama-3 pads with eos, the packed data's document separator; a block may start with it. With the pad row
    frozen at zero (transformers' padding_idx) the 610m step's gradients turned NaN on an H100 in bf16."""
    model = _model("210m")
    batch = _batch(objective)
    batch["input_ids"][:, 0] = SPECIALS["pad_token"]
    _, grads = _loss_and_grads(model, batch, objective, bf16=True)
    assert torch.isfinite(grads).all() and model.model.embed_tokens.weight.grad[SPECIALS["pad_token"]].any()


def _every_backend():
    """(attn_implementation, SDPA kernel or None) for every attention backend this GPU may offer; flash-attn's
    own kernels only where its package is installed."""
    kernels = [("sdpa", kernel) for kernel in _backends()]
    flash = [pytest.param("flash_attention_2", None, marks=pytest.mark.skipif(
        importlib.util.find_spec("flash_attn") is None, reason="the flash_attn package is not installed"))]
    return kernels + [("flex_attention", None)] + flash


def _on_backend(attn: str, kernel):
    import contextlib

    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel([kernel]) if kernel is not None else contextlib.nullcontext()


def _run_or_skip(fn):
    try:
        return fn()
    except RuntimeError as err:
        if "No available kernel" in str(err):
            pytest.skip(f"this kernel does not run this case here: {err}")
        raise


@pytest.mark.parametrize("attn,kernel", _every_backend(), ids=lambda v: getattr(v, "name", str(v)).lower())
def test_the_training_step_never_looks_ahead_on_every_backend(attn, kernel):
    """The step's own path (`loss_terms`: encoder, sparse head, bf16 autocast) at the 210m shape: with labels on the
    first 100 positions only, tokens changed from position 101 on leave the CLM loss bit-identical and change the
    MLM loss, whichever attention backend runs (flex gets a causal block mask: it ignores `is_causal`)."""
    model = _model("210m", attn=attn).eval()
    x = _batch("clm", rows=2, seq=256)["input_ids"]
    y = x.clone()
    y[:, 101:] = (y[:, 101:] + 1) % VOCAB
    labels = torch.full_like(x, -100)
    labels[:, :100] = x[:, 1:101]

    def losses(objective):
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16), _on_backend(attn, kernel):
            return [float(loss_terms(model, {"input_ids": t, "labels": labels}, objective)[0]) for t in (x, y)]

    clm, mlm = _run_or_skip(lambda: losses("clm")), _run_or_skip(lambda: losses("mlm"))
    assert clm[0] == clm[1], clm
    assert mlm[0] != mlm[1], mlm


@pytest.mark.parametrize("attn,kernel", _every_backend(), ids=lambda v: getattr(v, "name", str(v)).lower())
def test_fine_tuning_attends_both_ways_and_never_to_padding_on_every_backend(attn, kernel):
    """Fine-tuning's forward (the encoder with the padding mask of a batch, bf16 autocast, as the heads call it):
    a token changed at position 100 changes the positions before it (bidirectional), and a row padded with 56 pad
    tokens behind its mask gives its real positions the hidden states it has alone, up to bf16 rounding (under a
    tenth of what attending to the padding changes)."""
    model = _model("210m", attn=attn).eval()
    x = _batch("clm", rows=2, seq=200)["input_ids"]
    y = x.clone()
    y[:, 100] = (y[:, 100] + 1) % VOCAB
    padded = torch.cat([x, torch.full((2, 56), SPECIALS["pad_token"], device=CUDA)], dim=1)
    mask = torch.cat([torch.ones_like(x), torch.zeros((2, 56), dtype=x.dtype, device=CUDA)], dim=1)

    def hidden(ids, attention_mask=None):
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16), _on_backend(attn, kernel):
            return model.model(input_ids=ids, attention_mask=attention_mask).last_hidden_state.float()

    a, b = _run_or_skip(lambda: hidden(x)), _run_or_skip(lambda: hidden(y))
    masked, unmasked = _run_or_skip(lambda: hidden(padded, mask))[:, :200], hidden(padded)[:, :200]
    assert not torch.allclose(a[:, :100], b[:, :100])
    # what attending to the padding would do, against what the mask leaves: bf16 rounding only
    assert float((masked - a).norm()) < 0.1 * float((unmasked - a).norm())
