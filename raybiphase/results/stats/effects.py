"""Effects with 95% intervals (docs/statistics.md, "What is compared" and "The noise it counts").

Pure numpy and pandas. The unit is a *cell*: one arm (a pretraining recipe: every setting that shapes the weights
but `train.seed`) on one task, its score the mean over the arm's pretraining replicates of each run's mean test
score over fine-tuning seeds at the best LR. A finding at one model size is an *effect*: a linear combination of
cells (`Contrast`), for example the mean over tasks of the mean matched-pair difference, in which an arm reused by
several pairs appears once with the sum of its coefficients. Its variance (`estimate`) counts every source of
noise the study can see (raybiphase.results.stats.noise): the pretraining replicates' covariance where it is
measured, else the fine-tuning seeds alone, cells of one arm that share a trial added as fully correlated.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from raybiphase.results.aggregate import t_cdf, t_quantile
from raybiphase.results.stats.noise import Noise, Strata

ALPHA = 0.05
"""The familywise error rate of one finding's tests: two-sided, Holm-adjusted."""

Cell = tuple[str, str]
"""(arm, task)."""
Contrast = Mapping[Cell, float]
"""An effect as coefficients of cells: its estimate is the sum of coefficient x cell score."""


@dataclass(frozen=True)
class Effect:
    """An effect's estimate with its standard error, degrees of freedom and two-sided test against zero."""

    estimate: float
    se: float
    df: float
    source: str
    """"replicates" (pretraining and fine-tuning noise) or "fine-tuning seeds" (pretraining noise ignored)."""
    tasks: int
    cells: int
    widened: tuple[str, ...] = ()
    """Strata ("210m CLM") whose noise is the widened prior (`Strata`), not measured."""

    @property
    def half_width(self) -> float:
        return self.half_width_at(ALPHA)

    def half_width_at(self, level: float) -> float:
        """The half-width of the two-sided interval at error level `level` (0.05: the 95% interval)."""
        return t_quantile(1 - level / 2, self.df) * self.se

    @property
    def p_value(self) -> float:
        if self.se == 0:
            return 1.0 if self.estimate == 0 else 0.0
        return 2.0 * (1.0 - t_cdf(abs(self.estimate) / self.se, self.df))

    def text(self, unit: str = "pts", level: float = ALPHA) -> str:
        """The estimate and its interval at error level `level` (the 95% interval by default)."""
        half = self.half_width_at(level)
        return f"{self.estimate:+.2f} {unit} [{self.estimate - half:+.2f}, {self.estimate + half:+.2f}]"


def estimate(contrast: Contrast, cells: Mapping[Cell, Mapping[str, float]], noise: Noise | Strata | None, *,
             measure: str = "score",
             groups: Mapping[str, str] | None = None) -> Effect | None:
    """The contrast's estimate and standard error over `cells` ((arm, task) -> its values: the measure,
    `n_runs` and `<measure>_se`, `<measure>_df` for the fine-tuning seeds). With replicate noise covering its tasks:
    the larger of the replicates' variance and the fine-tuning seeds' (a few replicates can come out tighter than
    the seeds alone, never truly so) at the replicates' degrees of freedom; else the seeds'. None when a cell is
    missing or neither is available. `groups` maps a task to the trial it is scored from, for the
    fine-tuning bound."""
    contrast = {cell: c for cell, c in contrast.items() if c}
    if not contrast or any(cell not in cells for cell in contrast):
        return None
    value = sum(c * float(cells[cell][measure]) for cell, c in contrast.items())
    if not math.isfinite(value):
        return None
    tasks = len({task for _, task in contrast})
    by_arm: dict[str, dict[str, float]] = {}
    for (arm, task), c in contrast.items():
        by_arm.setdefault(arm, {})[task] = c
    seeds = _seed_variance(contrast, by_arm, cells, measure, groups or {})
    runs = _replicate_variance(by_arm, cells, noise)
    if runs is not None:  # never below the seeds' variance, at the replicates' (fewer) degrees of freedom
        variance = max(runs[0], seeds[0]) if seeds is not None else runs[0]
        return Effect(value, math.sqrt(variance), runs[1], "replicates", tasks, len(contrast), runs[2])
    if seeds is None:
        return None
    return Effect(value, math.sqrt(seeds[0]), seeds[1], "fine-tuning seeds", tasks, len(contrast))


def _replicate_variance(by_arm: dict[str, dict[str, float]], cells: Mapping[Cell, Mapping[str, float]],
                        noise: Noise | Strata | None) -> tuple[float, float, tuple[str, ...]] | None:
    """(variance, df, the widened strata) from the replicates' covariance: each arm's c' S c over its number of
    runs, S its stratum's where `noise` is `Strata`. Arms of one lineage (a cell's `lineage`: one recipe's
    checkpoints at several steps, from the same runs) enter as one arm with their coefficients summed, as if fully
    correlated: the bound, since a run better at one step tends to be better at the next."""
    if noise is None:
        return None
    merged: dict[str, tuple[dict[str, float], Mapping[str, float], float]] = {}  # lineage -> (c, a cell, runs)
    for arm, coefficients in by_arm.items():
        cell = cells[arm, next(iter(coefficients))]
        runs = min(float(cells[arm, t]["n_runs"]) for t in coefficients)
        summed, _, fewest = merged.get(str(cell.get("lineage", arm)), ({}, cell, runs))
        for task, c in coefficients.items():
            summed[task] = summed.get(task, 0.0) + c
        merged[str(cell.get("lineage", arm))] = (summed, cell, min(fewest, runs))
    total, dfs, widened = 0.0, [], set()
    for coefficients, cell, runs in merged.values():
        own = noise
        if isinstance(noise, Strata):
            own, prior = noise.of(cell.get("size", ""), cell.get("objective", ""))
            if prior:
                widened.add(f"{cell.get('size', '')} {cell.get('objective', '')}".strip())
        part = own.variance(coefficients)
        if part is None:
            return None
        total, dfs = total + part[0] / runs, [*dfs, part[1]]
    return total, min(dfs), tuple(sorted(widened))


def _seed_variance(contrast: Contrast, by_arm: dict[str, dict[str, float]],
                   cells: Mapping[Cell, Mapping[str, float]], measure: str,
                   groups: Mapping[str, str]) -> tuple[float, float] | None:
    """(variance, Welch-Satterthwaite df) from the cells' fine-tuning standard errors, the tasks an arm scores
    from one trial added as fully correlated; None when a cell has none."""
    terms, dfs = [], []
    for arm, coefficients in by_arm.items():
        shared: dict[str, list[Cell]] = {}
        for task in coefficients:
            shared.setdefault(groups.get(task, task), []).append((arm, task))
        for members in shared.values():
            se = [abs(contrast[m]) * float(cells[m][f"{measure}_se"]) for m in members]
            df = [float(cells[m][f"{measure}_df"]) for m in members]
            if not all(math.isfinite(x) for x in se) or not all(d >= 1 for d in df):
                return None
            terms.append(sum(se) ** 2)  # tasks scored from one trial: fully correlated, the bound
            dfs.append(min(df))
    variance = sum(terms)
    return variance, (variance**2 / sum(v**2 / d for v, d in zip(terms, dfs)) if variance > 0 else min(dfs))


def shared_trials(tasks: Iterable[str], families: Iterable[str]) -> dict[str, str]:
    """Task -> the trial it is scored from, for the fine-tuning bound: retrieval tasks may ride on one model (nq
    and mldr on MS MARCO's), so an arm's IR tasks are bounded as one trial; every other task has its own."""
    return {task: "IR" if family == "IR" else task for task, family in zip(tasks, families)}



def pair_contrast(pairs: pd.DataFrame | Mapping[str, Sequence[str]]) -> dict[Cell, float]:
    """The mean over tasks of the mean difference a - b over each task's matched pairs (columns task, arm_a,
    arm_b, of a frame or a mapping): each task weighs the same whatever its number of pairs, an arm in several
    pairs appears once."""
    by_task: dict[str, list[tuple[str, str]]] = {}
    for task, a, b in zip(pairs["task"], pairs["arm_a"], pairs["arm_b"]):
        by_task.setdefault(task, []).append((a, b))
    contrast: dict[Cell, float] = {}
    for task in sorted(by_task):
        weight = 1.0 / (len(by_task) * len(by_task[task]))
        for a, b in by_task[task]:
            contrast[a, task] = contrast.get((a, task), 0.0) + weight
            contrast[b, task] = contrast.get((b, task), 0.0) - weight
    return contrast


def slope_contrast(cells: pd.DataFrame, by: str, scale: float = 1.0) -> dict[Cell, float]:
    """Per (group, task) of `cells` (columns group, arm, task and the `by` variable), the least-squares slope of
    the score on `by` as coefficients (x `scale`), averaged over the (group, task) pairs with two values or more."""
    grouped: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for group, task, arm, value in zip(cells["group"], cells["task"], cells["arm"], cells[by]):
        grouped.setdefault((group, task), []).append((arm, float(value)))
    slopes = []
    for (_, task), at in sorted(grouped.items()):
        x = np.array([value for _, value in at])
        if len(np.unique(x)) < 2:
            continue
        w = (x - x.mean()) / ((x - x.mean()) ** 2).sum() * scale
        slopes.append({(arm, task): weight for (arm, _), weight in zip(at, w)})
    contrast: dict[Cell, float] = {}
    for slope in slopes:
        for cell, weight in slope.items():
            contrast[cell] = contrast.get(cell, 0.0) + weight / len(slopes)
    return contrast


def difference(a: Contrast, b: Contrast) -> dict[Cell, float]:
    """The contrast a - b."""
    out = dict(a)
    for cell, c in b.items():
        out[cell] = out.get(cell, 0.0) - c
    return out
