"""docs/example-report/: the report as `raybiphase report` draws it from the recorded quickstart sweep's rows
(tests/fixtures/quickstart_results), to see before running anything. `raybiphase docs` writes it; its text files
(report.md, each table's CSV and LaTeX) are pages `--check` compares; its figures (PNG, SVG, PDF) are written again
only when report.md changes, since their bytes vary with the machine and the date drawn. report.html, the same
report as one file, is left out (a sweep's own report has it).
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

from raybiphase import storage
from raybiphase.results.report import write_report

FIXTURE = Path("tests") / "fixtures" / "quickstart_results"
TARGET = "docs/example-report"
TEXT = (".md", ".csv", ".tex")
FIGURES = (".png", ".svg", ".pdf")
HEADER = {"spec": "sweeps/quickstart.yaml",
          "code": "the recorded quickstart rows in tests/fixtures/quickstart_results",
          "hardware": "not recorded with these rows"}
"""The report's header (a sweep records its own in sweep.json; the fixture holds its rows only)."""


@functools.cache
def drawn(root: Path) -> Path:
    """The report folder drawn from ROOT's fixture in a temporary folder (removed when the process ends)."""
    tmp = Path(tempfile.mkdtemp(prefix="raybiphase-example-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    results = tmp / "quickstart"
    shutil.copytree(root / FIXTURE, results)
    (results / storage.RUN_INFO).write_text(json.dumps(HEADER))
    write_report(results)
    return results / storage.REPORT_DIR


def text_pages(root: Path) -> dict[str, str]:
    """{docs/example-report/<file>: its text} of the report's Markdown and tables."""
    return {f"{TARGET}/{path.name}": path.read_text() for path in sorted(drawn(root).iterdir())
            if path.suffix in TEXT}


def write_figures(root: Path, *, changed: bool) -> list[str]:
    """Copy the figures into ROOT/docs/example-report when `changed` (its report.md was rewritten)
    or one is missing; returns the paths written."""
    written = []
    for path in sorted(drawn(root).iterdir()):
        target = root / TARGET / path.name
        if path.suffix in FIGURES and (changed or not target.exists()):
            shutil.copyfile(path, target)
            written.append(f"{TARGET}/{path.name}")
    return written
