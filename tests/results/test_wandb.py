"""W&B, offline: runs write local files, configs keep dotted keys, the API key is never written; rank zero only."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from raybiphase.results import wandb_upload as results_wandb
from raybiphase.results.importer import import_tree
from raybiphase.results.report import write_report
from raybiphase.telemetry import wandb as wandb_log

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


@pytest.mark.slow  # wandb's service process
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
    assert results_wandb.log_report(offline, None, "sweep") is None
    wandb_log.log(None, {"x": 1})
    wandb_log.finish(None)
    assert not (offline / "wandb").exists()


def test_only_world_rank_zero_logs(offline, monkeypatch) -> None:
    assert wandb_log.init_run("pretrain", "r", "g", {}, "p", rank=1) is None
    monkeypatch.setenv("RANK", "1")  # what Ray Train's torch backend sets in each worker
    assert wandb_log.init_run("pretrain", "r", "g", {}, "p") is None
    assert not (offline / "wandb").exists()


def test_online_when_logged_in_or_given_a_key_else_offline(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # no `wandb login` on this machine
    assert wandb_log.default_mode() == "offline" and wandb_log.api_key() is None
    (tmp_path / "netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {FAKE_KEY}\n")
    (tmp_path / "netrc").chmod(0o600)
    assert wandb_log.default_mode() == "online" and wandb_log.api_key() == FAKE_KEY  # what `wandb login` leaves
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    assert wandb_log.default_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")  # the user's choice wins
    assert wandb_log.default_mode() == "offline"
    settings = wandb_log.driver_settings("p", "sweep", "s3://bucket/results/sweep/wandb")
    assert settings == {"project": "p", "group": "sweep", "mode": "offline", "sync_to": "s3://bucket/results/sweep/wandb"}
    assert FAKE_KEY not in str(settings) and wandb_log.driver_settings(None, "sweep", None) is None


@pytest.mark.slow  # wandb's service process
def test_an_offline_run_folder_is_kept_in_the_bucket(offline: Path, s3_bucket) -> None:
    from raybiphase import storage

    target = f"{s3_bucket}/wandb-sync/sweep/wandb"
    run = wandb_log.init_run("finetune", "t", "sweep", {"a.b": 1}, "raybiphase-test", mode="offline", sync_to=target)
    wandb_log.log(run, {"val_score": 0.5}, step=1)
    wandb_log.finish(run, {"test_score": 0.5})
    (folder,) = (offline / "wandb").glob("offline-run-*")
    (synced,) = [name for name in storage.list_folders(target)]
    assert synced == folder.name
    assert storage.is_file(storage.join(target, synced, next(folder.glob("run-*.wandb")).name))


def test_workers_see_the_wandb_and_storage_settings_but_never_the_key(monkeypatch) -> None:
    from raybiphase.raycluster import worker_env

    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_ENTITY", "lab")
    monkeypatch.setenv("WANDB_DIR", "/driver/only")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    env = worker_env()
    assert env["WANDB_ENTITY"] == "lab" and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert FAKE_KEY not in str(env) and "secret" not in str(env).replace("SECRET", "") and "WANDB_DIR" not in env


def test_a_worker_on_another_node_gets_the_key_from_the_driver_in_memory(ray_cluster, monkeypatch) -> None:
    import ray

    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    wandb_log.share_key()

    @ray.remote(num_cpus=0.1, runtime_env={"env_vars": {"WANDB_API_KEY": ""}})
    def worker_key():
        import os

        os.environ.pop("WANDB_API_KEY", None)
        return wandb_log.api_key(), wandb_log._key_from_driver()

    assert ray.get(worker_key.remote()) == (None, FAKE_KEY)
    assert FAKE_KEY not in repr(ray.get_actor(wandb_log.KEY_ACTOR))


@pytest.mark.slow  # wandb's service process
def test_log_report_uploads_tables_and_figures(offline: Path) -> None:
    results_dir = offline / "results"
    import_tree(PAPER_TREE, results_dir)
    write_report(results_dir)
    run_id = results_wandb.log_report(results_dir, "raybiphase-test", "paper")
    assert run_id
    (run_dir,) = (offline / "wandb").glob(f"offline-run-*-{run_id}")
    media = [p.name for p in run_dir.rglob("*.png")]
    assert any(n.startswith("clm_share") for n in media) and any(n.startswith("lr_sensitivity") for n in media)
    assert list(run_dir.rglob("*.table.json"))
    assert not _files_containing(offline, FAKE_KEY)


@pytest.mark.slow  # wandb's service process
def test_a_pretraining_run_is_one_wandb_run_across_its_segments(offline: Path) -> None:
    settings = {"project": "raybiphase-test", "group": "quickstart", "mode": "offline", "sync_to": None}
    shared = [{"step": s, "train/clm_loss": 6.0 - s / 10, "objective": "clm"} for s in (1, 2)]  # the shared prefix
    own = [{"step": s, "train/mlm_loss": 7.0 - s / 10, "val/mlm_loss": 6.9, "checkpoint": "x"} for s in (3, 4)]
    first = wandb_log.log_pretraining_run(settings, "tiny-clm-2-mlm40-4-abc", {"phases.steps": 4}, own + shared)
    other = wandb_log.log_pretraining_run(settings, "tiny-clm-4-def", {"phases.steps": 4}, shared)
    assert first == wandb_log.stable_id("quickstart", "pretrain", "tiny-clm-2-mlm40-4-abc") and first != other
    folders = sorted((offline / "wandb").glob("offline-run-*"))
    assert {f.name.rsplit("-", 1)[1] for f in folders} == {first, other} and len(folders) == 2  # one per run
    log = next(folders[0].glob("run-*.wandb")).read_bytes() + next(folders[1].glob("run-*.wandb")).read_bytes()
    assert b"train/clm_loss" in log and b"val/mlm_loss" in log
    assert wandb_log.log_pretraining_run(None, "x", {}, shared) is None  # no project: nothing


def test_fine_tuning_is_one_wandb_run_per_checkpoint_and_task_with_a_table_of_trials(offline: Path) -> None:
    import json

    settings = {"project": "raybiphase-test", "group": "quickstart", "mode": "offline", "sync_to": None}
    rows = [{"source": "raybiphase", "run": "tiny-clm-8-abc", "pretrain_step": 8, "task": "tweets", "family": "SC",
             "metric": "accuracy", "lr": lr, "seed": seed, "val_score": 0.5 + seed / 100, "test_score": 0.4 + lr,
             "steps": 10, "steps_run": 10, "stopped_early": False, "completed_after_stop": False,
             "diverged": False, "seconds": 1.0, "test_per_example": [1.0, 0.0], "phases.clm_share": 1.0}
            for lr in (1e-4, 1e-3) for seed in (0, 1, 2)]
    run_id = results_wandb.log_finetune_group(settings, rows)
    (folder,) = (offline / "wandb").glob(f"offline-run-*-{run_id}")
    (table,) = folder.rglob("trials_*.table.json")
    trials = json.loads(table.read_text())
    assert len(trials["data"]) == 6 and {"lr", "seed", "val_score", "test_score"} <= set(trials["columns"])
    assert [row[trials["columns"].index("lr")] for row in trials["data"]] == [1e-4] * 3 + [1e-3] * 3
    keys = ("best_lr", "test_mean", "test_ci95", "n_seeds")  # the summary: the best LR and its test mean ± CI
    deadline = time.time() + 60  # wandb's service writes the run's log after finish() returns: on a loaded machine, later
    while not all(key.encode() in next(folder.glob("run-*.wandb")).read_bytes() for key in keys):
        assert time.time() < deadline, "the run's summary never reached its offline log"
        time.sleep(0.5)
    assert results_wandb.log_finetune_group(settings, rows) == run_id  # logged again: the same W&B run, continued
