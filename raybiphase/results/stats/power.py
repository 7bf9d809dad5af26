"""The smallest effect a planned study can resolve: a finding's minimum detectable effect (MDE), before any run.

The dry run's lines that price each finding with it: raybiphase.planning.power_lines.

    se = effect_se(pair_design(pairs=4, tasks=6), seeds=5, runs={"a": 1, "b": 1}, noise=ASSUMED)
    mde(se, tests=3)          # points: the true effect found 80% of the time at 5% two-sided, Holm over 3 sizes

The variance model is raybiphase.results.stats.effects': an effect is a contrast of cells (arm, task) with
coefficients c; a cell's score is the mean over its arm's n pretraining runs of each run's mean test score over
the fine-tuning seeds, so one run of a cell varies by a pretraining part and a fine-tuning part,

    var(effect) = sum over arms of [(pretrain_sd^2 (1 - shared) + seed_sd^2 / seeds) sum_t c_t^2
                                    + pretrain_sd^2 shared (sum_t c_t)^2] / n(arm),

a `shared` fraction of a run's pretraining variance common to all its tasks (a run better on every task), which
averaging over tasks does not shrink; arms independent. The MDE is the true effect a two-sided test at level
alpha / tests (Holm's first step, so the bound holds for the finding's whole family of sizes) clears with
probability `power`: (t(1 - alpha / (2 tests), df) + t(power, df)) x SE at the degrees of freedom the replicates
give (the shifted-t approximation; the normal one where df is infinite). Where a sweep's rows exist,
`measured_noise` reads the SDs and the shared part from them; otherwise the dry run states the assumed ones
(`ASSUMED`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from raybiphase.results.aggregate import t_cdf, t_quantile
from raybiphase.results.stats.effects import ALPHA, Cell
from raybiphase.results.stats.noise import Noise, Strata

POWER = 0.8
"""The chance the MDE is detected."""


@dataclass(frozen=True)
class NoiseModel:
    """How much one pretraining run's cell score moves, in points (x 100 of the metric)."""

    seed_sd: float
    """The SD of one fine-tuning seed's test score around its run's mean, at the chosen LR."""
    pretrain_sd: float
    """The SD of a run's seed-averaged score around its arm's mean: a new init and data order (train.seed)."""
    source: str
    """Where the values come from: "assumed" or what they were measured on."""
    shared: float = 0.0
    """The fraction of pretrain_sd^2 common to all of a run's tasks (0: each task's noise its own)."""

    def run_variance(self, seeds: int) -> float:
        return self.pretrain_sd**2 + self.seed_sd**2 / seeds

    def arm_variance(self, coefficients: list[float], seeds: int) -> float:
        """The variance one run adds to sum_t c_t x score_t: its tasks' own noise and the shared part."""
        own = self.pretrain_sd**2 * (1 - self.shared) + self.seed_sd**2 / seeds
        return own * sum(c * c for c in coefficients) + self.pretrain_sd**2 * self.shared * sum(coefficients) ** 2


ASSUMED = NoiseModel(seed_sd=1.0, pretrain_sd=0.8, source="assumed", shared=0.5)
"""Stated, not measured: a fine-tuning seed SD of 1.0 point and a pretraining-run SD of 0.8 points, half of its
variance shared by all of a run's tasks (0.57 points shared, 0.57 per task). The dry run prints them; a sweep's
rows replace them (`measured_noise`)."""


def z(prob: float) -> float:
    return NormalDist().inv_cdf(prob)


def mde(se: float, *, alpha: float = ALPHA, power: float = POWER, tests: int = 1, df: float = math.inf) -> float:
    """The smallest true effect a two-sided t-test at alpha / tests with `df` degrees of freedom detects with
    probability `power` (shifted t; normal at infinite df)."""
    if not math.isfinite(df):
        return (z(1 - alpha / (2 * tests)) + z(power)) * se
    return (t_quantile(1 - alpha / (2 * tests), df) + t_quantile(power, df)) * se


def detected(effect: float, se: float, *, alpha: float = ALPHA, tests: int = 1, df: float = math.inf) -> float:
    """The chance a true `effect` clears a two-sided test at alpha / tests with `df` degrees of freedom (shifted
    t: the inverse of `mde`)."""
    if not math.isfinite(df):
        return NormalDist().cdf(effect / se - z(1 - alpha / (2 * tests)))
    return t_cdf(effect / se - t_quantile(1 - alpha / (2 * tests), df), df)


def effect_se(contrast: Mapping[Cell, float], *, seeds: int, runs: Mapping[str, int], noise: NoiseModel) -> float:
    """The standard error of a contrast's estimate when each arm has `runs[arm]` pretraining runs (1 if absent) of
    `seeds` fine-tuning seeds each, under `noise`."""
    by_arm: dict[str, list[float]] = {}
    for (arm, _), c in contrast.items():
        by_arm.setdefault(arm, []).append(c)
    return math.sqrt(sum(noise.arm_variance(c, seeds) / runs.get(arm, 1) for arm, c in by_arm.items()))


def pair_design(pairs: int, tasks: int, shared_b: bool = True) -> dict[Cell, float]:
    """The contrast of a matched-pair finding at one size (`effects.pair_contrast`'s shape): on each of `tasks`
    tasks, the mean of `pairs` differences a_i - b. `shared_b`: every pair's b side is one arm (the CLM arm
    against every MLM ratio, the MLM arm against every split), which enters once; else each pair has its own b."""
    contrast: dict[Cell, float] = {}
    weight = 1.0 / (tasks * pairs)
    for task in range(tasks):
        for i in range(pairs):
            contrast[f"a{i}", str(task)] = weight
            b = ("b", str(task)) if shared_b else (f"b{i}", str(task))
            contrast[b] = contrast.get(b, 0.0) - weight
    return contrast


def measured_noise(cells: pd.DataFrame, noise: Noise | Strata | None) -> NoiseModel | None:
    """Both SDs from a sweep's pooled cells (`matching.pool_replicates`: score_se, n_seeds) and the replicates'
    Noise: the seed SD as the root mean square of score_se x sqrt(seeds), the pretraining SD from the mean of S's
    diagonal less the seeds' share (never below zero); None without seed intervals or replicates. A pooled cell's
    score_se is that of its mean over n_runs runs, hence the factor n_runs."""
    rows = cells[cells["score_se"].notna() & cells["n_seeds"].notna()]
    if rows.empty or noise is None:
        return None
    if isinstance(noise, Strata):  # the noisiest measured stratum: the power of the hardest-judged arms
        noise = noise.measured[noise.noisiest]
    seed_var = float((rows["score_se"] ** 2 * rows["n_seeds"] * rows["n_runs"]).mean())
    seeds = float(rows["n_seeds"].mean())
    matrix = noise.covariance.to_numpy()
    run_var = float(matrix.diagonal().mean())
    pretrain_var = max(0.0, run_var - seed_var / seeds)
    off = matrix[~np.eye(len(matrix), dtype=bool)]
    shared = min(1.0, max(0.0, float(off.mean()) / pretrain_var)) if len(off) and pretrain_var > 0 else 0.0
    return NoiseModel(math.sqrt(seed_var), math.sqrt(pretrain_var), f"measured ({noise.arms} replicated arm(s))",
                      shared)
