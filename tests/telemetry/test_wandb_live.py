"""W&B while a sweep trains, read back from the offline run files wandb writes (as `wandb sync` would send them):
a segment's run with its lineage, curves against tokens seen, checkpoints as artifacts by reference, one W&B run
per thing logged however often it is logged again; fine-tuning trials as they end; the report run's stable id."""

from __future__ import annotations

from pathlib import Path

import pytest

from raybiphase import storage
from raybiphase.config import SweepSpec, load
from raybiphase.planning.plan import make_plan
from raybiphase.results import wandb_upload as results_wandb
from raybiphase.telemetry import wandb as wandb_log
from raybiphase.telemetry import wandb_live
from raybiphase.telemetry.wandb_files import logged

SETTINGS = {"project": "raybiphase-test", "group": "quickstart", "mode": "offline", "sync_to": None}


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)
    return tmp_path


def _folders(offline: Path, run_id: str) -> list[Path]:
    """The offline folders of one W&B run (a second in the same second is named `<folder>-1`)."""
    return sorted((offline / "wandb").glob(f"offline-run-*-{run_id}*"))


def test_each_segment_names_its_parent_and_the_runs_it_serves(tmp_path) -> None:
    spec = load(SweepSpec, "sweeps/quickstart.yaml", [f"sweep.storage={tmp_path}", "sweep.wandb_project=p"])
    plan = make_plan(spec)
    for segment in plan.segments.values():
        settings = wandb_live.segment_settings(spec, segment.id, parent=segment.parent, serves=segment.runs)
        assert settings["kind"] == "segment" and settings["group"] == spec.sweep.name
        assert settings["lineage"] == {"lineage.segment": segment.id, "lineage.parent": segment.parent or "",
                                       "lineage.serves": list(segment.runs)}
    assert any(s.parent for s in plan.segments.values())  # the quickstart branches after a shared prefix
    no_wandb = load(SweepSpec, "sweeps/quickstart.yaml", [f"sweep.storage={tmp_path}"])
    assert wandb_live.segment_settings(no_wandb, "s", parent=None, serves=()) is None


@pytest.mark.slow  # wandb's service process
def test_a_segment_logs_against_tokens_with_its_lineage_and_its_checkpoints_by_reference(offline, s3_bucket) -> None:
    lineage = {"lineage.segment": "seg-b", "lineage.parent": "seg-a", "lineage.serves": ["run-1", "run-2"]}
    settings = {**SETTINGS, "kind": "segment", "lineage": lineage}
    assert wandb_live.segment_run(settings, "seg-b", {"phases.steps": 4}, rank=1) is None  # rank 0 only
    local = offline / "runs" / "seg-b" / "step-00000002"
    (local / "hf").mkdir(parents=True)
    (local / "hf" / "config.json").write_text("{}")
    run = wandb_live.segment_run(settings, "seg-b", {"phases.steps": 4}, rank=0)
    for step in (1, 2):
        wandb_log.log(run, {"tokens_seen": 512 * step, "train/mlm_loss": 7.0 - step}, step=step)
    wandb_live.log_checkpoint(run, str(local), name="seg-b", step=2, export=True)
    in_bucket = f"{s3_bucket}/sweep/runs/seg-b/step-00000004"  # referenced, never read: no checksum
    wandb_live.log_checkpoint(run, in_bucket, name="seg-b", step=4, export=False)
    wandb_log.finish(run)
    (folder,) = _folders(offline, wandb_log.stable_id("quickstart", "segment", "seg-b"))
    found = logged(folder)
    assert found["run"].run_group == "quickstart" and found["run"].job_type == "segment"
    assert {k: found["config"][k] for k in lineage} == lineage and found["config"]["phases.steps"] == 4
    assert [(h["_step"], h["tokens_seen"], h["train/mlm_loss"]) for h in found["history"]] == [(1, 512, 6), (2, 1024, 5)]
    assert any(m.glob_name == "*" and m.step_metric == "tokens_seen" for m in found["metrics"])
    artifacts = {(a["type"], a["name"]): a for a in found["artifacts"]}
    assert set(artifacts) == {("checkpoint", "seg-b-step2"), ("model", "seg-b-hf-step2"), ("checkpoint", "seg-b-step4")}
    assert artifacts[("model", "seg-b-hf-step2")]["refs"] == [f"file://{local}/hf/config.json"]
    assert artifacts[("checkpoint", "seg-b-step4")]["refs"] == [in_bucket]
    assert artifacts[("checkpoint", "seg-b-step4")]["metadata"] == {"step": 4, "uri": in_bucket}


@pytest.mark.slow  # wandb's service process
def test_a_restarted_segment_continues_its_wandb_run(offline) -> None:
    settings = {**SETTINGS, "kind": "segment", "lineage": {}}
    for step in (1, 2):  # the worker group restarted after a failure: the same segment, logged again
        run = wandb_live.segment_run(settings, "seg-a", {}, rank=0)
        wandb_log.log(run, {"tokens_seen": step, "train/clm_loss": 1.0}, step=step)
        wandb_log.finish(run)
    run_id = wandb_log.stable_id("quickstart", "segment", "seg-a")
    folders = _folders(offline, run_id)
    assert len(folders) == 2 and all(logged(f)["run"].run_id == run_id for f in folders)
    assert len(list((offline / "wandb").glob("offline-run-*"))) == 2


def _rows(lr: float) -> list[dict]:
    return [{"source": "raybiphase", "run": "tiny-clm-8-abc", "pretrain_step": 8, "task": task, "family": "SC",
             "metric": "accuracy", "lr": lr, "seed": seed, "val_score": 0.5 + lr * 100 + seed / 100,
             "test_score": 0.4 + lr,
             "steps": 10, "steps_run": 10, "stopped_early": False, "completed_after_stop": False,
             "diverged": False, "seconds": 1.0, "phases.clm_share": 1.0}
            for task in ("tweets", "sst2") for seed in (0, 1)]


@pytest.mark.slow  # wandb's service process
def test_fine_tuning_trials_are_logged_as_they_end_then_each_group_gets_its_table(offline) -> None:
    from raybiphase.results.rows import trial_key

    log = results_wandb.FinetuneLog(SETTINGS)
    trials = [_rows(1e-4), _rows(1e-3)]
    log.trial(trials[0])  # a trial ended: its (checkpoint, task) runs exist before the fan-out ends
    ids = {task: wandb_log.stable_id("quickstart", "finetune", f"tiny-clm-8-abc@8|{task}") for task in ("tweets", "sst2")}
    assert all(len(_folders(offline, i)) == 1 for i in ids.values())
    log.trial(trials[1])
    rows = trials[0] + trials[1]
    log.groups(rows, new={trial_key(r) for r in rows})
    found = logged(_folders(offline, ids["sst2"])[0])
    points = [(h["trial/lr"], h["trial/seed"]) for h in found["history"] if "trial/lr" in h]
    assert points == [(1e-4, 0), (1e-4, 1), (1e-3, 0), (1e-3, 1)]  # one point per trial, in the order they ended
    assert found["summary"]["best_lr"] == 1e-3 and found["config"]["phases.clm_share"] == 1.0
    assert log.runs == {} and all(len(_folders(offline, i)) == 1 for i in ids.values())  # no second run


@pytest.mark.slow  # wandb's service process
def test_the_report_run_keeps_its_id_and_offline_its_folder_reaches_the_results(offline) -> None:
    from raybiphase.results.importer import import_tree

    results_dir = offline / "results"
    import_tree(Path(__file__).resolve().parents[1] / "fixtures" / "paper_tree", results_dir)
    first = results_wandb.log_report(results_dir, "raybiphase-test", "paper")
    assert results_wandb.log_report(results_dir, "raybiphase-test", "paper") == first
    assert first == wandb_log.stable_id("paper", "report", "paper-report")
    kept = storage.list_folders(str(results_dir / "wandb"))
    assert len(kept) == 2 and all(f"-{first}" in name for name in kept)


@pytest.mark.slow  # wandb's service process
def test_a_store_wandb_cannot_reference_is_a_warning_and_the_run_goes_on(offline) -> None:
    run = wandb_live.segment_run({**SETTINGS, "kind": "segment", "lineage": {}}, "seg-c", {}, rank=0)
    with pytest.warns(UserWarning, match="not logged as an artifact"):
        wandb_live.log_checkpoint(run, "unknown-scheme://bucket/runs/seg-c/step-00000002", name="seg-c", step=2,
                                  export=False)
    wandb_log.log(run, {"tokens_seen": 2, "train/clm_loss": 1.0}, step=2)
    wandb_log.finish(run)
    (folder,) = _folders(offline, wandb_log.stable_id("quickstart", "segment", "seg-c"))
    found = logged(folder)
    assert found["artifacts"] == [] and found["history"][0]["tokens_seen"] == 2
