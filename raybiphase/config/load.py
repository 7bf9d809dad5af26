"""Strict loading for any frozen config dataclass: YAML, `--set dotted.key=value`, dotted names out.

`from_dict(cls, data, overrides)` builds `cls` (a RunConfig or a SweepSpec) strictly: an unknown key (with the
closest known one suggested), a wrong type, a value out of range or inconsistent values raise `ConfigError` with
one line that names the dotted key; `read_yaml` also rejects a key given twice in one mapping (PyYAML would keep
the last). The same dotted names (`phases.mask_ratio`) are used by `--set` overrides,
the sweep grid, Tune's search space, Parquet columns and W&B (`flatten`).

A field whose value never changes a run's weights says so once, on the field: `field(..., metadata=NOT_WEIGHTS)`
(raybiphase.config.identity.weights_settings reads it). A section marked `metadata=INLINE` is written at the level
above: a sweep spec holds its base run as `spec.run`, and its file and dotted names say `train.lr`, not
`run.train.lr` (every function here reads and writes it that way).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from raybiphase.errors import ConfigError

T = TypeVar("T")

NOT_WEIGHTS = {"weights": False}
"""Field metadata: this setting never changes a run's weights (where results go, how often it evaluates...)."""
INLINE = {"inline": True}
"""Field metadata: this section's settings are written at the level above (module docstring)."""

_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")
"""Exponent notation without a dot (3e-3), which YAML 1.1 leaves a string."""


def check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


def ratio(value: float, key: str) -> None:
    check(0.0 < value < 1.0, key, f"{value} is out of range; allowed: a ratio in (0, 1)")


def share(value: float, key: str) -> None:
    check(0.0 <= value <= 1.0, key, f"{value} is out of range; allowed: a share in [0, 1]")


def positive(value: float, key: str) -> None:
    check(0 < value < math.inf, key, f"{value} is out of range; allowed: a positive number")


def non_negative(value: float, key: str) -> None:
    check(0 <= value < math.inf, key, f"{value} is out of range; allowed: zero or more")


def counted(value: int, key: str, most: int) -> None:
    """A count between 1 and `most`: a typo's 1e15 is said here, not as a memory error once the run starts."""
    check(0 < value <= most, key, f"{value:,} is out of range; allowed: 1 to {most:,}")


def distinct(values: Any, key: str) -> None:
    """Each value once: a repeated seed, learning rate, task or grid value would silently run as one."""
    values = list(values)
    for i, value in enumerate(values):
        check(value not in values[:i], key, f"{value!r} is listed twice; give each value once")


URI_SCHEMES = ("s3", "gs", "gcs")


def location(value: str | None, key: str) -> None:
    """A local path or a bucket URI the storage layer (pyarrow.fs) serves. `file://` is refused: a local folder is
    written as a plain path, which gets everything local storage does (atomic writes, the pre-flight checks, the
    free-space check)."""
    if value and "://" in value:
        scheme = value.split("://", 1)[0]
        check(scheme != "file", key, f"{value!r}: write a local folder as a plain path "
              f"({value.split('://', 1)[1] or '/'}), not a file:// URI")
        check(scheme in URI_SCHEMES, key, f"unknown URI scheme {scheme!r} in {value!r}; allowed: a local path or "
              + ", ".join(f"{s}://" for s in URI_SCHEMES))


# --------------------------------------------------------------------------------------------- strict loading


def inline(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("inline"))


@functools.cache
def _hints(cls: type) -> Mapping[str, Any]:
    """A config class's settings by the name its file gives them, each with its type, read once per class (a grid
    of many runs builds each class many times): an INLINE section's settings in its place."""
    hints, out = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        out.update(_hints(hints[f.name]) if inline(f) else {f.name: hints[f.name]})
    return types.MappingProxyType(out)


@functools.cache
def _inline_of(cls: type) -> Mapping[str, tuple[str, type]]:
    """{setting name: (the INLINE field holding it, that field's class)} of a config class."""
    hints = typing.get_type_hints(cls)
    return types.MappingProxyType({name: (f.name, hints[f.name]) for f in dataclasses.fields(cls) if inline(f)
                                   for name in _hints(hints[f.name])})


def field_type(root: type, dotted: str) -> Any:
    """The declared type of a dotted key under `root`, or ConfigError naming it (with the closest known key)."""
    cls: Any = root
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        hints = _hints(cls)
        if part not in hints:
            prefix = ".".join(parts[:depth])
            _unknown(prefix, part, list(hints))
        tp = hints[part]
        if depth == len(parts) - 1:
            return tp
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"{dotted}: {'.'.join(parts[: depth + 1])} is a value, not a section")
        cls = tp
    return cls


def _unknown(prefix: str, key: str, known: list[str]) -> typing.NoReturn:
    """One line: the unknown key, the closest known ones (at most three), or the whole section when it is short."""
    name = f"{prefix}.{key}" if prefix else key
    close = difflib.get_close_matches(key, known, n=3)
    if close:
        named = " or ".join(repr((prefix + "." if prefix else "") + c) for c in close)
        raise ConfigError(f"{name}: unknown key (did you mean {named}?)")
    if len(known) <= 8:
        raise ConfigError(f"{name}: unknown key; allowed: {', '.join(sorted(known))}")
    raise ConfigError(f"{name}: unknown key; {len(known)} keys are allowed{' in ' + prefix if prefix else ''}, "
                      "listed with their meaning by `raybiphase validate --help`")


def _kind(tp: Any) -> str:
    """A type as an error names it: 'an int', or a Literal's values."""
    if typing.get_origin(tp) is Literal:
        return ", ".join(map(repr, typing.get_args(tp)))
    if typing.get_origin(tp) is tuple and Ellipsis not in typing.get_args(tp):
        return f"a list of {len(typing.get_args(tp))} values"
    name = getattr(tp, "__name__", str(tp))
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against type `tp` and convert YAML lists to tuples; ConfigError on a mismatch."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _coerce(value, option, key)
            except ConfigError as err:
                errors.append(err)
        if len(options) > 1 and not isinstance(value, (dict, list, tuple)):
            raise ConfigError(f"{key}: {value!r} is not allowed; allowed: {' or '.join(map(_kind, options))}")
        # a list is judged by the option that takes a list (int | tuple[int, int] given [1, 2, 3])
        containers = [e for o, e in zip(options, errors) if typing.get_origin(o) in (tuple, list)]
        raise (containers or errors)[0]
    if origin is Literal:
        check(value in args, key, f"{value!r} is not allowed; allowed: {', '.join(map(str, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        check(isinstance(value, dict), key, f"expected a mapping, got {type(value).__name__}")
        return _build(tp, value, key)
    if origin is tuple:
        check(isinstance(value, (list, tuple)), key, f"expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}.{i}") for i, v in enumerate(value))
        check(len(value) == len(args), key, f"expected {len(args)} values, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}.{i}") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        check(isinstance(value, dict), key, f"expected a mapping, got {type(value).__name__}")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        check(isinstance(value, list), key, f"expected a list, got {type(value).__name__}")
        return list(value)
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):  # YAML 1.1 reads 3e-3 as text
            value = float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        check(ok, key, f"expected a number, got {value!r}")
        return float(value)
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        check(ok, key, f"expected an integer, got {value!r}")
        return value
    if tp is bool:
        check(isinstance(value, bool), key, f"expected true or false, got {value!r}")
        return value
    if tp is str:
        check(isinstance(value, str), key, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp} at {key}")


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints, held = _hints(cls), _inline_of(cls)
    kwargs: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {name: {} for name, _ in held.values()}
    for key, value in data.items():
        if key not in hints:
            _unknown(prefix, str(key), list(hints))
        value = _coerce(value, hints[key], f"{prefix}.{key}" if prefix else key)
        if key in held:
            sections[held[key][0]][key] = value
        else:
            kwargs[key] = value
    try:
        kwargs.update({name: section_cls(**sections[name]) for name, section_cls in set(held.values())})
        return cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise ConfigError(f"{prefix or 'config'}: {err}") from None


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one mapping: PyYAML would silently keep the last."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.line, self.first, self.problem = key, line, first, str(self)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated within one mapping (merge keys `<<` may still be overridden)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKey(key, line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


MAX_VALUES = 100_000
"""The most values (leaves and containers) a spec may hold once its YAML aliases are expanded: far above any real
sweep's, far below what a crafted alias chain (a 'billion laughs') would expand to."""


class SpecTooLarge(yaml.YAMLError):
    """A document whose aliases expand past MAX_VALUES values, or that refers to itself."""


def _expanded_size(data: Any) -> int:
    """How many values `data` holds with every alias expanded, counted without expanding anything (each object
    once: PyYAML gives an alias the very object of its anchor); SpecTooLarge past MAX_VALUES or on a cycle."""
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_ids:
            raise SpecTooLarge("an alias refers to a value that contains it")
        open_ids.add(id(node))
        children = node.values() if isinstance(node, dict) else node
        total = 1 + sum(size(child) for child in children)
        open_ids.discard(id(node))
        if total > MAX_VALUES:
            raise SpecTooLarge(f"its aliases expand to more than {MAX_VALUES:,} values")
        sizes[id(node)] = total
        return total

    return size(data)


def _strict_load(text: str) -> Any:
    """A SafeLoader's plain data, refused (SpecTooLarge) before anything copies it when its aliases expand past
    MAX_VALUES values."""
    data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: plain data only, no tag builds an object
    _expanded_size(data)
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """'phases.mask_ratio=0.3' -> ('phases.mask_ratio', 0.3); the value is read as YAML, except that a value YAML
    cannot read starting with '@' is the `@NAME` run reference as written (`model.init_from=@610m-clm-42k`)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"{text}: an override is dotted.key=value")
    key = key.strip()
    try:
        return key, _strict_load(raw)
    except SpecTooLarge as err:
        raise ConfigError(f"{key}: refused: {err}") from None
    except yaml.YAMLError as err:
        if raw.strip().startswith("@"):
            return key, raw.strip()
        problem = " ".join(str(getattr(err, "problem", None) or err).split())
        raise ConfigError(f"{key}: {raw!r} is not valid YAML ({problem})") from None


def apply_overrides(root: type, data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys in a nested dict (a copy); the keys are checked against the schema first."""
    out = _deep_copy(data)
    for dotted, value in overrides.items():
        field_type(root, dotted)
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{dotted}: {part} is not a section in the file")
        node[leaf] = value
    return out


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def from_dict(cls: type[T], data: dict[str, Any] | None, overrides: dict[str, Any] | None = None) -> T:
    """Build `cls` from nested dicts plus dotted overrides; ConfigError on any bad input."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping at the top level, got {type(data).__name__}")
    return _build(cls, apply_overrides(cls, data, overrides or {}))


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = _strict_load(path.read_text())
    except DuplicateKey as err:
        raise ConfigError(f"{path}: line {err.line}: duplicate key {err.key!r} (first on line {err.first}); give "
                          "each key once") from None
    except SpecTooLarge as err:
        raise ConfigError(f"{path}: refused: {err}; write the values out") from None
    except RecursionError:
        raise ConfigError(f"{path}: refused: nested deeper than a spec ever is") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} is not valid YAML ({getattr(err, 'problem', err)})") from None
    if data is None:
        raise ConfigError(f"{path}: the file is empty (no settings)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected settings (a mapping of sections), got a {type(data).__name__}")
    return data


def load(cls: type[T], path: str | Path, overrides: list[str] | None = None) -> T:
    """Read a YAML file strictly as `cls` and apply `--set` style overrides ('a.b=c')."""
    return from_dict(cls, read_yaml(path), dict(parse_override(o) for o in overrides or []))


# --------------------------------------------------------------------------------------------- dotted names


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """A config -> {dotted key: value}: the names used by overrides, Tune, Parquet columns and W&B."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        key = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out.update(flatten(value, prefix if inline(f) else key))
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            out[key] = [dataclasses.asdict(v) for v in value]
        else:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict (YAML/JSON-ready) that `from_dict(type(cfg), ...)` reads back to an equal config."""

    def plain(value: Any) -> Any:  # dataclasses.asdict without its deep copies: a config's leaves are immutable
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out = {}
            for f in dataclasses.fields(value):
                part = plain(getattr(value, f.name))
                out.update(part if inline(f) else {f.name: part})
            return out
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(cfg)


def replace(cfg: T, overrides: dict[str, Any]) -> T:
    """A copy of `cfg` with dotted keys replaced (validated like a file)."""
    return from_dict(type(cfg), to_dict(cfg), overrides)
