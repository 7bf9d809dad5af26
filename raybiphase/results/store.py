"""The results store: flat rows in Parquet, appended as part files, never rewritten.

Tables per sweep, under `results/<sweep>/`:

    pretrain.parquet/  one row per reported checkpoint/eval of a pretraining run      key rows.PRETRAIN_KEY
    finetune.parquet/  one row per fine-tuning trial (ours: source="raybiphase",     key rows.FINETUNE_KEY
                       the authors' imported results: source="paper")
    summary.parquet    derived by `write_summary` from finetune.parquet (raybiphase.results.aggregate); rewritten freely

Columns: raybiphase.results.rows builds every row (scores are fractions in [0, 1]; test_score is NaN when ASHA
stopped the trial); summary.parquet: raybiphase.results.aggregate.summarize.

An appended table is a folder of part files (Spark's layout, `storage.part_name()`): `append_rows` reads the table,
drops incoming rows whose key is already there (counted, never changed), gives the rest the table's types for the
columns it has, and writes them as one new, uniquely named part (a temporary file renamed into place locally; an
object published whole on a bucket). No append rewrites another's file, so two writers that meet, on one machine
or on a bucket, lose no row; where both appended the same key, the reader keeps the row of the part written first
(parts sort by the writer's clock). Reading unions the parts' columns (a new column is null in old rows, an old
column is null in new rows). Local appenders also queue on a lock (fcntl, on a hidden `.<name>.lock` beside the
table), so on one machine a key is never written twice. A table written as one file by an older raybiphase still
reads, and its first append moves that file into the folder as its first part.

pretrain.parquet and finetune.parquet are written in their one declared schema (raybiphase.results.schema): every
part has the same columns with the same types, so any reader opens the folder as it stands (`pd.read_parquet`,
polars and DuckDB on `<table>/*.parquet`, Ray Data). Every part's Parquet key-value metadata holds
`raybiphase.schema_version` and the key columns. `read_rows` also reads tables of older versions, whose parts
differ (it unions them).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raybiphase import locks, storage
from raybiphase.errors import UserError
from raybiphase.results.aggregate import SUMMARY_KEY, summarize
from raybiphase.results.schema import conform, declared

SCHEMA_VERSION = 1
"""Bump when a column changes meaning; readers refuse files written by a newer version."""
VERSION_KEY = b"raybiphase.schema_version"
KEY_COLUMNS_KEY = b"raybiphase.key"


Rows = Sequence[Mapping[str, Any]] | pd.DataFrame
T = TypeVar("T")


@storage.retrying()
def _parts(path: str | os.PathLike) -> list[str]:
    """The files of a table: itself when it is one file (written by an older raybiphase), else its folder's part
    files in the order they were written; [] when there is no table."""
    fs, inner = storage.filesystem(path)
    kind = fs.get_file_info(inner).type
    if kind == pafs.FileType.File:
        return [str(path)]
    if kind != pafs.FileType.Directory:
        return []
    names = sorted(n for n in storage.list_files(path) if n.startswith(storage.PART_PREFIX)
                   and n.endswith(storage.PART_SUFFIX))
    return [storage.join(path, name) for name in names]


@storage.retrying()
def _read_part(part: str, columns: Sequence[str] | None) -> pa.Table:
    fs, inner = storage.filesystem(part)
    if columns is not None:
        present = set(pq.read_schema(inner, filesystem=fs).names)
        columns = [c for c in columns if c in present]
    return pq.read_table(inner, filesystem=fs, columns=columns)


@storage.retrying()
def _key_of(part: str) -> tuple[str, ...]:
    fs, inner = storage.filesystem(part)
    return tuple(json.loads((pq.read_schema(inner, filesystem=fs).metadata or {}).get(KEY_COLUMNS_KEY, b"[]")))


REBUILD = ("a sweep's tables are rebuilt from its own journals: run `raybiphase repair SPEC` with the sweep's spec "
           "(it moves damaged parts aside; pretraining rows come back from the runs' histories, fine-tuning rows "
           "from the trials' records; nothing is trained again)")


def damaged_parts(path: str | os.PathLike) -> list[str]:
    """The parts of the table at `path` that are not readable Parquet files (truncated, overwritten)."""
    damaged = []
    for part in _parts(path):
        try:
            _read_part(part, [])
        except (pa.ArrowInvalid, OSError) as err:
            if not (isinstance(err, OSError) and storage.is_uri(part) and storage.transient(err)):
                damaged.append(part)
    return damaged


def _checked(read: Callable[[], T], location: str | os.PathLike) -> T:
    """read(), or a UserError naming `location` when it is not a Parquet file or cannot be reached."""
    try:
        return read()
    except (pa.ArrowInvalid, OSError) as err:
        reason = " ".join(str(err).split())[:200]
        if isinstance(err, OSError) and storage.is_uri(location) and storage.transient(err):  # retried, still down
            raise UserError(f"{location}: cannot read it ({reason})") from None
        raise UserError(f"{location}: not a readable Parquet table ({reason}); {REBUILD}") from None


def _read_table(path: str | os.PathLike, columns: Sequence[str] | None = None) -> pa.Table | None:
    """The table at `path`, its parts' columns unioned and a key recorded twice kept once (the row of the part
    written first); None when there is none. A UserError naming the file when a part is not a Parquet file
    (truncated, overwritten) or was written by a newer raybiphase."""
    parts = _checked(lambda: _parts(path), path)
    key = _checked(lambda: _key_of(parts[0]), parts[0]) if len(parts) > 1 else ()  # every append gives the same
    wanted = None if columns is None else list(dict.fromkeys([*columns, *key]))
    tables = []
    for part in parts:
        table = _checked(lambda: _read_part(part, wanted), part)
        version = int((table.schema.metadata or {}).get(VERSION_KEY, b"0"))
        if version > SCHEMA_VERSION:
            raise UserError(f"{part} has schema version {version}; this raybiphase reads up to {SCHEMA_VERSION}")
        tables.append(table)
    if not tables:
        return None
    table = functools.reduce(_union, tables)
    if key and set(key) <= set(table.column_names):
        table = table.take(pa.array(_first_of_each(_key_tuples(table, key)), type=pa.int64()))
    if columns is not None:
        table = table.select([c for c in table.column_names if c in columns])
    return table


def _first_of_each(keys: Iterable[tuple], recorded: Iterable[tuple] = ()) -> list[int]:
    """The indices of the first row of each key not already `recorded`."""
    seen = set(recorded)
    keep = []
    for index, row_key in enumerate(keys):
        if row_key not in seen:
            seen.add(row_key)
            keep.append(index)
    return keep


@storage.retrying()
def _make_folder(path: str | os.PathLike) -> None:
    """Turn a table written as one file (by an older raybiphase) into a folder whose first part is that file, so
    that appends add parts beside it. Locally a hard link in a staging folder, the file's removal and a rename:
    a reader finds no table only between the last two, and a crash there is finished by the next call. On a
    bucket a copy, then the file's removal: until then readers read the file, which holds every row."""
    fs, inner = storage.filesystem(path)
    first = f"{storage.PART_PREFIX}{0:020d}-legacy{storage.PART_SUFFIX}"  # sorts before every appended part
    if isinstance(fs, pafs.LocalFileSystem):
        table = Path(inner)
        staging = table.with_name(f".{table.name}.folder")
        if not table.exists() and staging.is_dir():  # a crash between the removal and the rename
            os.rename(staging, table)
        if not table.is_file():
            return
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        os.link(table, staging / first)
        os.unlink(table)
        os.rename(staging, table)
        return
    if fs.get_file_info(inner).type == pafs.FileType.File:
        fs.copy_file(inner, f"{inner}/{first}")
        fs.delete_file(inner)


def _with_metadata(table: pa.Table, key: Sequence[str]) -> pa.Table:
    meta = dict(table.schema.metadata or {})
    meta.pop(b"pandas", None)  # pandas index metadata would go stale as rows are added
    meta[VERSION_KEY] = str(SCHEMA_VERSION).encode()
    meta[KEY_COLUMNS_KEY] = json.dumps(list(key)).encode()
    return table.replace_schema_metadata(meta)


@storage.retrying()
def _write_atomic(table: pa.Table, path: str | os.PathLike) -> None:
    """Temporary file in the same folder, fsync, rename over `path`: readers never see a half-written file."""
    storage.check_fence(path)
    if storage.is_uri(path):
        fs, inner = storage.filesystem(path)
        parent = inner.rsplit("/", 1)[0]
        fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.{inner.rsplit('/', 1)[-1]}.{uuid.uuid4().hex}.tmp"
        pq.write_table(table, tmp, filesystem=fs)
        fs.move(tmp, inner)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            pq.write_table(table, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _to_table(rows: Rows) -> pa.Table:
    if isinstance(rows, pd.DataFrame):
        return pa.Table.from_pandas(rows, preserve_index=False)
    columns: dict[str, None] = {}  # every key of every row, in first-seen order (from_pylist reads only row 0's)
    for row in rows:
        columns.update(dict.fromkeys(row))
    return pa.Table.from_pydict({name: [row.get(name) for row in rows] for name in columns})


def _key_tuples(table: pa.Table, key: Sequence[str]) -> list[tuple]:
    missing = [k for k in key if k not in table.column_names]
    if missing:
        raise ValueError(f"rows lack the key column(s) {missing}; the key is {list(key)}")
    columns = [table.column(k).to_pylist() for k in key]
    return list(zip(*columns)) if columns else []


def _conform(new: pa.Table, old_schema: pa.Schema) -> pa.Table:
    """Give `new` the old file's types for shared columns: old rows keep their exact values and types."""
    for name in new.column_names:
        if name not in old_schema.names:
            continue
        old_type, new_type = old_schema.field(name).type, new.schema.field(name).type
        if old_type == new_type or pa.types.is_null(old_type):
            continue
        try:
            column = new.column(name).cast(old_type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise ValueError(f"column {name!r}: new rows are {new_type}, the file has {old_type}: {err}") from None
        new = new.set_column(new.schema.get_field_index(name), name, column)
    return new


def _chunks(column: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]


def _cast_either(new_col: pa.ChunkedArray, old_col: pa.ChunkedArray) -> pa.ChunkedArray:
    """`new_col` in the old column's type when its values fit it, else as it is (the old column is then cast to
    it: an int column meeting float values becomes float)."""
    try:
        return new_col.cast(old_col.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return new_col


def _union(old: pa.Table, new: pa.Table) -> pa.Table:
    """Old columns first (types kept; a column null so far takes the new type), then columns only new rows have."""
    columns, fields = [], []
    for name in old.column_names:
        old_col = old.column(name)
        if name in new.column_names:
            new_col = new.column(name)
            if pa.types.is_null(old_col.type) and not pa.types.is_null(new_col.type):
                old_col = pa.nulls(len(old), new_col.type)
            elif new_col.type != old_col.type:  # a part of an older version typed it otherwise
                new_col = _cast_either(new_col, old_col)
                old_col = old_col.cast(new_col.type)
        else:
            new_col = pa.nulls(len(new), old_col.type)
        columns.append(pa.chunked_array([*_chunks(old_col), *_chunks(new_col)], type=old_col.type))
        fields.append(pa.field(name, old_col.type))
    for name in new.column_names:
        if name not in old.column_names:
            new_col = new.column(name)
            columns.append(pa.chunked_array([pa.nulls(len(old), new_col.type), *_chunks(new_col)], type=new_col.type))
            fields.append(pa.field(name, new_col.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=old.schema.metadata))


def append_rows(path: str | os.PathLike, rows: Rows, key: Sequence[str]) -> int:
    """Append the rows whose key is not in the table yet, as one new part file; return how many were skipped as
    already present.

    Rows are dicts (or a DataFrame) of column -> value; a row repeated within `rows` is kept once.
    """
    key = tuple(key)
    new = _to_table(rows)
    if new.num_rows == 0:
        return 0
    with locks.local_lock(path):
        _make_folder(path)
        old = _read_table(path)
        keep = _first_of_each(_key_tuples(new, key), _key_tuples(old, key) if old is not None else ())
        skipped = new.num_rows - len(keep)
        if not keep:
            return skipped
        new = new.take(pa.array(keep, type=pa.int64()))
        schema = declared(key)
        if schema is not None:  # every part in the table's one schema: any reader opens the folder
            new = conform(new, schema)
        elif old is not None:
            new = _conform(new, old.schema)
        _write_atomic(_with_metadata(new, key), storage.join(path, storage.part_name()))
    return skipped


def read_rows(path: str | os.PathLike, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """All rows as a DataFrame; an empty one when the file does not exist."""
    table = _read_table(path, None if columns is None else list(columns))
    return pd.DataFrame(columns=list(columns or [])) if table is None else table.to_pandas()


def done_keys(path: str | os.PathLike, key: Sequence[str]) -> set[tuple]:
    """The keys already recorded: a resumed sweep skips these runs or trials (reads the key columns only)."""
    table = _read_table(path, list(key))
    return set(_key_tuples(table, key)) if table is not None else set()


def schema_version(path: str | os.PathLike) -> int | None:
    """The schema version stored in the file's metadata (None when the file does not exist)."""
    table = _read_table(path, [])
    return None if table is None else int(table.schema.metadata[VERSION_KEY])


def write_summary(results_dir: str | os.PathLike) -> str:
    """Aggregate finetune.parquet (best LR, mean ± 95% CI, LR spread) into summary.parquet; return its path."""

    trials = read_rows(storage.join(results_dir, storage.FINETUNE_FILE))
    summary = summarize(trials)
    path = storage.join(results_dir, storage.SUMMARY_FILE)
    with locks.local_lock(path):
        _write_atomic(_with_metadata(pa.Table.from_pandas(summary, preserve_index=False), SUMMARY_KEY), path)
    return path


def read_table(location: str) -> list[dict]:
    """The rows of a results table as records; none when it does not exist."""
    return read_rows(location).to_dict("records")
