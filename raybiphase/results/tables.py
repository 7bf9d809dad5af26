"""What every section of the report is made of: the Section record, and score cells and Markdown tables."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from matplotlib.figure import Figure


@dataclass
class Section:
    """One figure of the report: its file stem, heading, figure (None when absent), caption or reason, table."""

    name: str
    title: str
    figure: Figure | None
    note: str
    table: str = ""


def mean_ci(mean: float, ci: float, n_seeds: int) -> str:
    if pd.notna(ci):
        return f"{mean:.2f} ± {ci:.2f}"
    return f"{mean:.2f} ({int(n_seeds)} seed{'' if n_seeds == 1 else 's'}, no interval)"


def markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    lines = [header, "|" + "---|" * len(frame.columns)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join("" if pd.isna(v) else (f"{v:g}" if isinstance(v, float) else str(v))
                                       for v in row) + " |")
    return "\n".join(lines)
