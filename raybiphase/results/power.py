"""The smallest effect a planned study can resolve: a finding's minimum detectable effect (MDE), before any run.

    se = effect_se(pair_design(pairs=4, tasks=6), seeds=5, runs={"a": 1, "b": 1}, noise=ASSUMED)
    mde(se, tests=3)          # points: the true effect found 80% of the time at 5% two-sided, Holm over 3 sizes

The variance model is raybiphase.results.inference's: an effect is a contrast of cells (arm, task) with
coefficients c; a cell's score is the mean over its arm's n pretraining runs of each run's mean test score over
the fine-tuning seeds, so one run of a cell varies by a pretraining part and a fine-tuning part,

    var(run) = pretrain_sd^2 + seed_sd^2 / seeds,      var(effect) = sum over cells of c^2 var(run) / n(arm),

tasks and arms independent (the report's intervals also count measured correlations between tasks; the MDE
takes them as zero). The MDE is the true effect a two-sided test at level alpha / tests (Holm's first step, so the
bound holds for the finding's whole family of sizes) clears with probability `power`:
(z(1 - alpha / (2 tests)) + z(power)) x SE, the normal approximation (the report's t-tests with few degrees of
freedom need somewhat more). Where a sweep's rows exist, `measured_noise` reads both SDs from them; otherwise
the dry run states the assumed ones (`ASSUMED`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

import pandas as pd

from raybiphase.results.inference import ALPHA, Cell, Noise, Strata

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

    def run_variance(self, seeds: int) -> float:
        return self.pretrain_sd**2 + self.seed_sd**2 / seeds


ASSUMED = NoiseModel(seed_sd=1.0, pretrain_sd=0.5, source="assumed")
"""Stated, not measured: a fine-tuning seed SD of 1.0 point and a pretraining-run SD of 0.5 points, a test score's
typical seed spread on the paper's tasks at the best LR and half of it between pretraining runs. The dry run
prints them; a sweep's rows replace them (`measured_noise`)."""


def z(prob: float) -> float:
    return NormalDist().inv_cdf(prob)


def mde(se: float, *, alpha: float = ALPHA, power: float = POWER, tests: int = 1) -> float:
    """The smallest true effect a two-sided test at alpha / tests detects with probability `power` (normal)."""
    return (z(1 - alpha / (2 * tests)) + z(power)) * se


def effect_se(contrast: Mapping[Cell, float], *, seeds: int, runs: Mapping[str, int], noise: NoiseModel) -> float:
    """The standard error of a contrast's estimate when each arm has `runs[arm]` pretraining runs (1 if absent) of
    `seeds` fine-tuning seeds each, under `noise`."""
    per_run = noise.run_variance(seeds)
    return math.sqrt(sum(c * c * per_run / runs.get(arm, 1) for (arm, _), c in contrast.items()))


def pair_design(pairs: int, tasks: int, shared_b: bool = True) -> dict[Cell, float]:
    """The contrast of a matched-pair finding at one size (`inference.pair_contrast`'s shape): on each of `tasks`
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
    """Both SDs from a sweep's pooled cells (`verdicts.pool_replicates`: score_se, n_seeds) and the replicates'
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
    run_var = float(noise.covariance.to_numpy().diagonal().mean())
    pretrain_var = max(0.0, run_var - seed_var / seeds)
    return NoiseModel(math.sqrt(seed_var), math.sqrt(pretrain_var), f"measured ({noise.arms} replicated arm(s))")
