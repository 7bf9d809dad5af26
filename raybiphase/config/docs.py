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


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


REQUIRED = "(required)"


def settings(cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted name, default, docstring) of every leaf setting of a config dataclass, sections in field order; a
    list of entries (phases.plan) is followed by its entry's settings, named with `N` for the entry's index."""
    out = []
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = _default(f)
        if dataclasses.is_dataclass(value):
            out += settings(type(value), f"{prefix}{f.name}.")
            continue
        out.append((f"{prefix}{f.name}", value, docs.get(f.name, "")))
        entry = typing.get_args(hints[f.name])[:1]
        if typing.get_origin(hints[f.name]) is tuple and entry and dataclasses.is_dataclass(entry[0]):
            entry_docs = field_docs(entry[0])
            out += [(f"{prefix}{f.name}.N.{e.name}", REQUIRED if _required(e) else _default(e), entry_docs.get(e.name, ""))
                    for e in dataclasses.fields(entry[0])]
    return out


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
