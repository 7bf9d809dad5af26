"""Effects with 95% intervals and the decision rule behind every finding's verdict (docs/statistics.md).

Pure numpy and pandas. The unit is a *cell*: one arm (a pretraining recipe: every setting that shapes the weights
but `train.seed`) on one task, its score the mean over the arm's pretraining replicates of each run's mean test
score over fine-tuning seeds at the best LR. A finding at one model size is an *effect*: a linear combination of
cells (`Contrast`), for example the mean over tasks of the mean matched-pair difference, in which an arm reused by
several pairs appears once with the sum of its coefficients. Its variance counts every source of noise the
study can see:

- **Pretraining replicates** (`replicate_noise`): where some arms were pretrained several times, the residuals of
  each run's scores around its arm's mean give a task-by-task covariance matrix S (pooled over the replicated arms,
  with their degrees of freedom). A run's scores hold its pretraining noise and its fine-tuning noise, so S holds
  both, with every correlation between tasks: a run that is better on one task and better on another, and tasks
  scored from one trained model (nq and mldr ride on MS MARCO's trial). An arm with n runs adds c' S c / n, whether
  it was replicated or not. S is measured per stratum, a (model size, objective) pair (`Strata`): an arm takes its
  stratum's S; one whose stratum has no replicated arm is never taken as equal to another, it gets the noisiest
  measured stratum's S times the square of sweep.unmeasured_sd (a stated prior, 2 by default), and its effect
  names the widened strata.
- **Fine-tuning seeds only** (no replicates): each cell's standard error from its seeds, cells of one arm that
  share a trial added as fully correlated (the bound), Welch-Satterthwaite's degrees of freedom. Such an interval
  ignores pretraining noise, and the report says so.

A test is two-sided at 5%, its claimed direction fixed in advance; the tests of one finding (one per size, or per
trend) are adjusted together by Holm's step-down procedure, so a finding claims an effect that is not there in at
most 5% of studies when the model's assumptions hold. tests/results/test_calibration.py checks the rate by
simulation: many studies with a known truth.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from raybiphase.config.sweep import UNMEASURED_SD
from raybiphase.results.aggregate import t_cdf, t_quantile

ALPHA = 0.05
"""The familywise error rate of one finding's tests: two-sided, Holm-adjusted."""
HELD, NOT_HELD, MIXED, UNRESOLVED = "held", "not held", "mixed", "not resolved"

NO_REPLICATES = f"{UNRESOLVED} (no replicated arm: pretraining noise not measured)"
"""The decision of a test whose interval counts fine-tuning seeds only. Such intervals ignore the spread between
pretraining runs, which at the paper's scale is larger: simulated with no true effect and 5 seeds, some finding
"held" in nearly every study (tests/results/test_calibration.py). They are shown, never decided on."""

Cell = tuple[str, str]
"""(arm, task)."""
Contrast = Mapping[Cell, float]
"""An effect as coefficients of cells: its estimate is the sum of coefficient x cell score."""


@dataclass(frozen=True)
class Noise:
    """How much one pretraining run's scores move when its arm is pretrained (and fine-tuned) again: the pooled
    task-by-task covariance of replicate residuals, in the measure's units (points)."""

    covariance: pd.DataFrame
    """Task x task: sum of products of residuals over the runs that have both tasks, over their degrees of freedom."""
    df: pd.DataFrame
    """Task x task degrees of freedom behind each entry (runs minus one, summed over replicated arms)."""
    arms: int
    """Replicated arms the estimate pools."""

    def variance(self, coefficients: Mapping[str, float]) -> tuple[float, float] | None:
        """(c' S c, its degrees of freedom: the fewest behind any task used) of one run; None when a task has no
        replicate."""
        tasks = [t for t, c in coefficients.items() if c]
        index = self._index
        if not tasks or any(t not in index for t in tasks):
            return None
        c, at = np.array([coefficients[t] for t in tasks]), [index[t] for t in tasks]
        s = self._matrices[0][np.ix_(at, at)]
        return float(c @ s @ c), float(self._matrices[1][at, at].min())

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {task: i for i, task in enumerate(self.covariance.index)}

    @functools.cached_property
    def _matrices(self) -> tuple[np.ndarray, np.ndarray]:
        return self.covariance.to_numpy(), self.df.loc[self.covariance.index, self.covariance.columns].to_numpy()


def replicate_noise(runs: pd.DataFrame, measure: str = "score") -> Noise | None:
    """The pooled replicate covariance of `measure` from one row per (arm, run, task) (columns arm, replicate,
    task and the measure); None when no arm has two runs of a task."""
    runs = runs[runs[measure].notna()]
    if runs.empty:
        return None
    table = runs.pivot_table(index=["arm", "replicate"], columns="task", values=measure, aggfunc="mean")
    counts = table.groupby(level="arm").count()
    replicated = counts.index[(counts >= 2).any(axis=1)]
    if not len(replicated):
        return None
    table = table[table.index.get_level_values("arm").isin(replicated)]
    residual = table - table.groupby(level="arm").transform("mean")
    values, valid = residual.fillna(0.0).to_numpy(), residual.notna().to_numpy(dtype=float)
    arms = table.index.get_level_values("arm")
    dof = sum(np.clip(valid[arms == arm].T @ valid[arms == arm] - 1, 0, None) for arm in replicated)
    sums = values.T @ values
    tasks = [t for i, t in enumerate(table.columns) if dof[i, i] > 0]
    keep = [i for i, t in enumerate(table.columns) if dof[i, i] > 0]
    cov = np.divide(sums, dof, out=np.zeros_like(sums), where=dof > 0)[np.ix_(keep, keep)]
    return Noise(pd.DataFrame(cov, index=tasks, columns=tasks),
                 pd.DataFrame(dof[np.ix_(keep, keep)], index=tasks, columns=tasks), len(replicated))




@dataclass(frozen=True)
class Strata:
    """Replicate noise per stratum, a (model size, objective) pair: each measured on its own replicated arms, never
    borrowed as if equal. An arm whose stratum has no replicated arm takes the noisiest measured stratum's
    covariance (by the mean of its diagonal) times `inflation` squared (sweep.unmeasured_sd, by default
    UNMEASURED_SD), at that stratum's degrees of freedom."""

    measured: Mapping[tuple[str, str], Noise]
    """(size, objective) -> the noise its replicated arms measure."""
    inflation: float = UNMEASURED_SD
    """The SD factor of an unmeasured stratum over the noisiest measured one (at least 1)."""

    @property
    def noisiest(self) -> tuple[str, str]:
        return max(self.measured, key=lambda k: float(np.mean(np.diag(self.measured[k].covariance.to_numpy()))))

    def of(self, size: object, objective: object) -> tuple[Noise, bool]:
        """The noise an arm of (size, objective) is judged with, and whether it is the widened prior."""
        key = (str(size), str(objective))
        if key in self.measured:
            return self.measured[key], False
        worst = self.measured[self.noisiest]
        return Noise(worst.covariance * self.inflation**2, worst.df, worst.arms), True

    def sd(self, key: tuple[str, str]) -> float:
        """The stratum's pretraining-run SD (points): the root of its covariance's mean diagonal."""
        return math.sqrt(float(np.mean(np.diag(self.measured[key].covariance.to_numpy()))))


def strata_noise(runs: pd.DataFrame, measure: str = "score", inflation: float = UNMEASURED_SD) -> Strata | None:
    """`replicate_noise` per (size, objective) of `runs` (also columns size and objective), an unmeasured stratum
    widened by `inflation` (`Strata`); None when no stratum has a replicated arm."""
    measured = {}
    for key, group in runs.groupby([runs["size"].astype(str), runs["objective"].astype(str)], sort=True):
        noise = replicate_noise(group, measure)
        if noise is not None:
            measured[key] = noise
    return Strata(measured, inflation) if measured else None


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


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def holm(effects: Sequence[Effect | None], alpha: float = ALPHA) -> list[bool]:
    """Which effects are significant under Holm's step-down procedure at familywise level `alpha` (None: never)."""
    order = sorted((e.p_value, i) for i, e in enumerate(effects) if e is not None)
    significant = [False] * len(effects)
    for rank, (p, i) in enumerate(order):
        if p > alpha / (len(order) - rank):
            break
        significant[i] = True
    return significant


def holm_levels(effects: Sequence[Effect | None], alpha: float = ALPHA) -> list[float]:
    """The error level each effect's decision uses under Holm's step-down (`holm`): alpha / (m - r) for the test of
    rank r (smallest p first) up to the first that is not significant, whose level every later test keeps. An
    interval at its test's level excludes zero exactly when the test is significant, so the interval printed
    beside a decision is the one the decision uses. (None effects: alpha.)"""
    order = sorted((e.p_value, i) for i, e in enumerate(effects) if e is not None)
    levels, stopped = [alpha] * len(effects), None
    for rank, (p, i) in enumerate(order):
        level = alpha / (len(order) - rank)
        if stopped is None and p > level:
            stopped = level
        levels[i] = level if stopped is None else stopped
    return levels


def decide(effects: Sequence[Effect | None], alpha: float = ALPHA) -> list[str]:
    """Per effect (its claimed direction positive): HELD when significant and positive, NOT_HELD when significant
    and negative, UNRESOLVED otherwise; the effects are one family for Holm's adjustment."""
    return [UNRESOLVED if not s else HELD if e.estimate > 0 else NOT_HELD
            for e, s in zip(effects, holm(effects, alpha))]


def combine(decisions: Sequence[str]) -> str:
    """A finding's verdict from its tests' decisions: HELD when some test holds and none goes the other way,
    NOT_HELD the reverse, MIXED when both happen, UNRESOLVED when no test clears the rule."""
    held, against = HELD in decisions, NOT_HELD in decisions
    return MIXED if held and against else HELD if held else NOT_HELD if against else UNRESOLVED


PARTLY = "partly held"


def conjoin(parts: Sequence[str]) -> str:
    """The verdict of a claim that is two statements at once (the paper's "A and B") from each part's `combine`d
    verdict: HELD only when every part holds, NOT_HELD when some part goes the other way and none holds, MIXED
    when parts go both ways (or one is mixed), PARTLY when some hold and the rest are not resolved, UNRESOLVED
    when none is resolved."""
    if MIXED in parts or (HELD in parts and NOT_HELD in parts):
        return MIXED
    if all(p == HELD for p in parts):
        return HELD
    return NOT_HELD if NOT_HELD in parts else PARTLY if HELD in parts else UNRESOLVED


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
