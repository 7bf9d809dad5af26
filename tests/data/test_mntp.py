"""Masked next-token prediction (LLM2Vec's adaptation step): MLM's masked inputs and bidirectional
attention, each masked token predicted from the position before it; an objective beside clm and mlm in any phase,
named, planned and evaluated like them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raybiphase.config import ConfigError, RunConfig, SweepSpec, from_dict
from raybiphase.data.masking import MaskingSpec, mask_batch, mntp_labels
from raybiphase.naming import parse_phase_tag, run_name, source_objective
from raybiphase.planning.plan import make_plan, shared_steps

VOCAB, SPECIALS, MASK = 97, {"bos_token": 0, "eos_token": 1, "pad_token": 2, "mask_token": 3}, 3
OPTIM = {"warmup_steps": 2, "decay_steps": 2}


def test_mntp_labels_are_the_masked_tokens_one_position_earlier():
    mlm = np.array([[-100, 11, -100, 13, 14],
                    [20, -100, -100, -100, 24]])
    assert mntp_labels(mlm).tolist() == [[11, -100, 13, 14, -100],
                                         [-100, -100, -100, 24, -100]]  # a token masked at 0 has no position before


def test_an_mntp_batch_masks_as_mlm_does_and_shifts_the_labels():
    blocks = np.random.default_rng(0).integers(4, VOCAB, size=(8, 32))
    common = dict(seed=3, spec=MaskingSpec(mask_ratio=0.4), mask_token_id=MASK, vocab_size=VOCAB,
                  special_ids=list(SPECIALS.values()))
    batch = {"input_ids": blocks, "sample_id": np.arange(8)}
    mlm, mntp = (mask_batch(batch, objective=o, **common) for o in ("mlm", "mntp"))
    assert np.array_equal(mlm["input_ids"], mntp["input_ids"])  # the same tokens masked: a paired comparison
    masked = mlm["labels"] != -100
    rows, cols = np.nonzero(masked[:, 1:])
    assert np.array_equal(mntp["labels"][rows, cols], blocks[rows, cols + 1])
    assert (mntp["labels"] != -100).sum() == masked[:, 1:].sum()


def test_the_mntp_loss_is_next_token_cross_entropy_at_the_masked_positions_with_bidirectional_attention():
    """Against a hand computation from full logits: the step's sparse head at position i - 1 against token i, for
    every masked i, with attention both ways (a causal forward gives another loss)."""
    from raybiphase.pretrain.model import build_model, loss_terms

    model = build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=0).eval()
    blocks = np.random.default_rng(1).integers(4, VOCAB, size=(2, 24))
    out = mask_batch({"input_ids": blocks, "sample_id": np.arange(2)}, objective="mntp", seed=0,
                     spec=MaskingSpec(mask_ratio=0.4), mask_token_id=MASK, vocab_size=VOCAB,
                     special_ids=list(SPECIALS.values()))
    batch = {k: torch.as_tensor(out[k]) for k in ("input_ids", "labels")}
    with torch.no_grad():
        total, tokens = loss_terms(model, batch, "mntp")
        logits = model(input_ids=batch["input_ids"]).logits
        causal = model(input_ids=batch["input_ids"], is_causal=True).logits
    labelled = batch["labels"] != -100
    by_hand = F.cross_entropy(logits[labelled].float(), batch["labels"][labelled], reduction="sum")
    assert int(tokens) == int(labelled.sum()) > 0
    assert float(total) == pytest.approx(float(by_hand), rel=1e-5)
    assert float(total) != pytest.approx(float(F.cross_entropy(causal[labelled].float(), batch["labels"][labelled],
                                                                 reduction="sum")), rel=1e-3)


def test_mntp_is_a_phase_objective_named_and_planned_like_the_others():
    run = from_dict(RunConfig, {"phases": {"steps": 10, "plan": [{"objective": "clm", "steps": 5},
                                                                 {"objective": "mntp", "steps": 5, "mask_ratio": 0.2}]},
                                "optim": OPTIM})
    assert "-clm-5-mntp20-10-" in run_name(run)
    assert parse_phase_tag("mntp20") == ("mntp", 0.2) and source_objective("tiny-mntp40-dec1k-mlm40-2k-ab12") == "mntp"
    spec = from_dict(SweepSpec, {"phases": {"steps": 20, "clm_share": 0.5}, "optim": OPTIM, "sweep": {"runs": [
        {"phases.plan": [{"objective": "clm", "steps": 10}, {"objective": "mntp", "steps": 10}]}]}})
    plan = make_plan(spec)
    mlm, mntp = plan.runs.values()
    assert "mlm40" in mlm.name and "mntp40" in mntp.name
    assert shared_steps(mlm, mntp) == 10  # the CLM half is shared
    assert [plan.segments[s].end for s in set(mlm.segments) & set(mntp.segments)] == [10]


def test_a_ratio_on_a_clm_phase_is_still_a_one_line_error():
    with pytest.raises(ConfigError, match=r"^phases.plan.0.mask_ratio: only MLM and MNTP phases mask tokens"):
        from_dict(RunConfig, {"phases": {"steps": 4, "plan": [{"objective": "clm", "steps": 4, "mask_ratio": 0.3}]}})
    with pytest.raises(ConfigError, match=r"^phases.plan.0.objective: "):
        from_dict(RunConfig, {"phases": {"steps": 4, "plan": [{"objective": "mtp", "steps": 4}]}})


def test_a_run_with_an_mntp_phase_is_evaluated_on_the_mntp_loss_too(small_shards):
    from raybiphase.data.stream import validation_batches

    _, manifest = small_shards
    plain = validation_batches(manifest, batch_size=4, batches=1, mask_ratio=0.4)
    with_mntp = validation_batches(manifest, batch_size=4, batches=1, mask_ratio=0.4, mntp=True)
    assert set(plain) == {"clm", "mlm"} and set(with_mntp) == {"clm", "mlm", "mntp"}
    (mlm,), (mntp,) = with_mntp["mlm"], with_mntp["mntp"]
    assert np.array_equal(mlm["input_ids"], mntp["input_ids"])
    assert np.array_equal(mntp["labels"], mntp_labels(mlm["labels"]))
