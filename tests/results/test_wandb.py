"""W&B, offline: runs write local files, configs keep dotted keys, the API key is never written; rank zero only."""

from __future__ import annotations

from pathlib import Path

import pytest

from raybiphase.results import wandb as wandb_log
from raybiphase.results.importer import import_tree
from raybiphase.results.report import write_report

FAKE_KEY = "local-0123456789abcdef0123456789abcdef01234567"
PAPER_TREE = Path(__file__).resolve().parents[1] / "fixtures" / "paper_tree"


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.delenv("RANK", raising=False)
    return tmp_path


def _files_containing(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_offline_run_has_dotted_config_and_never_the_api_key(offline: Path) -> None:
    kept = {"phases.mask_ratio": 0.4, "phases.steps": 42000, "model.size": "tiny", "data.tokenizer": "train-bpe",
            "train.global_batch_tokens": 4096}
    config = {**kept, "finetune.lrs": (1e-4, 5e-4), "sweep.wandb_api_key": "x", "data.hf_token": "y",
              "cluster.secret-access-key": "z", "note": f"key={FAKE_KEY}"}
    run = wandb_log.init_run("pretrain", "tiny-clm-50-mlm40-100-abc123", "quickstart", config, "raybiphase-test")
    assert run is not None
    assert dict(run.config) == {**kept, "finetune.lrs": [1e-4, 5e-4]}
    wandb_log.log(run, {"val/mlm_loss": 2.5}, step=10)
    wandb_log.finish(run, {"test_score": 0.9})
    (run_dir,) = (offline / "wandb").glob("offline-run-*")
    assert list(run_dir.glob("run-*.wandb"))
    assert not _files_containing(offline, FAKE_KEY)


def test_no_project_means_no_run_and_no_wandb(offline, monkeypatch) -> None:
    assert wandb_log.init_run("finetune", "t", "g", {"a.b": 1}, None) is None
    assert wandb_log.log_report(offline, None, "sweep") is None
    wandb_log.log(None, {"x": 1})
    wandb_log.finish(None)
    assert not (offline / "wandb").exists()


def test_only_world_rank_zero_logs(offline, monkeypatch) -> None:
    assert wandb_log.init_run("pretrain", "r", "g", {}, "p", rank=1) is None
    monkeypatch.setenv("RANK", "1")  # what Ray Train's torch backend sets in each worker
    assert wandb_log.init_run("pretrain", "r", "g", {}, "p") is None
    assert not (offline / "wandb").exists()


def test_offline_unless_the_user_configured_wandb(monkeypatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert wandb_log.default_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    assert wandb_log.default_mode() is None
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wandb_log.default_mode() is None


def test_log_report_uploads_tables_and_figures(offline: Path) -> None:
    results_dir = offline / "results"
    import_tree(PAPER_TREE, results_dir)
    write_report(results_dir)
    run_id = wandb_log.log_report(results_dir, "raybiphase-test", "paper")
    assert run_id
    (run_dir,) = (offline / "wandb").glob(f"offline-run-*-{run_id}")
    media = [p.name for p in run_dir.rglob("*.png")]
    assert any(n.startswith("clm_share") for n in media) and any(n.startswith("lr_sensitivity") for n in media)
    assert list(run_dir.rglob("*.table.json"))
    assert not _files_containing(offline, FAKE_KEY)
