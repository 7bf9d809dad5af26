"""The report's section on the next model size: every arm's score there predicted from the sizes the sweep has
(raybiphase.results.stats.prediction: a line in ln parameters per task with arm offsets, 95% prediction intervals), each
finding's chance there, and, where the sweep has three sizes or more, its largest size predicted from the smaller
ones only beside what it showed, with the share of the intervals that covered it: how far to trust the forecast.
"""

from __future__ import annotations

import math

import pandas as pd

from raybiphase.config.sizes import SIZES
from raybiphase.errors import UserError
from raybiphase.results.stats.prediction import observations, parameters, predict, sized_rows
from raybiphase.results.tables import Section, markdown

TITLE = "Beyond the paper: the next model size, predicted from the smaller ones"


def next_size(size: str) -> str | None:
    """The project's smallest model size with more parameters than `size`; None above the largest."""
    larger = [z for z in SIZES if parameters(z) > parameters(size)]
    return min(larger, key=parameters) if larger else None


def next_size_section(s: pd.DataFrame) -> Section | None:
    """The forecast at the size after the sweep's largest and the check of its largest against the smaller
    ones; None when no source (ours, the paper's) has two sizes."""
    rows = sized_rows(s)
    if not len(rows) or rows.groupby("source")["size"].nunique().max() < 2:
        return None
    sizes = sorted(rows["size"].unique(), key=parameters)
    largest, parts, notes = sizes[-1], [], []
    if len(sizes) >= 3:
        notes.append(_check(s, largest, parts))
    target = next_size(largest)
    if target is not None:
        try:
            forecast = predict(s, target)
        except UserError as err:
            notes.append(f"Not predicted at {target}: {err}.")
        else:
            notes.append(f"Predicted at {target} from {', '.join(forecast.based_on)}. {forecast.regime}")
            parts += [f"**Predicted at {target}** (test metric x 100, 95% interval of one run's score)",
                      markdown(forecast.table())]
            chances = forecast.chances_table()
            if len(chances):
                parts += [f"**The findings at {target}**: the chance each effect lies in the paper's direction "
                          "(its predictive distribution: the fit and model error)", markdown(chances)]
    note = (" ".join(notes) + " Per source and task, a least-squares line of the score in ln(non-embedding "
            "parameters) with a slope shared by the arms and an offset per arm; the method and its simulation: "
            "docs/statistics.md.")
    return Section("next_size", TITLE, None, note, "\n\n".join(parts))


def _check(s: pd.DataFrame, largest: str, parts: list[str]) -> str:
    """The largest size predicted from the smaller ones only, beside what it showed (a table added to `parts`);
    the sentence that tallies the intervals that covered it."""
    try:
        forecast = predict(s, largest)
    except UserError as err:
        return f"{largest} not predicted from the smaller sizes: {err}."
    observed, _ = observations(s, largest, at=True)
    seen = observed[["arm", "task", "score"]].rename(columns={"score": "observed"})
    both = forecast.cells.merge(seen, on=["arm", "task"])
    if both.empty:
        return f"No arm of {largest} was seen at a smaller size: nothing to check the predictions against."
    scored = both[both["low"].map(math.isfinite) & both["observed"].notna()]
    covered = (scored["low"] <= scored["observed"]) & (scored["observed"] <= scored["high"])
    table = pd.DataFrame({
        "run": both["run"], "task": both["task"],
        "predicted (%), 95% interval": [f"{m:.2f} [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else f"{m:.2f}"
                                        for m, lo, hi in zip(both["predicted"], both["low"], both["high"])],
        "observed (%)": both["observed"].round(2),
        "covered": covered.map({True: "yes", False: "no"}).reindex(both.index, fill_value="no interval")})
    parts += [f"**{largest} predicted from {', '.join(forecast.based_on)} only, beside what it showed**",
              markdown(table.sort_values(["run", "task"], kind="stable"))]
    share = f"{int(covered.sum())} of {len(scored)} ({covered.mean():.0%})" if len(scored) else "none"
    return (f"Predicted from the smaller sizes only, {largest}'s scores fell inside their 95% intervals in {share} "
            "of the cells with one.")
