"""The noise every effect's interval counts (docs/statistics.md, "The noise it counts").

Pure numpy and pandas. A run's scores hold its pretraining noise and its fine-tuning noise:

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
  share a trial added as fully correlated (the bound), Welch-Satterthwaite's degrees of freedom
  (raybiphase.results.stats.effects). Such an interval ignores pretraining noise, and the report says so.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from raybiphase.config.sweep import UNMEASURED_SD


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
    # pivot_table's (arm, replicate) x task means, without its overhead (this runs per stratum, per report)
    table = runs.groupby(["arm", "replicate", "task"], sort=True)[measure].mean().unstack("task")
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

