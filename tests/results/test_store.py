"""The results store: appends skip known keys, never change a recorded row, union columns, write atomically."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import threading

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raybiphase import storage
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


def _files(table) -> dict[str, bytes]:
    """Every file of a table's folder, hidden ones included, name -> bytes."""
    return {p.name: p.read_bytes() for p in table.iterdir()}


def test_a_type_clash_is_refused_and_leaves_the_table_as_it_was(tmp_path) -> None:
    path = tmp_path / "pretrain.parquet"
    append_rows(path, [_pretrain("a", 10)], key=PRETRAIN_KEY)
    before = _files(path)
    with pytest.raises(ValueError, match="tokens_seen"):
        append_rows(path, [_pretrain("a", 20, tokens_seen="many")], key=PRETRAIN_KEY)
    assert _files(path) == before


def test_a_failed_write_leaves_the_old_parts_and_no_temporary(tmp_path, monkeypatch) -> None:
    path = tmp_path / "pretrain.parquet"
    append_rows(path, [_pretrain("a", 10)], key=PRETRAIN_KEY)
    before = _files(path)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(results.pq, "write_table", crash)
    with pytest.raises(OSError, match="disk full"):
        append_rows(path, [_pretrain("a", 20)], key=PRETRAIN_KEY)
    assert _files(path) == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["pretrain.parquet"]


def test_each_append_writes_one_new_part_and_rewrites_none(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", 1e-4, 0)], key=FINETUNE_KEY)
    first = _files(path)
    append_rows(path, [_trial("r", 1e-4, 0), _trial("r", 1e-4, 1)], key=FINETUNE_KEY)
    after = _files(path)
    assert len(first) == 1 and len(after) == 2 and all(after[name] == data for name, data in first.items())
    assert all(name.startswith("part-") and name.endswith(".parquet") for name in after)
    assert append_rows(path, [_trial("r", 1e-4, 1)], key=FINETUNE_KEY) == 1 and len(_files(path)) == 2


def test_schema_version_and_key_are_in_every_part_s_metadata(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", 1e-4, 0)], key=FINETUNE_KEY)
    (part,) = path.iterdir()
    meta = pq.read_schema(part).metadata
    assert int(meta[b"raybiphase.schema_version"]) == results.SCHEMA_VERSION == results.schema_version(path)
    assert json.loads(meta[b"raybiphase.key"]) == list(FINETUNE_KEY)
    assert b"pandas" not in meta
    assert results.schema_version(tmp_path / "absent.parquet") is None


def test_a_part_from_a_newer_schema_is_refused(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", 1e-4, 0)], key=FINETUNE_KEY)
    (part,) = path.iterdir()
    table = pq.read_table(part)
    pq.write_table(table.replace_schema_metadata({b"raybiphase.schema_version": b"99"}), part)
    with pytest.raises(UserError, match="schema version 99"):
        read_rows(path)


def test_a_damaged_part_is_named_in_one_line_and_nothing_is_appended(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", 1e-4, seed) for seed in range(3)], key=FINETUNE_KEY)
    (part,) = path.iterdir()
    whole = part.read_bytes()
    for damaged in (whole[: len(whole) // 2], b"not parquet at all"):  # a copy cut short, a file overwritten
        part.write_bytes(damaged)
        for read in (lambda: read_rows(path), lambda: done_keys(path, FINETUNE_KEY),
                     lambda: append_rows(path, [_trial("r", 1e-4, 9)], key=FINETUNE_KEY)):
            with pytest.raises(UserError, match=f"^{part}: not a readable Parquet table \\(") as err:
                read()
            assert "\n" not in str(err.value) and "run `raybiphase repair SPEC`" in str(err.value)
        assert _files(path) == {part.name: damaged}  # left as it was found, for the user to look at


def test_a_table_written_as_one_file_reads_and_its_first_append_keeps_its_rows(tmp_path) -> None:
    """A table of an older raybiphase (one Parquet file) reads as before; appending moves it into the folder."""
    path = tmp_path / "finetune.parquet"
    legacy = pa.Table.from_pylist([_trial("r", 1e-4, seed) for seed in range(2)])
    pq.write_table(legacy.replace_schema_metadata({b"raybiphase.schema_version": b"1",
                                                   b"raybiphase.key": json.dumps(FINETUNE_KEY).encode()}), path)
    assert len(read_rows(path)) == 2 and done_keys(path, FINETUNE_KEY) == {("r", 100, "tweet_sentiment", 1e-4, s,
                                                                             "raybiphase") for s in (0, 1)}
    assert append_rows(path, [_trial("r", 1e-4, 1), _trial("r", 1e-4, 2)], key=FINETUNE_KEY) == 1
    assert path.is_dir() and len(_files(path)) == 2
    frame = read_rows(path)
    assert list(frame["seed"]) == [0, 1, 2] and list(frame["val_score"]) == [0.70, 0.71, 0.72]


def test_a_key_two_writers_both_appended_reads_once_as_the_first_wrote_it(tmp_path) -> None:
    """Writers on a bucket share no lock: both may append a key; the part written first is the one read."""
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", 1e-4, 0)], key=FINETUNE_KEY)
    late = pa.Table.from_pylist([{**_trial("r", 1e-4, 0), "val_score": 0.99}, _trial("r", 1e-4, 1)])
    (first,) = path.iterdir()
    later = path / "part-99999999999999999999-x.parquet"
    pq.write_table(late.replace_schema_metadata(pq.read_schema(first).metadata), later)
    frame = read_rows(path)
    assert list(frame["seed"]) == [0, 1] and frame.loc[0, "val_score"] == 0.70
    assert append_rows(path, [_trial("r", 1e-4, 1)], key=FINETUNE_KEY) == 1


def test_readable_by_pyarrow_pandas_and_duckdb(tmp_path) -> None:
    path = tmp_path / "finetune.parquet"
    append_rows(path, [_trial("r", lr, seed) for lr in (1e-4, 5e-4) for seed in (0, 1)], key=FINETUNE_KEY)
    append_rows(path, [_trial("r", 1e-3, 0)], key=FINETUNE_KEY)  # a second part
    assert pq.read_table(path).num_rows == 5
    assert pd.read_parquet(path)["lr"].nunique() == 3
    duckdb = pytest.importorskip("duckdb")
    query = f"SELECT count(*), max(val_score) FROM read_parquet('{path}/*.parquet', union_by_name=true)"
    ((count, best),) = duckdb.sql(query).fetchall()
    assert count == 5 and best == pytest.approx(0.71)


def test_uri_paths_go_through_pyarrow_filesystems(tmp_path) -> None:
    uri = f"file://{tmp_path}/sweep/pretrain.parquet"
    assert append_rows(uri, [_pretrain("a", 10)], key=PRETRAIN_KEY) == 0
    assert append_rows(uri, [_pretrain("a", 10), _pretrain("a", 20)], key=PRETRAIN_KEY) == 1
    assert len(read_rows(tmp_path / "sweep" / "pretrain.parquet")) == 2
    assert done_keys(uri, PRETRAIN_KEY) == {("a", 10), ("a", 20)}
    assert not [p for p in (tmp_path / "sweep" / "pretrain.parquet").iterdir() if p.name.endswith(".tmp")]


def test_missing_file_reads_empty_and_missing_key_column_is_an_error(tmp_path) -> None:
    assert read_rows(tmp_path / "none.parquet").empty
    assert done_keys(tmp_path / "none.parquet", PRETRAIN_KEY) == set()
    with pytest.raises(ValueError, match="step"):
        append_rows(tmp_path / "p.parquet", [{"run": "a"}], key=PRETRAIN_KEY)


def _append_many(path: str, worker: int) -> None:
    for step in range(15):
        append_rows(path, [_pretrain(f"w{worker}", step)], key=PRETRAIN_KEY)


@pytest.mark.slow  # processes appending at once: about 10 s
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


def test_two_appenders_on_one_bucket_table_keep_every_row(s3_bucket) -> None:
    """A bucket has no lock: two writers that meet each add their own parts, and all 2 x 3 rows are read back."""
    path = f"{s3_bucket}/appenders/pretrain.parquet"
    start = threading.Barrier(2)

    def appender(worker: int) -> None:
        start.wait()
        for step in range(3):
            append_rows(path, [_pretrain(f"w{worker}", step)], key=PRETRAIN_KEY)

    threads = [threading.Thread(target=appender, args=(w,)) for w in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(read_rows(path)) == 6
    assert done_keys(path, PRETRAIN_KEY) == {(f"w{w}", step) for w in range(2) for step in range(3)}


def test_a_one_file_bucket_table_becomes_a_folder_on_its_first_append(s3_bucket) -> None:
    path = f"{s3_bucket}/legacy/finetune.parquet"
    legacy = pa.Table.from_pylist([_trial("r", 1e-4, 0)])
    fs, inner = storage.filesystem(path)
    pq.write_table(legacy.replace_schema_metadata({b"raybiphase.key": json.dumps(FINETUNE_KEY).encode()}), inner,
                   filesystem=fs)
    assert len(read_rows(path)) == 1
    assert append_rows(path, [_trial("r", 1e-4, 0), _trial("r", 1e-4, 1)], key=FINETUNE_KEY) == 1
    assert not storage.is_file(path) and len(storage.list_files(path)) == 2
    assert list(read_rows(path)["seed"]) == [0, 1]


def test_every_part_of_a_declared_table_has_its_one_schema_whatever_its_rows_hold(tmp_path) -> None:
    """A baseline's part (no settings, finetune_settings empty) and a trial's share one schema, every column typed:
    pandas reads the folder as it stands, every row and column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raybiphase.results.schema import finetune_schema

    path = tmp_path / "finetune.parquet"
    baseline = {k: v for k, v in _trial("bm25", 0.0, 0, "baseline").items() if "." not in k}
    append_rows(path, [{**baseline, "finetune_settings": None}], key=FINETUNE_KEY)
    append_rows(path, [_trial("r", 1e-4, 0, finetune_settings="abc", **{"train.seed": 3})], key=FINETUNE_KEY)
    def shape(schema):  # names and types (Parquet names a list's item "element" when read back)
        return tuple((f.name, f.type.value_type if pa.types.is_list(f.type) else f.type) for f in schema)

    parts = sorted(path.glob("part-*.parquet"))
    assert len(parts) == 2 and {shape(pq.read_schema(p)) for p in parts} == {shape(finetune_schema())}
    assert all(field.type != pa.null() for field in finetune_schema())
    frame = pd.read_parquet(path)
    assert len(frame) == 2 and frame.loc[frame["run"] == "r", "train.seed"].item() == 3
    assert list(frame.columns) == list(read_rows(path).columns)


def test_a_table_of_an_older_version_whose_parts_differ_still_reads_and_takes_new_parts(tmp_path) -> None:
    """Parts written before the declared schema (their own columns, a column null-typed, an int where the schema
    says float) read with `read_rows`, and a new part appends beside them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raybiphase import storage

    path = tmp_path / "pretrain.parquet"
    path.mkdir()
    old = pa.table({"run": ["a"], "step": [10], "val/clm_loss": [5], "checkpoint": pa.nulls(1, pa.null())})
    pq.write_table(old, path / storage.part_name())
    append_rows(path, [_pretrain("a", 20)], key=PRETRAIN_KEY)
    frame = read_rows(path).sort_values("step")
    assert frame["step"].tolist() == [10, 20] and frame["val/clm_loss"].tolist() == [5.0, 4.98]
