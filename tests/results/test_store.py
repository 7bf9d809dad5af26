"""The results store: appends skip known keys, never change a recorded row, union columns, write atomically."""

from __future__ import annotations

import math
import multiprocessing
import os

import pandas as pd
import pyarrow.parquet as pq
import pytest

from raybiphase.errors import UserError
from raybiphase.results import store as results
from raybiphase.results.rows import FINETUNE_KEY, PRETRAIN_KEY
from raybiphase.results.store import append_rows, done_keys, read_rows


def _pretrain(run: str, step: int, **extra) -> dict:
    return {"run": run, "sweep": "s", "step": step, "tokens_seen": step * 4096, "phase": 0, "objective": "clm",
            "val/clm_loss": 5.0 - step / 1000, "val/mlm_loss": math.nan, "checkpoint": "", "phases.clm_share": 0.5,
            "phases.steps": 100, **extra}


def _trial(run: str, lr: float, seed: int, source: str = "raybiphase", **extra) -> dict:
    return {"run": run, "sweep": "s", "checkpoint": f"/ckpt/{run}", "pretrain_step": 100, "task": "tweet_sentiment",
            "family": "SC", "dataset": "tweet_eval", "metric": "accuracy", "lr": lr, "seed": seed,
            "val_score": 0.7 + seed / 100, "test_score": 0.71, "steps": 50, "stopped_early": False, "seconds": 2.5,
            "test_per_example": [1.0, 0.0, 1.0], "source": source, "phases.clm_share": 0.5, **extra}


def test_append_skips_existing_keys_and_never_changes_old_rows(tmp_path) -> None:
    path = tmp_path / "pretrain.parquet"
    assert append_rows(path, [_pretrain("a", 10), _pretrain("a", 20)], key=PRETRAIN_KEY) == 0
    before = read_rows(path)
    changed = _pretrain("a", 10, **{"val/clm_loss": 99.0})  # same key, new value: must be ignored
    skipped = append_rows(path, [changed, _pretrain("b", 10, **{"train.seed": 3})], key=PRETRAIN_KEY)
    after = read_rows(path)
    assert skipped == 1 and len(after) == 3
    pd.testing.assert_frame_equal(after.iloc[:2][before.columns], before)  # old values unchanged
    assert pd.isna(after.loc[0, "train.seed"]) and after.loc[2, "train.seed"] == 3  # new column: null in old rows
    assert done_keys(path, PRETRAIN_KEY) == {("a", 10), ("a", 20), ("b", 10)}


def test_duplicates_within_one_append_are_kept_once(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    assert append_rows(path, [_trial("r", 1e-4, 0), _trial("r", 1e-4, 0), _trial("r", 1e-4, 0, "paper")],
                       key=FINETUNE_KEY) == 1
    assert len(read_rows(path)) == 2


def test_old_columns_missing_from_new_rows_become_null(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", 1e-4, 0)], key=FINETUNE_KEY)
    row = _trial("r", 1e-4, 1)
    del row["seconds"], row["test_per_example"]
    append_rows(path, [row], key=FINETUNE_KEY)
    frame = read_rows(path)
    assert frame.loc[0, "seconds"] == 2.5 and pd.isna(frame.loc[1, "seconds"])
    assert list(frame.loc[0, "test_per_example"]) == [1.0, 0.0, 1.0] and frame.loc[1, "test_per_example"] is None


def test_a_type_clash_is_refused_and_leaves_the_file_as_it_was(tmp_path) -> None:
    path = tmp_path / "pretrain.parquet"
    append_rows(path, [_pretrain("a", 10)], key=PRETRAIN_KEY)
    data = path.read_bytes()
    with pytest.raises(ValueError, match="tokens_seen"):
        append_rows(path, [_pretrain("a", 20, tokens_seen="many")], key=PRETRAIN_KEY)
    assert path.read_bytes() == data


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch) -> None:
    path = tmp_path / "pretrain.parquet"
    append_rows(path, [_pretrain("a", 10)], key=PRETRAIN_KEY)
    data = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(results.pq, "write_table", crash)
    with pytest.raises(OSError, match="disk full"):
        append_rows(path, [_pretrain("a", 20)], key=PRETRAIN_KEY)
    assert path.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["pretrain.parquet"]


def test_schema_version_and_key_are_in_the_parquet_metadata(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", 1e-4, 0)], key=FINETUNE_KEY)
    meta = pq.read_schema(path).metadata
    assert int(meta[b"raybiphase.schema_version"]) == results.SCHEMA_VERSION == results.schema_version(path)
    assert b"pandas" not in meta
    assert results.schema_version(tmp_path / "absent.parquet") is None


def test_a_file_from_a_newer_schema_is_refused(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", 1e-4, 0)], key=FINETUNE_KEY)
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({b"raybiphase.schema_version": b"99"}), path)
    with pytest.raises(UserError, match="schema version 99"):
        read_rows(path)


def test_a_damaged_table_is_named_in_one_line_and_nothing_is_appended(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", 1e-4, seed) for seed in range(3)], key=FINETUNE_KEY)
    whole = path.read_bytes()
    for damaged in (whole[: len(whole) // 2], b"not parquet at all"):  # a copy cut short, a file overwritten
        path.write_bytes(damaged)
        for read in (lambda: read_rows(path), lambda: done_keys(path, FINETUNE_KEY),
                     lambda: append_rows(path, [_trial("r", 1e-4, 9)], key=FINETUNE_KEY)):
            with pytest.raises(UserError, match=f"^{path}: not a readable Parquet table \\(") as err:
                read()
            assert "\n" not in str(err.value)
        assert path.read_bytes() == damaged  # left as it was found, for the user to look at


def test_readable_by_pyarrow_pandas_and_duckdb(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", lr, seed) for lr in (1e-4, 5e-4) for seed in (0, 1)], key=FINETUNE_KEY)
    assert pq.read_table(path).num_rows == 4
    assert pd.read_parquet(path)["lr"].nunique() == 2
    duckdb = pytest.importorskip("duckdb")
    ((count, best),) = duckdb.sql(f"SELECT count(*), max(val_score) FROM '{path}'").fetchall()
    assert count == 4 and best == pytest.approx(0.71)


def test_uri_paths_go_through_pyarrow_filesystems(tmp_path) -> None:
    uri = f"file://{tmp_path}/sweep/pretrain.parquet"
    assert append_rows(uri, [_pretrain("a", 10)], key=PRETRAIN_KEY) == 0
    assert append_rows(uri, [_pretrain("a", 10), _pretrain("a", 20)], key=PRETRAIN_KEY) == 1
    assert len(read_rows(tmp_path / "sweep" / "pretrain.parquet")) == 2
    assert done_keys(uri, PRETRAIN_KEY) == {("a", 10), ("a", 20)}
    assert not [p for p in (tmp_path / "sweep").iterdir() if p.name.endswith(".tmp")]


def test_missing_file_reads_empty_and_missing_key_column_is_an_error(tmp_path) -> None:
    assert read_rows(tmp_path / "none.parquet").empty
    assert done_keys(tmp_path / "none.parquet", PRETRAIN_KEY) == set()
    with pytest.raises(ValueError, match="step"):
        append_rows(tmp_path / "p.parquet", [{"run": "a"}], key=PRETRAIN_KEY)


def _append_many(path: str, worker: int) -> None:
    for step in range(15):
        append_rows(path, [_pretrain(f"w{worker}", step)], key=PRETRAIN_KEY)


def test_concurrent_appenders_lose_no_row(tmp_path) -> None:
    path = str(tmp_path / "pretrain.parquet")
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_append_many, args=(path, w)) for w in range(2)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert len(done_keys(path, PRETRAIN_KEY)) == 30


def test_write_summary_aggregates_finetune_rows(tmp_path) -> None:
    rows = [_trial("r", lr, seed, **{"val_score": v, "test_score": t})
            for lr, v, t in ((1e-4, 0.80, 0.78), (5e-4, 0.85, 0.83)) for seed in (0, 1, 2)]
    append_rows(tmp_path / "finetune.parquet", rows, key=FINETUNE_KEY)
    path = results.write_summary(tmp_path)
    assert os.path.basename(path) == "summary.parquet"
    summary = read_rows(path)
    assert len(summary) == 1 and summary.loc[0, "best_lr"] == 5e-4
    assert summary.loc[0, "test_mean"] == pytest.approx(0.83) and summary.loc[0, "n_seeds"] == 3
    assert results.schema_version(path) == results.SCHEMA_VERSION


def test_typed_rows_flatten_to_dotted_columns_and_back():
    from raybiphase.config import RunConfig, from_dict
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.tasks import get_task
    from raybiphase.finetune.trial import TrialResult
    from raybiphase.results.rows import FinetuneRow, config_columns

    run = from_dict(RunConfig, {"phases": {"steps": 40, "clm_steps": 10}})
    columns = config_columns(run)
    assert columns["phases.clm_share"] == 0.25 and columns["phases.clm_steps"] == 10  # resolved, whichever way given
    assert "clm_share" not in columns
    spec = TrialSpec("tiny-clm-10-mlm40-40-abc123", 40, "/ckpt/hf", get_task("tweets"), 1e-4, 2, "/r.json", "s",
                     columns)
    assert spec.planned().key == ("tiny-clm-10-mlm40-40-abc123", 40, "tweets", 1e-4, 2)  # run and step stay apart
    done = spec.finished(TrialResult(val_score=0.5, test_score=0.6, metric="accuracy", steps=9, seconds=1.5,
                                     test_per_example=[1.0, 0.0], secondary_metric=None,
                                     test_secondary=float("nan")))
    record = done.record()
    assert record["phases.clm_share"] == 0.25 and record["pretrain_step"] == 40 and record["steps_run"] == 9
    assert FinetuneRow.from_record(record) == done
