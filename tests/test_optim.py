"""The optimizer set up once for pretraining and fine-tuning: the weight-decay rule and the WSD learning rate."""

from __future__ import annotations

import pytest
import torch

from raybiphase.optim import adamw, param_groups
from raybiphase.phases import wsd_lr


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 3))


def test_matrices_decay_norms_and_biases_do_not():
    model = _model()
    decayed, plain = param_groups(model, 0.1)
    embedding, norm, linear = model
    assert {id(p) for p in decayed["params"]} == {id(embedding.weight), id(linear.weight)}
    assert {id(p) for p in plain["params"]} == {id(norm.weight), id(norm.bias), id(linear.bias)}
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0


def test_embeddings_can_be_left_undecayed():
    model = _model()
    decayed, plain = param_groups(model, 0.1, decay_embeddings=False)
    assert [id(p) for p in decayed["params"]] == [id(model[2].weight)]
    assert id(model[0].weight) in {id(p) for p in plain["params"]}


def test_a_decayed_step_shrinks_only_matrices():
    model = _model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = adamw(model, lr=0.1, betas=(0.9, 0.95), eps=1e-5, weight_decay=0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient: any change is weight decay
    optimizer.step()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed == {"0.weight", "2.weight"}


def test_wsd_warms_up_holds_then_decays_towards_zero():
    lrs = [wsd_lr(s, peak=1.0, total=20, warmup=4, decay=4) for s in range(20)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4:16] == [1.0] * 12
    assert lrs[16:] == pytest.approx([0.8, 0.6, 0.4, 0.2])  # the step after the last would be 0


def test_wsd_before_the_decay_does_not_depend_on_the_run_length():
    """What lets a sweep share the prefix of runs of different budgets."""
    short = [wsd_lr(s, peak=1.0, total=30, warmup=5, decay=5) for s in range(25)]
    long = [wsd_lr(s, peak=1.0, total=90, warmup=5, decay=5) for s in range(25)]
    assert short == long


def test_fine_tuning_decays_from_the_end_of_its_warmup():
    total, warmup = 10, 2
    lrs = [wsd_lr(s, peak=1.0, total=total, warmup=warmup, decay=total - warmup) for s in range(total)]
    assert lrs[:2] == [0.5, 1.0] and lrs[-1] == pytest.approx(1 / 9)
    assert lrs[2:] == sorted(lrs[2:], reverse=True) and all(lr > 0 for lr in lrs)
