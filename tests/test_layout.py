"""The package's shape stays readable: layers that import only the layers before them (docs/architecture.md), no import
cycles, few lazy imports, small files that say what they do."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "raybiphase"
MAX_LINES = 450
MAX_FUNCTION_LINES = 60  # body lines, the docstring not counted: the orchestrators read as a list of named steps
LAYERS = (
    ("errors",),  # the two error kinds every layer raises
    ("outages",),  # how long an unreachable bucket is waited out, and what is said meanwhile
    ("failures",),  # the one failure policy: what a try is, when a job, the sweep or a command gives up
    ("storage",),  # every path, URI and file name
    ("transfer",),  # copies between a bucket and this node's disk, never outside the copy
    ("locks",),  # a local file created only if absent, a lock beside a local file
    ("config",),  # the run config and the sweep spec (with the size table they validate against)
    ("naming",),  # run names and the phase tag rule, from a RunConfig
    ("phases",),  # phases and the WSD learning rate, step by step and piece by piece (pure: planning needs no torch)
    ("checkpoint_meta",),  # a checkpoint's typed meta, read and checked without torch (the tensors: pretrain)
    ("ray_internals",),  # the only reach past Ray's public API, checked when the driver starts Ray
    ("raycluster", "spot"),  # starting or joining Ray, counting its CPUs; a spot notice turned into a drain
    ("data",),  # corpora, tokenizer, shards, the stream and its masking
    ("telemetry",),  # progress, clock, history, W&B, provenance: what workers and drivers both report with
    ("results",),  # rows, tables, statistics, verdicts, the report
    ("optim",),  # AdamW and its weight-decay rule, the one optimizer both stages train with
    ("pretrain", "finetune"),  # the two training stages, side by side
    ("planning",),  # what a sweep will run and what it costs, before it runs (pure: no Ray, no torch)
    ("sweep",),  # the only package that drives pretraining, fine-tuning and results together
    ("commands",),  # argparse, then one library call (`python -m` entry points count as commands)
)
MAX_LAZY = 6  # function-level project imports allowed outside the commands, each with "# lazy:" and its reason


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, unit) of a dotted module name; `python -m` entry points (`__main__`) count as commands."""
    if module in ("raybiphase", "raybiphase.__version__"):
        return -1, "raybiphase"  # the package's own __init__: its version string, imported by anyone
    parts = module.split(".")[1:]
    unit = "commands" if parts[-1] == "__main__" else parts[0]
    for index, units in enumerate(LAYERS):
        if unit in units:
            return index, unit
    raise AssertionError(f"{module}: not in any layer of tests/test_layers.py; place it in LAYERS")




def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _import_lines(path: Path) -> list[tuple[str, int, bool, str]]:
    """(imported name, line, at function level, source line) of every raybiphase import in a file; `from raybiphase.x
    import y` names `raybiphase.x.y`, which may be a module or a name in one."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "raybiphase":
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.split(".")[0] == "raybiphase"]
        else:
            continue
        found += [(name, node.lineno, node.col_offset > 0, lines[node.lineno - 1]) for name in names]
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module a dotted import name lands in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `path` imports anywhere (function-level imports count)."""
    return {_resolve(name, modules) for name, *_ in _import_lines(path)} - {None}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_modules():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    # a module importing its own package's __init__ is not a cycle the reader has to untangle
    graph = {name: {dep for dep in deps if not name.startswith(dep + ".")} for name, deps in graph.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", sorted(_modules()))
def test_modules_stay_small_and_say_what_they_do(name):
    path = _modules()[name]
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)} has {lines} lines"
    assert ast.get_docstring(ast.parse(path.read_text())), f"{name} has no docstring"


def layer_violations(imports) -> list[str]:
    bad = []
    for module, target, line, _, _ in imports:
        (own, unit), (theirs, their_unit) = layer_of(module), layer_of(target)
        if theirs > own or (theirs == own and unit != their_unit):
            bad.append(f"{module}:{line} imports {target} ({LAYERS[theirs]} may not be imported from {LAYERS[own]})")
    return bad


def _all_imports() -> list[tuple[str, str, int, bool, str]]:
    """(module, imported module, line, at function level, source line) over the package."""
    modules = _modules()
    return [(name, _resolve(target, modules), line, inner, text)
            for name, path in modules.items() for target, line, inner, text in _import_lines(path)]


def test_every_module_imports_only_earlier_layers() -> None:
    assert layer_violations(_all_imports()) == []


def test_lazy_project_imports_are_few_and_say_why() -> None:
    lazy = [(m, line, text.strip()) for m, _, line, inner, text in _all_imports()
            if inner and layer_of(m)[1] != "commands"]
    unexplained = [f"{m}:{line} {text}" for m, line, text in lazy if "# lazy:" not in text]
    assert unexplained == [], "a function-level import outside the commands needs '# lazy: <reason>' on its line"
    assert len({(m, line) for m, line, _ in lazy}) <= MAX_LAZY, lazy


@pytest.mark.parametrize("module, target, expected", [
    ("raybiphase.pretrain.loop", "raybiphase.planning.plan", "may not be imported"),  # a later layer
    ("raybiphase.pretrain.loop", "raybiphase.finetune.trial", "may not be imported"),  # a sibling stage
    ("raybiphase.storage", "raybiphase.errors", None),  # an earlier layer
    ("raybiphase.sweep.__main__", "raybiphase.commands.sweep", None),  # an entry point is a command
])
def test_the_rule_itself(module, target, expected) -> None:
    found = layer_violations([(module, target, 1, False, "")])
    assert (found[0] if found else None) == expected or (expected and expected in found[0])


def _long_functions(source: str) -> list[str]:
    long = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            lines = body[-1].end_lineno - body[0].lineno + 1 if body else 0
            if lines > MAX_FUNCTION_LINES:
                long.append(f"{node.name} ({lines} lines)")
    return long


def test_functions_stay_short() -> None:
    long = {name: found for name, path in _modules().items() if (found := _long_functions(path.read_text()))}
    assert long == {}


def test_the_length_rule_counts_body_lines() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert _long_functions(f'def f():\n    """Doc."""\n{body}\n') == []  # 60 body lines and a docstring
    assert _long_functions(f"def f():\n{body}\n    return 1\n") == [f"f ({MAX_FUNCTION_LINES + 1} lines)"]


def test_the_package_passes_its_linter() -> None:
    """`ruff check raybiphase` with the project's configuration (pyproject.toml) finds nothing: the style CI holds."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    done = subprocess.run([ruff, "check", "raybiphase"], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_the_package_says_what_pip_and_an_index_show() -> None:
    """PEP 621/639 metadata a user or an index reads: the license as an SPDX expression with its file, authors,
    where the study and the model come from, classifiers that say it is typed, and the py.typed marker shipped."""
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and (PACKAGE.parent / project["license-files"][0]).is_file()
    assert project["authors"] and project["urls"]["Paper"] == "https://arxiv.org/abs/2507.00994"
    assert "Typing :: Typed" in project["classifiers"] and (PACKAGE / "py.typed").is_file()
    assert project["scripts"]["raybiphase"].startswith("raybiphase")


def test_no_two_modules_share_a_name_outside_the_commands() -> None:
    """A module's name says which one it is: no two modules of the library share one (the commands, one module per
    `raybiphase` subcommand, are named for their subcommand and may share a library module's name)."""
    seen: dict[str, list[str]] = {}
    for name, path in _modules().items():
        if ".commands." not in name and path.stem not in ("__init__", "__main__"):
            seen.setdefault(path.stem, []).append(name)
    assert {stem: names for stem, names in seen.items() if len(names) > 1} == {}
