"""The minimum detectable effect: its formula, its variance model against a simulated study, and what moves it."""

import math

import numpy as np
import pandas as pd
import pytest

from raybiphase.results.inference import Noise, pair_contrast
from raybiphase.results.power import ASSUMED, NoiseModel, effect_se, mde, measured_noise, pair_design, z


def test_the_mde_is_the_two_sided_threshold_plus_the_power_quantile_in_standard_errors():
    assert mde(1.0) == pytest.approx(1.959964 + 0.841621, abs=1e-5)  # the textbook 2.80 SE
    assert mde(0.5) == pytest.approx(mde(1.0) / 2)
    assert mde(1.0, tests=3) == pytest.approx(z(1 - 0.05 / 6) + z(0.8))  # Holm's first step over three sizes


def test_the_design_is_the_contrast_the_report_decides_on():
    pairs = pd.DataFrame({"task": ["t0", "t0", "t1", "t1"], "arm_a": ["a0", "a1", "a0", "a1"],
                          "arm_b": ["b", "b", "b", "b"]})
    ours = pair_design(pairs=2, tasks=2)
    theirs = pair_contrast(pairs)
    assert sorted(ours.values()) == sorted(theirs.values())  # a's 1/4 each, the shared b's -1/2 per task


def test_replicates_and_seeds_shrink_the_mde_and_pretraining_noise_sets_its_floor():
    design = pair_design(pairs=1, tasks=4)
    once = effect_se(design, seeds=5, runs={}, noise=ASSUMED)
    thrice = effect_se(design, seeds=5, runs={"a0": 3, "b": 3}, noise=ASSUMED)
    assert thrice == pytest.approx(once / math.sqrt(3))
    many_seeds = effect_se(design, seeds=10**6, runs={}, noise=ASSUMED)
    assert many_seeds == pytest.approx(math.sqrt(2 * ASSUMED.pretrain_sd**2 / 4), rel=1e-4)  # seeds cannot go below


def test_the_stated_mde_is_detected_about_80_percent_of_the_time_in_a_simulated_study():
    # a study: 3 MLM arms against one CLM arm on 4 tasks, 5 fine-tuning seeds per run, the CLM arm and one MLM arm
    # pretrained 3 times; each run's cell = truth + pretraining noise + the mean of its seeds' noise
    noise = NoiseModel(seed_sd=1.2, pretrain_sd=0.7, source="test")
    design, runs, seeds = pair_design(pairs=3, tasks=4), {"a0": 3, "b": 3}, 5
    se = effect_se(design, seeds=seeds, runs=runs, noise=noise)
    effect = mde(se)
    truth = {cell: (effect if cell[0].startswith("a") else 0.0) for cell in design}  # every a beats b by the MDE
    rng = np.random.default_rng(0)
    studies = 4000
    estimates = np.zeros(studies)
    for cell, c in design.items():
        n = runs.get(cell[0], 1)
        run_scores = (truth[cell] + rng.normal(0, noise.pretrain_sd, (studies, n))
                      + rng.normal(0, noise.seed_sd, (studies, n, seeds)).mean(axis=2))
        estimates += c * run_scores.mean(axis=1)
    assert estimates.std() == pytest.approx(se, rel=0.05)  # the variance model is the simulated study's
    detected = np.mean(np.abs(estimates / se) > z(0.975))
    assert detected == pytest.approx(0.80, abs=0.025)


def test_measured_noise_reads_both_sds_from_a_sweeps_cells_and_replicates():
    seeds, seed_sd, pretrain_sd = 5, 2.0, 1.0
    cells = pd.DataFrame({"score_se": [seed_sd / math.sqrt(seeds)] * 2, "n_seeds": [seeds] * 2, "n_runs": [1, 1]})
    covariance = pd.DataFrame([[pretrain_sd**2 + seed_sd**2 / seeds]], index=["t"], columns=["t"])
    measured = measured_noise(cells, Noise(covariance, covariance * 0 + 4, arms=2))
    assert (measured.seed_sd, measured.pretrain_sd) == pytest.approx((seed_sd, pretrain_sd))
    assert "2 replicated" in measured.source
    assert measured_noise(cells, None) is None  # no replicates: the dry run states the assumption instead
