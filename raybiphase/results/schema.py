"""Each appended table's one declared schema: every part of pretrain.parquet and finetune.parquet is written with it,
so any Parquet reader opens a sweep's folder as it stands (`pd.read_parquet(folder)`, polars and DuckDB on
`folder/*.parquet`, `ray.data.read_parquet(folder)`), none needing to union the parts' columns.

The columns come from the typed records (raybiphase.results.rows.PretrainRow with every metric of
raybiphase.telemetry.metrics.PretrainReport; raybiphase.results.rows.FinetuneRow) and every dotted run setting
(raybiphase.config.RunConfig), each with the Arrow type of its declared Python type: a column a part's rows leave
empty is typed there, never Parquet's null. A setting whose value is a list or a mapping is text, as
`config_columns` writes it.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

import pyarrow as pa

from raybiphase.config import RunConfig, flatten
from raybiphase.config.load import field_type
from raybiphase.results import rows as result_rows
from raybiphase.telemetry.metrics import PretrainReport, column

_RESOLVED = {"resources.num_workers": pa.int64(), "phases.clm_share": pa.float64(), "phases.clm_steps": pa.int64(),
             "train.checkpoint_every": pa.int64()}
"""Settings whose column holds a resolved value (config_columns, resolve_checkpoint_every), not the written one."""


def arrow_type(tp: Any) -> pa.DataType:
    """The Arrow type of a declared Python type: numbers, text and booleans as themselves, an optional value as its
    type, a Literal of strings as text, a list of numbers as a list of float64, anything else as text."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return arrow_type(options[0]) if len(options) == 1 else pa.string()
    if origin is typing.Literal:
        return pa.string() if all(isinstance(a, str) for a in args) else pa.int64()
    if tp is list or origin is list:
        return pa.list_(pa.float64())
    return {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}.get(tp, pa.string())


@functools.cache
def setting_fields() -> tuple[pa.Field, ...]:
    """Every dotted run setting as a column, in RunConfig's order."""
    return tuple(pa.field(key, _RESOLVED.get(key) or arrow_type(field_type(RunConfig, key)))
                 for key in flatten(RunConfig()))


def _record_fields(cls: type, skip: set[str]) -> list[pa.Field]:
    hints = typing.get_type_hints(cls)
    return [pa.field(f.name, arrow_type(hints[f.name])) for f in dataclasses.fields(cls) if f.name not in skip]


@functools.cache
def pretrain_schema() -> pa.Schema:
    """pretrain.parquet: the row's own fields, every metric a report may hold (not the resume point, never a row),
    every setting."""
    hints = typing.get_type_hints(PretrainReport)
    metrics = [pa.field(column(f), arrow_type(hints[f.name])) for f in dataclasses.fields(PretrainReport)
               if column(f) not in ("step", "resume_point")]
    own = _record_fields(result_rows.PretrainRow, {"metrics", "settings"})
    return pa.schema([*own, *metrics, *setting_fields()])


@functools.cache
def finetune_schema() -> pa.Schema:
    """finetune.parquet: the row's own fields, then every setting of the run fine-tuned (empty for baselines)."""
    return pa.schema([*_record_fields(result_rows.FinetuneRow, {"settings"}), *setting_fields()])


DECLARED = {result_rows.PRETRAIN_KEY: pretrain_schema, result_rows.FINETUNE_KEY: finetune_schema}
"""The tables with a declared schema, by their key (raybiphase.results.store.append_rows)."""


def declared(key: tuple[str, ...]) -> pa.Schema | None:
    """The declared schema of the table keyed by `key`; None for a table without one."""
    make = DECLARED.get(tuple(key))
    return make() if make else None


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly the declared columns, in order and typed (a column its rows lack: typed nulls), then any
    column the schema does not declare, as it is (kept, never dropped). ValueError naming a column whose values
    do not fit its declared type."""
    columns, fields = [], []
    for spec in schema:
        if spec.name in table.column_names:
            values = table.column(spec.name)
            if values.type != spec.type:
                try:
                    values = values.cast(spec.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                    raise ValueError(f"column {spec.name!r}: its values ({values.type}) are not {spec.type}: "
                                     f"{err}") from None
        else:
            values = pa.nulls(table.num_rows, spec.type)
        columns.append(values)
        fields.append(spec)
    for name in table.column_names:
        if name not in schema.names:
            columns.append(table.column(name))
            fields.append(table.schema.field(name))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))
