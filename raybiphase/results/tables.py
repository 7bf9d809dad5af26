"""What every section of the report is made of: the Section record, and score cells and Markdown tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from raybiphase.results.aggregate import clipped

if TYPE_CHECKING:  # score cells are read without matplotlib (model cards)
    from matplotlib.figure import Figure


@dataclass
class Section:
    """One figure of the report: its file stem, heading, figure (None when absent), caption or reason, table."""

    name: str
    title: str
    figure: Figure | None
    note: str
    table: str = ""


POINTS = (0.0, 100.0)
"""The metrics' range in points (x 100), what a printed or drawn interval is clipped to."""


def mean_ci(mean: float, ci: float, n_seeds: int) -> str:
    """A score cell in points: 'mean ± ci'; 'mean [low, high]' when the interval passes the metric's range and is
    clipped to it (raybiphase.results.aggregate.clipped); the mean and the seed count when there is no interval."""
    if pd.notna(ci):
        low, high = clipped(mean, ci, POINTS)
        inside = (low, high) == (mean - ci, mean + ci)
        return f"{mean:.2f} ± {ci:.2f}" if inside else f"{mean:.2f} [{low:.2f}, {high:.2f}]"
    return f"{mean:.2f} ({int(n_seeds)} seed{'' if n_seeds == 1 else 's'}, no interval)"


def error_bars(scores: pd.Series, cis: pd.Series) -> list[list[float]]:
    """Matplotlib's `yerr` for scores in points: the lengths below and above each score, the interval clipped to the
    metric's range as `mean_ci` prints it; no bar where there is no interval."""
    ends = [clipped(m, c, POINTS) if pd.notna(c) else (m, m) for m, c in zip(scores, cis)]
    return [[m - low for m, (low, _) in zip(scores, ends)], [high - m for m, (_, high) in zip(scores, ends)]]


class MarkdownTable(str):
    """A table's Markdown that still carries the rows it was drawn from (`frame`), so the report can also write
    them as CSV and LaTeX."""

    frame: pd.DataFrame


def _cell(value) -> str:
    return "" if pd.isna(value) else (f"{value:g}" if isinstance(value, float) else str(value))


def markdown(frame: pd.DataFrame) -> MarkdownTable:
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    lines = [header, "|" + "---|" * len(frame.columns)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    table = MarkdownTable("\n".join(lines))
    table.frame = frame
    return table


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "→": r"$\to$",
          "·": r"$\cdot$", "**": ""}


def latex(frame: pd.DataFrame, caption: str = "") -> str:
    """The rows as a LaTeX table (booktabs rules: `\\usepackage{booktabs}`), every cell as the Markdown shows it,
    LaTeX's special characters escaped."""
    def escape(text: str) -> str:
        for plain, escaped in _LATEX.items():
            text = text.replace(plain, escaped)
        return text

    lines = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{" + "l" * len(frame.columns) + "}", r"\toprule",
             " & ".join(escape(str(c)) for c in frame.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(escape(_cell(v)) for v in row) + r" \\" for row in frame.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        lines.append(r"\caption{" + escape(caption) + "}")
    return "\n".join([*lines, r"\end{table}"]) + "\n"


def paper_files(section: Section, out: Path, svg: str = "") -> str:
    """What a paper takes from a section, written beside the report: its figure as SVG and PDF (vector), its table
    as CSV and as a LaTeX table; the Markdown line that links them ("" when the section has neither). `svg`: the
    figure's SVG document (a section with a figure needs it), drawn once by the report for this file and its HTML
    page (`html.svg`)."""
    links = []
    if section.figure is not None:
        (out / f"{section.name}.svg").write_text(svg)
        section.figure.savefig(out / f"{section.name}.pdf")
        links += [f"[{kind.upper()}]({section.name}.{kind})" for kind in ("svg", "pdf")]
    frame = getattr(section.table, "frame", None)
    if frame is not None:
        frame.to_csv(out / f"{section.name}.csv", index=False)
        (out / f"{section.name}.tex").write_text(latex(frame, caption=section.title))
        links += [f"[CSV]({section.name}.csv)", f"[LaTeX]({section.name}.tex)"]
    return f"Files: {' · '.join(links)}" if links else ""
