"""Pretraining on Ray Train: phases, checkpoints, HF exports, a killed worker, continued pretraining."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _weights(result) -> dict[str, torch.Tensor]:
    return load_file(str(Path(result.checkpoint.path) / "hf" / "model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tiny_run):
    return tiny_run


def test_run_reports_phases_losses_and_checkpoints(uninterrupted):
    import pandas as pd

    from raybiphase.pretrain.trainer import read_history

    history = pd.DataFrame(read_history(uninterrupted.path))
    assert list(history["step"]) == list(range(1, 9))
    assert list(history["objective"]) == ["clm"] * 4 + ["mlm"] * 4
    for column in ("val/clm_loss", "val/mlm_loss", "lr", "tokens_per_s", "tokens_seen"):
        assert history[column].notna().all()
    assert history["train/clm_loss"].notna().sum() == 4 and history["train/mlm_loss"].notna().sum() == 4
    steps = sorted(p.name for p in Path(uninterrupted.path).glob("step-*"))
    assert steps == ["step-00000004", "step-00000006", "step-00000008"]  # phase switch, decay start, end
    meta = json.loads((Path(uninterrupted.checkpoint.path) / "meta.json").read_text())
    assert meta["step"] == 8 and meta["tokens_seen"] == 8 * 2048 and meta["objective"] == "mlm"
    assert meta["code_version"] and meta["config"]["phases"]["clm_share"] == 0.5


def test_hf_export_loads_with_stock_transformers_and_fills_a_mask(uninterrupted):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    folder = Path(uninterrupted.checkpoint.path) / "hf"
    model = AutoModelForMaskedLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("The capital of France is <mask>.", return_tensors="pt")["input_ids"]
    position = (ids[0] == tokenizer.mask_token_id).nonzero()[0, 0]
    with torch.no_grad():
        prediction = model(input_ids=ids).logits[0, position].argmax()
    assert isinstance(tokenizer.decode(prediction), str)
    assert type(model).__name__ == "EuroBertForMaskedLM"


def test_killed_worker_restarts_from_checkpoint_to_identical_weights(uninterrupted, small_data, tmp_path):
    from raybiphase.pretrain.trainer import run_pretrain

    cfg = tiny_config(tmp_path, small_data, **{"train.checkpoint_every": 3})
    marker = tmp_path / "killed"
    result = run_pretrain(cfg, max_failures=1, fail_at_step=5, fail_marker=str(marker))
    assert marker.read_text() == "5"  # a worker really died at step 5; Ray Train restarted from step 4
    final, reference = _weights(result), _weights(uninterrupted)
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[k], reference[k]) for k in final)
