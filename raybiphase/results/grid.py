"""The report's grid of per-task panels: one line per series of our arms with its 95% CI, the paper's dashed, and
each public encoder fine-tuned on the same protocol (finetune.baselines, rows with source `hub`) a dotted reference
line on its tasks' panels, labelled with its id.
"""

from __future__ import annotations

import math

import matplotlib
import pandas as pd
from matplotlib.figure import Figure  # figures without pyplot: no global state, PNGs through Agg

from raybiphase.results.rows import HUB
from raybiphase.results.tables import error_bars

OBJECTIVE_COLORS = {"CLM": "tab:blue", "MLM": "tab:orange", "CLM→MLM": "tab:green", "continued": "tab:purple"}
REFERENCE_COLORS = ("black", "tab:gray", "tab:brown", "tab:olive", "tab:cyan", "tab:pink")
"""A public encoder's reference line, by its place among the figure's encoders (none of our objectives' colours)."""


def col(frame: pd.DataFrame, name: str) -> pd.Series:
    """A column of `frame`, or NaN throughout when it has none."""
    return frame[name] if name in frame else pd.Series(math.nan, index=frame.index, dtype=object)


def palette(n: int):
    """Colours for `n` series, cycling past a colormap's length."""
    return iter(matplotlib.colormaps["tab10" if n <= 10 else "tab20"].colors * (1 + n // 10))


def hub_references(s: pd.DataFrame) -> pd.DataFrame:
    """The public encoders' points a figure draws as reference lines: each one's final score per task (source
    `hub`), from an enriched summary."""
    hub = s[(col(s, "source") == HUB) & s["final"] & s["score"].notna()]
    return hub[["task", "run", "score"]].sort_values(["run", "task"])


def _reference_lines(ax, task: str, references: pd.DataFrame | None, legend: dict) -> None:
    """Each public encoder's score on `task` as a dotted horizontal line on `ax`, in the figure's legend."""
    if references is None:
        return
    runs = sorted(references["run"].unique())
    for row in references[references["task"] == task].itertuples(index=False):
        color = REFERENCE_COLORS[runs.index(row.run) % len(REFERENCE_COLORS)]
        legend[f"hub {row.run}"] = ax.axhline(row.score, color=color, linestyle=":", linewidth=1.5,
                                               label=f"hub {row.run}")


def task_grid(points: pd.DataFrame, x: str, series: str, title: str, xlabel: str, *, logx: bool = False,
              color_by: str | None = None, references: pd.DataFrame | None = None) -> Figure:
    """One panel per task (family in its title) and model size, one line per series with 95% CI error bars; paper
    dashed. A line never joins two sizes: each size has its own panel (its size in the title) when there are several.

    Colours: by the objective when color_by="objective", else one per series, the same in every panel. One legend
    for the whole figure, outside the panels on the right, so that no line hides under it. `references`
    (`hub_references`): a public encoder's score on a panel's task, a dotted horizontal line labelled "hub <id>",
    beside our arms and never one of them.
    """
    points = points.assign(size=col(points, "size").fillna(""))
    tasks = points[["family", "task", "size"]].drop_duplicates().sort_values(["family", "task", "size"])
    several = points["size"].nunique() > 1
    cols = min(len(tasks), 3)
    rows = math.ceil(len(tasks) / cols)
    fig = Figure(figsize=(4.6 * cols + 3.2, 3.7 * rows + 0.5), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    categories = sorted(points[x].unique()) if points[x].dtype == object or pd.api.types.is_string_dtype(
        points[x]) else None  # categorical x: markers side by side, no connecting line
    colors = palette(points[series].nunique())
    series_colors: dict[str, object] = {}  # a series keeps its colour across panels
    legend: dict[str, object] = {}
    for ax, (family, task, size) in zip(axes.flat, tasks.itertuples(index=False)):
        panel = points[(points["task"] == task) & (points["size"] == size)]
        for label, line in panel.groupby(series, sort=True):
            label = str(label)
            if label not in series_colors:
                series_colors[label] = OBJECTIVE_COLORS.get(line[color_by].iloc[0]) if color_by else next(colors)
            line = line.groupby(x, as_index=False).agg(score=("score", "mean"), ci=("ci", "mean")).sort_values(x)
            style = "none" if categories else "--" if label.startswith("paper") else "-"
            xs = [categories.index(v) for v in line[x]] if categories else line[x]
            legend[label] = ax.errorbar(xs, line["score"], yerr=error_bars(line["score"], line["ci"]), capsize=3,
                                        marker="o", markersize=5, linestyle=style, label=label,
                                        color=series_colors[label])
        _reference_lines(ax, task, references, legend)
        ax.set_title(f"{family} · {task}" + (f" · {size}" if several else ""))
        ax.set_xlabel(xlabel)
        if categories:
            ax.set_xticks(range(len(categories)), categories)
            ax.set_xlim(-0.5, len(categories) - 0.5)
        ax.set_ylabel(f"test {panel['metric'].iloc[0]} (%)")
        if logx:
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    fig.legend(list(legend.values()), list(legend), loc="outside right center", fontsize=8)
    dotted = "; dotted: public encoders" if references is not None and len(references) else ""
    fig.suptitle(f"{title} (error bars: 95% CI over seeds{dotted})")
    return fig
