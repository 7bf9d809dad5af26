"""Hub datasets read at a named commit: hub-layout snapshots that record the commit they were downloaded at (as
`hf download --local-dir` does), the commit checked against finetune.dataset_revisions, recorded in every trial's
row, and a moving read warned of. No network, no Ray."""

from __future__ import annotations

import dataclasses
import re
import shutil
import warnings

import datasets
import pytest

from raybiphase.config import FinetuneConfig, SweepSpec, from_dict
from raybiphase.errors import ConfigError, UserError
from raybiphase.finetune import hub, tasks
from tests.finetune.test_finetune import one_torch_thread  # noqa: F401 (autouse: one torch thread, as a trial has)
from tests.finetune.test_production_loaders import _glue, record_commit  # noqa: F401 (record_commit: shared)

COMMIT, OTHER = "a" * 40, "b" * 40
COMMIT_HEX = re.compile(r"[0-9a-f]{40}")


@pytest.fixture
def glue_at(tmp_path, monkeypatch):
    """A snapshot of nyu-mll/glue downloaded at COMMIT, under RAYBIPHASE_DATASETS_DIR."""
    root = tmp_path / "hub"
    _glue(root)
    record_commit(root / hub.GLUE, COMMIT)
    monkeypatch.setenv(hub.DATASETS_DIR_ENV, str(root))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    tasks._load_splits.cache_clear()
    yield root
    tasks._load_splits.cache_clear()


def test_a_pinned_dataset_is_read_at_its_commit_and_says_so_without_a_warning(glue_at):
    with warnings.catch_warnings():
        warnings.simplefilter("error", hub.UnpinnedDatasetWarning)
        splits = tasks.load_splits(tasks.get_task("sst2"), source="production", revisions=(f"{hub.GLUE}@{COMMIT}",))
    assert splits.revisions == {hub.GLUE: COMMIT} and splits.test


def test_a_revision_the_snapshot_is_not_at_is_one_line_saying_how_to_get_it(glue_at):
    with pytest.raises(UserError) as err:
        tasks.load_splits(tasks.get_task("sst2"), source="production", revisions=(f"{hub.GLUE}@{OTHER}",))
    message = str(err.value)
    assert f"revision {OTHER} of {hub.GLUE}" in message and f"it is at commit {COMMIT}" in message
    assert f"--revision {OTHER}" in message and "\n" not in message


def test_an_unpinned_read_is_a_warning_naming_the_dataset(glue_at, monkeypatch):
    monkeypatch.setitem(hub.DATASET_REVISIONS, hub.GLUE, None)  # no default commit, as CoNLL-2003 has none
    shutil.rmtree(glue_at / hub.GLUE / ".cache")  # a snapshot that records no commit
    with pytest.warns(hub.UnpinnedDatasetWarning, match=f"{hub.GLUE} is read unpinned"):
        splits = tasks.load_splits(tasks.get_task("sst2"), source="production")
    assert splits.revisions == {hub.GLUE: "main"}
    with pytest.raises(UserError, match="it records no commit"):
        tasks.load_splits(tasks.get_task("sst2"), source="production", revisions=(f"{hub.GLUE}@{COMMIT}",))


def test_a_revision_for_no_known_dataset_is_refused_before_anything_runs():
    from raybiphase.finetune.fanout import check_tasks

    with pytest.raises(UserError, match="finetune.dataset_revisions: 'nyu-mll/glu@main' is not"):
        check_tasks(FinetuneConfig(tasks=("sst2",), dataset_revisions=("nyu-mll/glu@main",)))
    with pytest.raises(ConfigError, match="finetune.dataset_revisions.0"):
        from_dict(SweepSpec, {"finetune": {"dataset_revisions": ["nyu-mll/glue"]}})


def test_a_trials_row_records_the_commit_it_read_and_records_at_other_commits_are_not_reused(glue_at, tmp_path):
    from raybiphase.finetune.records import trial_settings
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial
    from tests.finetune.test_finetune import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "hf")
    cfg = FinetuneConfig(batch_size=2, max_steps=1, eval_every=1, max_len=32, dataset_revisions=(f"{hub.GLUE}@{COMMIT}",))
    spec = TrialSpec.plain(checkpoint, "sst2", lr=1e-4, seed=0)
    result = run_trial(spec, cfg=cfg, source="production")
    assert spec.finished(result).dataset_revisions == f"{hub.GLUE}@{COMMIT}"
    assert trial_settings(cfg) != trial_settings(dataclasses.replace(cfg, dataset_revisions=(f"{hub.GLUE}@{OTHER}",)))
    assert tasks.load_splits(tasks.get_task("tweets"), max_examples=8).revisions == {}  # offline: no hub dataset


def test_the_default_commits_pin_the_datasets_a_source_names_and_hold_a_snapshot_to_them(tmp_path, monkeypatch):
    from tests.finetune.test_production_loaders import _record, _retrieval

    pinned = {hub.GLUE, hub.CONLL2003, hub.SQUAD, hub.SQUAD_V2, hub.SUPER_GLUE, hub.MSMARCO, hub.NQ, hub.MLDR}
    assert {k for k, v in hub.DATASET_REVISIONS.items() if v} == pinned
    assert all(COMMIT_HEX.fullmatch(v) for v in hub.DATASET_REVISIONS.values() if v)
    _retrieval(tmp_path / "hub")  # downloaded at the default commits
    _record(tmp_path / "hub")
    monkeypatch.setenv(hub.DATASETS_DIR_ENV, str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    tasks._load_splits.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", hub.UnpinnedDatasetWarning)
        splits = tasks.load_splits(tasks.get_task("mldr"), source="production")
        record = tasks.load_splits(tasks.get_task("record"), source="production")
    assert splits.revisions == {hub.MSMARCO: hub.DATASET_REVISIONS[hub.MSMARCO],
                                hub.MLDR: hub.DATASET_REVISIONS[hub.MLDR]}
    assert record.revisions == {hub.SUPER_GLUE: hub.DATASET_REVISIONS[hub.SUPER_GLUE]}
    record_commit(tmp_path / "hub" / hub.MLDR, OTHER)  # a snapshot at another commit than the default
    tasks._load_splits.cache_clear()
    with pytest.raises(UserError, match=f"revision {hub.DATASET_REVISIONS[hub.MLDR]} of {hub.MLDR} is not the snapshot"):
        tasks.load_splits(tasks.get_task("mldr"), source="production")
    tasks._load_splits.cache_clear()
