"""Every setting by its dotted name, with its default and its docstring: what `--help` of a command that takes a
config prints (raybiphase.commands.config_parser).

The docstrings are the string literals written under each field in raybiphase.config (read from the source with
`ast`, so they stay the one place a setting is documented).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import typing
from typing import Any


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: the docstring under it} of a dataclass, its bases' included."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def sections(cls: type) -> dict[str, str]:
    """{section name as a file writes it: the docstring under it}, an INLINE section's own sections in its place
    (a sweep spec: model, data, ..., resources, finetune, sweep)."""
    docs, hints, out = field_docs(cls), typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        out.update(sections(hints[f.name]) if f.metadata.get("inline") else {f.name: docs.get(f.name, "")})
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


REQUIRED = "(required)"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One leaf setting as `--help` and docs/settings.md show it."""

    name: str
    """Dotted name (`phases.mask_ratio`; `phases.plan.N.steps` for a list entry's setting)."""
    type: str
    """The declared type as written in the dataclass (`int | None`, `tuple[str, ...]`)."""
    default: Any
    """The default, or REQUIRED for a list entry's setting that has none."""
    doc: str
    """The docstring under the field, on one line."""
    weights: bool
    """False when it or a section above it carries `metadata=NOT_WEIGHTS`: it never changes a run's weights."""


def type_name(hint: Any) -> str:
    """A type hint as the source writes it: `int`, `tuple[int, ...]`, `str | None`, `Literal['clm', 'mlm']`."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return "None" if hint is type(None) else hint.__name__
    return re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", str(hint)).replace("NoneType", "None")  # Phase, not a.b.Phase


def setting_list(cls: type, prefix: str = "", weights: bool = True) -> list[Setting]:
    """Every leaf setting of a config dataclass, sections in field order; a list of entries (phases.plan) is
    followed by its entry's settings, named with `N` for the entry's index."""
    out = []
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value, shaping = _default(f), weights and f.metadata.get("weights", True)
        if dataclasses.is_dataclass(value):  # an INLINE section's settings are named at this level
            out += setting_list(type(value), prefix if f.metadata.get("inline") else f"{prefix}{f.name}.", shaping)
            continue
        out.append(Setting(f"{prefix}{f.name}", type_name(hints[f.name]), value, docs.get(f.name, ""), shaping))
        entry = typing.get_args(hints[f.name])[:1]
        if typing.get_origin(hints[f.name]) is tuple and entry and dataclasses.is_dataclass(entry[0]):
            entry_docs, entry_hints = field_docs(entry[0]), typing.get_type_hints(entry[0])
            out += [Setting(f"{prefix}{f.name}.N.{e.name}", type_name(entry_hints[e.name]),
                            REQUIRED if _required(e) else _default(e), entry_docs.get(e.name, ""),
                            shaping and e.metadata.get("weights", True))
                    for e in dataclasses.fields(entry[0])]
    return out


def settings(cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted name, default, docstring) of every leaf setting (setting_list)."""
    return [(s.name, s.default, s.doc) for s in setting_list(cls, prefix)]


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def settings_help(cls: type, width: int = 100) -> str:
    """The settings as help text: `name = default` on one line, the docstring indented below."""
    lines = ["settings (set in the YAML file or with --set NAME=VALUE):"]
    for name, default, doc in settings(cls):
        lines.append(f"  {name} = {default}" if default is REQUIRED else f"  {name} = {default!r}")
        if doc:
            lines += textwrap.wrap(doc, width, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)
