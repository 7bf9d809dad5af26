"""Public encoders beside a sweep's arms (finetune.baselines): a tiny random BERT folder, fine-tuned once through
the sweep's scheduler on Ray, its rows with source `hub`, reused by a later sweep at the same storage, shown in the
report's tables and never in its findings."""

from __future__ import annotations

import pytest

from raybiphase.config import SweepSpec, from_dict
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from tests.finetune.test_encoders import make_tiny_bert


def _spec(storage, name: str, bert) -> SweepSpec:
    return from_dict(SweepSpec, {
        "sweep": {"name": name, "storage": str(storage)},
        "finetune": {"tasks": ["tweets"], "lrs": [1e-3], "seeds": [0], "batch_size": 8, "max_steps": 2,
                     "eval_every": 2, "max_examples": 16, "max_eval_examples": 16, "max_len": 64, "asha": False,
                     "baselines": [str(bert), str(bert) + "/"]},  # one model named twice: one baseline
        "resources": {"max_concurrent": 1}})


@pytest.mark.ray
def test_a_public_encoder_is_fine_tuned_once_and_reused_by_a_later_sweep(ray_cluster, offline_cache, tmp_path):
    from raybiphase.sweep.hub_baselines import hub_baseline_rows, hub_cache, hub_sources

    bert = make_tiny_bert(tmp_path / "bert")
    first = hub_baseline_rows(_spec(tmp_path / "storage", "first", bert))
    assert len(first) == 1 and set(first["source"]) == {result_rows.HUB} and set(first["run"]) == {"bert"}
    assert set(first["checkpoint"]) == {str(bert)} and set(first["sweep"]) == {"first"}
    assert 0.0 <= float(first["test_score"].iloc[0]) <= 1.0
    spec = _spec(tmp_path / "storage", "first", bert)
    (source,) = hub_sources(spec)
    cache = f"{hub_cache(spec, source)}/finetune.parquet"
    second = hub_baseline_rows(_spec(tmp_path / "storage", "second", bert))  # another sweep at this storage
    assert len(store.read_rows(cache)) == 1  # nothing fine-tuned again
    assert set(second["sweep"]) == {"second"} and list(second["test_per_example"].iloc[0]) == list(
        first["test_per_example"].iloc[0])


def test_hub_rows_sit_in_the_reports_tables_beside_ours_and_never_in_its_findings(tmp_path):
    from raybiphase.results.report import write_report
    from raybiphase.results.rows import FinetuneRow

    rows = [FinetuneRow(run=run, pretrain_step=0, task="tweets", lr=1e-3, seed=seed, source=source, family="SC",
                        metric="accuracy", val_score=0.5, test_score=score, test_per_example=[1.0, 0.0],
                        dataset="tweets").record()
            for run, source, score in (("tiny-clm-mlm", result_rows.OURS, 0.6), ("bert", result_rows.HUB, 0.7))
            for seed in (0, 1)]
    store.append_rows(tmp_path / "finetune.parquet", rows, key=result_rows.FINETUNE_KEY)
    path, sections = write_report(tmp_path)
    report = open(path).read()
    hub_line = next(line for line in report.splitlines() if line.startswith("| hub | bert |"))
    assert "70.00" in hub_line and "| ? |" not in hub_line  # its score, and no objective of ours
    assert "tiny-clm-mlm" in report
    findings = report[report.index("The paper's findings"):]
    assert "bert" not in findings  # never paired with our arms


def _publish(cache, repo: str, commit: str, folder) -> None:
    """What a download of `repo` at `commit` leaves in the Hub's cache: its files under snapshots/<commit>, and
    refs/main naming that commit (the head, as the Hub last said)."""
    import shutil

    root = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, root / "snapshots" / commit)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)


def test_a_hub_baseline_is_resolved_once_per_sweep_and_its_rows_carry_that_commit(offline_cache, tmp_path,
                                                                                   monkeypatch):
    from huggingface_hub import constants

    from raybiphase.finetune.encoders import encoder_source
    from raybiphase.results.rows import FinetuneRow
    from raybiphase.sweep.hub_baselines import hub_baseline_rows, hub_cache, hub_sources

    bert, first, moved = make_tiny_bert(tmp_path / "bert"), "1" * 40, "2" * 40
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _publish(tmp_path / "hf", "tiny-org/bert", first, bert)
    spec = from_dict(SweepSpec, {"sweep": {"name": "pinned", "storage": str(tmp_path / "storage")},
                                 "finetune": {"tasks": ["tweets"], "lrs": [1e-3], "seeds": [0],
                                              "baselines": ["tiny-org/bert"]}})
    (source,) = hub_sources(spec)  # the driver's check before Ray starts
    assert (source.run, source.hf_dir) == ("tiny-org/bert", f"tiny-org/bert@{first}")
    _publish(tmp_path / "hf", "tiny-org/bert", moved, bert)  # the Hub's head moves while the sweep runs
    assert encoder_source("tiny-org/bert") == f"tiny-org/bert@{moved}"
    row = FinetuneRow(run="tiny-org/bert", pretrain_step=0, task="tweets", lr=1e-3, seed=0, source=result_rows.HUB,
                      family="SC", metric="accuracy", val_score=0.5, test_score=0.6, test_per_example=[1.0, 0.0],
                      dataset="tweets", checkpoint=source.hf_dir).record()
    store.append_rows(f"{hub_cache(spec, source)}/finetune.parquet", [row], key=result_rows.FINETUNE_KEY)  # its trial
    recorded = hub_baseline_rows(spec)  # when the sweep records its baselines
    assert list(recorded["checkpoint"]) == [f"tiny-org/bert@{first}"] and list(recorded["sweep"]) == ["pinned"]
    # a later sweep at this storage, whose id resolves to the moved head: the first commit's trial is not its own
    later = from_dict(SweepSpec, {**{"sweep": {"name": "later", "storage": str(tmp_path / "storage")}},
                                  "finetune": {"tasks": ["tweets"], "lrs": [1e-3], "seeds": [0],
                                               "baselines": ["tiny-org/bert"]}})
    (newer,) = hub_sources(later)
    assert newer.hf_dir == f"tiny-org/bert@{moved}" and hub_cache(later, newer) != hub_cache(spec, source)
    assert not store.done_keys(f"{hub_cache(later, newer)}/finetune.parquet", result_rows.FINETUNE_KEY)
