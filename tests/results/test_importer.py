"""Importer: the authors' evaluation trees become finetune rows (source="paper") aggregating to the paper's numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from raybiphase.commands import import_results, run_main
from raybiphase.errors import UserError
from raybiphase.results.importer import collect, import_tree, parse_model_name, read_trial
from raybiphase.results.store import read_rows

PAPER_TREE = Path(__file__).resolve().parents[1] / "fixtures" / "paper_tree"


def test_import_fixture_tree_reproduces_the_paper(tmp_path) -> None:
    assert import_tree(PAPER_TREE, tmp_path) == (60, 0)
    trials = read_rows(tmp_path / "finetune.parquet")
    assert set(trials["source"]) == {"paper"} and set(trials["sweep"]) == {"paper"}
    assert set(trials["task"]) == {"sst2"} and set(trials["family"]) == {"SC"} and set(trials["metric"]) == {"accuracy"}
    assert sorted(trials["lr"].unique()) == [1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4]
    for per_example, test_score in zip(trials["test_per_example"], trials["test_score"]):
        assert len(per_example) == 872 and sum(per_example) / 872 == pytest.approx(test_score, abs=1e-9)
    summary = read_rows(tmp_path / "summary.parquet").set_index("run")
    mlm = summary.loc["610m-mlm40-42k"]
    assert mlm["best_lr"] == 1e-4 and round(mlm["test_mean"] * 100, 2) == 91.74
    assert round(mlm["test_ci95"] * 100, 2) == 0.35 and mlm["phases.clm_share"] == 0
    biphasic = summary.loc["610m-clm-10k-mlm40-42k"]
    assert biphasic["best_lr"] == 5e-5 and round(biphasic["test_mean"] * 100, 2) == 92.41
    assert round(biphasic["test_ci95"] * 100, 2) == 0.55
    assert biphasic["phases.clm_share"] == pytest.approx(10 / 42) and biphasic["phases.steps"] == 42000


def test_reimport_adds_nothing(tmp_path) -> None:
    import_tree(PAPER_TREE, tmp_path)
    assert import_tree(PAPER_TREE, tmp_path) == (0, 60)
    assert len(read_rows(tmp_path / "finetune.parquet")) == 60


@pytest.mark.parametrize("name, expected", [
    ("610m-clm-42k", {"run": "610m-clm-42k", "phases.clm_share": 1.0, "phases.steps": 42000, "pretrain_step": 42000}),
    ("610m-clm-10k-mlm40-42k", {"phases.clm_steps": 10000, "phases.mask_ratio": 0.4, "model.init_from": None}),
    ("610m-mlm40-42k-1000", {"run": "610m-mlm40-42k", "pretrain_step": 1000, "phases.clm_share": 0.0}),
    ("610m-clm-dec42k-mlm40-64k", {"model.init_from": "610m-clm-42k", "phases.steps": 22000, "phases.clm_share": 0.0,
                                   "pretrain_step": 64000}),
    ("210m-mlm20-12k", {"model.size": "210m", "phases.mask_ratio": 0.2}),
    ("not-a-model-name", {"run": "not-a-model-name"}),
])
def test_parse_model_name(name: str, expected: dict) -> None:
    parsed = parse_model_name(name)
    for key, value in expected.items():
        assert parsed[key] == value, key


@pytest.mark.parametrize("data, expected", [
    ({"validation": {"score": 0.8}, "test": {"score": 0.9, "per_example": [1, 0]}}, (0.8, 0.9, [1.0, 0.0])),
    ({"eval": {"eval_f1": 0.7, "eval_loss": 1.2}, "test": {"test_f1": 0.75}}, (0.7, 0.75, [])),
    ({"dev": 81.0, "test": 85.5}, (0.81, 0.855, [])),  # percentages
    ({"val_score": 0.6, "test_score": 0.65, "test_per_example": [0.5, 1.0]}, (0.6, 0.65, [0.5, 1.0])),
    ({"validation": {"accuracy": 0.5}, "test": {"accuracy": 0.6, "scores": [50, 100]}}, (0.5, 0.6, [0.5, 1.0])),
])
def test_lenient_json_fields(tmp_path, data: dict, expected: tuple) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    trial = read_trial(path, "TC")
    val_score, test_score, per_example = expected
    assert (trial["val_score"], trial["test_score"]) == pytest.approx((val_score, test_score))
    # element by element: pytest >= 9.2's approx refuses nested sequences
    assert len(trial["test_per_example"]) == len(per_example)
    assert all(got == pytest.approx(want) for got, want in zip(trial["test_per_example"], per_example))
    assert trial["metric"] == "f1"


def _write(tree: Path, trial_dir: str, data: dict) -> None:
    folder = tree / "210m-mlm30-12k" / "QA" / "squad" / trial_dir
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(data))


@pytest.mark.parametrize("trial_dir, data, message", [
    ("lr1e-4_sd0", {"test": {"score": 0.5}}, "needs a validation and a test score"),
    ("lr1e-4_sd0", {"validation": {"a": 0.5, "b": 0.6}, "test": 0.5}, "cannot tell which entry"),
    ("learning_rate_1e-4", {"validation": 0.5, "test": 0.5}, "lr<LR>_sd<SEED>"),
])
def test_bad_trees_are_one_clear_error(tmp_path, trial_dir: str, data: dict, message: str) -> None:
    _write(tmp_path, trial_dir, data)
    with pytest.raises(UserError, match=message):
        collect(tmp_path)


def test_empty_or_missing_tree_is_an_error(tmp_path) -> None:
    with pytest.raises(UserError, match="no <model>"):
        collect(tmp_path)
    with pytest.raises(UserError, match="not a folder"):
        collect(tmp_path / "absent")


def test_seed_spelling_and_family_case(tmp_path) -> None:
    _write(tmp_path, "lr0.0001_seed3", {"validation": 0.5, "test": 0.6})
    (row,) = collect(tmp_path)
    assert (row["lr"], row["seed"], row["family"], row["task"], row["metric"]) == (1e-4, 3, "QA", "squad", "f1")


def test_cli(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["importer", str(PAPER_TREE), str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        run_main(import_results.main)
    assert exit_info.value.code == 0
    assert "imported 60 trials" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["importer", str(tmp_path / "absent"), str(tmp_path / "fresh")])
    with pytest.raises(SystemExit) as exit_info:
        run_main(import_results.main)
    assert exit_info.value.code == 2
    assert not (tmp_path / "fresh").exists()  # no tree: no results folder either
    capsys.readouterr()
    (tmp_path / "a-file").write_text("")  # results_dir is a file: one line, nothing written
    monkeypatch.setattr(sys, "argv", ["importer", str(PAPER_TREE), str(tmp_path / "a-file")])
    with pytest.raises(SystemExit) as exit_info:
        run_main(import_results.main)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: results_dir: cannot write to {tmp_path / 'a-file'}") and err.count("\n") == 1


def _authors_file(root: Path, relative: str, val: list, test: list) -> None:
    """One results.json as the authors' evaluation repository writes it: score and scores_i per split."""
    def score(values):
        if values and isinstance(values[0], list):  # entity F1 from [tp, predicted, gold] counts
            tp, predicted, gold = (sum(v[i] for v in values) for i in range(3))
            return 2 * tp / (predicted + gold)
        return sum(values) / len(values)

    path = root / "results" / relative / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"validation": {"score": score(val), "scores_i": val},
                                "test": {"score": score(test), "scores_i": test}}))


def test_the_authors_result_tree_as_they_publish_it(tmp_path) -> None:
    repo = tmp_path / "evaluation-repo"  # their repository's root: the tree sits under results/
    for seed in range(3):
        _authors_file(repo, f"610m-clm-42k/IR/nq/msmarco_pairs_lr1e-04_sd{seed}", [0.5, 1.0], [1.0, 0.0, 0.5 + seed / 10])
        _authors_file(repo, f"610m-clm-42k/TC/conll2003/lr2e-05_sd{seed}", [[1, 1, 1]],
                      [[2, 2, 3], [seed % 2, 1, 1], [0, 1, 0]])
    rows = {(r["family"], r["seed"]): r for r in collect(repo)}
    assert len(rows) == 6
    ir = rows["IR", 1]
    assert (ir["task"], ir["train_data"], ir["lr"], ir["metric"]) == ("nq", "msmarco_pairs", 1e-4, "ndcg@10")
    assert ir["test_per_example"] == pytest.approx([1.0, 0.0, 0.6]) and ir["val_score"] == pytest.approx(0.75)
    tc = rows["TC", 1]
    assert tc["test_per_example"] == [2.0, 2.0, 3.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]  # flat, as rows store them
    assert (tc["lr"], tc["train_data"], tc["metric"]) == (2e-5, "conll2003", "entity_f1")

    import_tree(repo, tmp_path / "out")
    summary = read_rows(tmp_path / "out" / "summary.parquet").set_index("task")
    assert summary.loc["nq", "n_seeds"] == 3 and summary.loc["conll2003", "n_seeds"] == 3
    assert summary.loc["nq", "test_mean"] == pytest.approx((0.5 + 0.6 + 0.7) / 9 + 1 / 3)
    from raybiphase.results.aggregate import summarize

    booted = summarize(read_rows(tmp_path / "out" / "finetune.parquet"), bootstrap=True).set_index("task")
    low, high = booted.loc["conll2003", ["test_boot_low", "test_boot_high"]]
    assert 0 <= low <= booted.loc["conll2003", "test_mean"] <= high <= 1


def test_malformed_scores_i_is_one_clear_error(tmp_path) -> None:
    _write(tmp_path, "lr1e-4_sd0", {"validation": 0.5, "test": {"score": 0.5, "scores_i": [[1, 2]]}})
    with pytest.raises(UserError, match=r"\[true positives, predicted, gold\]"):
        collect(tmp_path)


@pytest.mark.slow  # a real S3 server round trip of many files: seconds
def test_a_tree_in_a_bucket_imports_the_same_rows_into_a_bucket(s3_bucket, tmp_path) -> None:
    import uuid

    import pyarrow.fs as pafs

    from raybiphase import storage

    root = f"{s3_bucket}/{uuid.uuid4().hex}"
    fs, path = storage.filesystem(f"{root}/tree")
    # the test's own upload of its input, through storage's retries: the local S3 server, loaded by the other
    # tests, now and then answers a write with a server error (INTERNAL_FAILURE), which a bucket client retries
    storage.retrying()(lambda at: pafs.copy_files(str(PAPER_TREE), path, destination_filesystem=fs))(f"{root}/tree")
    assert import_tree(f"{root}/tree", f"{root}/results") == (60, 0)
    assert import_tree(PAPER_TREE, tmp_path) == (60, 0)
    remote, local = read_rows(f"{root}/results/finetune.parquet"), read_rows(tmp_path / "finetune.parquet")
    assert remote.drop(columns="test_per_example").equals(local.drop(columns="test_per_example"))
    with pytest.raises(UserError, match="not a folder of evaluation results"):
        import_tree(f"{root}/missing", tmp_path)


def test_a_symbolic_link_in_a_local_tree_is_refused(tmp_path) -> None:
    """A tree's results.json that is a link could read any file this user can; it is refused, naming it."""
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(PAPER_TREE, tree)
    victim = next(tree.rglob("results.json"))
    secret = tmp_path / "secret.json"
    secret.write_text(victim.read_text())
    victim.unlink()
    victim.symlink_to(secret)
    with pytest.raises(UserError, match=rf"^{victim}: refused: a symbolic link in a tree of results"):
        collect(tree)
