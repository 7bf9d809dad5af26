"""Masking beyond one fixed ratio: a ratio that changes linearly over an MLM phase (Ankner et al.) and a
ratio drawn per sequence from a range (the masking-rate control for CLM), each a pure function of (seed, sample,
position, step), validated with one-line errors and planned exactly."""

from __future__ import annotations

import numpy as np
import pytest

from raybiphase.config import ConfigError, RunConfig, SweepSpec, from_dict, run_hash, weights_settings
from raybiphase.data.masking import MaskingSpec, mlm_mask
from raybiphase.naming import run_name
from raybiphase.planning.plan import make_plan, shared_steps

VOCAB, SPECIALS, MASK = 1000, (0, 1, 2, 3), 3


def _masked(spec: MaskingSpec, ids: np.ndarray, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(0)
    blocks = rng.integers(4, VOCAB, size=(len(ids), 256))
    _, labels = mlm_mask(blocks, ids, seed=seed, spec=spec, mask_token_id=MASK, vocab_size=VOCAB,
                         special_ids=SPECIALS)
    return labels != -100


def test_a_ratio_schedule_masks_each_step_at_its_share_of_the_linear_ramp():
    first, rows, steps = 1000, 64, 10
    spec = MaskingSpec(mask_ratio=0.4, ratio_end=0.15, ramp=(first, rows, steps))
    ids = np.arange(first, first + rows * steps)
    share = _masked(spec, ids).reshape(steps, -1).mean(axis=1)
    expected = 0.4 + (0.15 - 0.4) * np.arange(steps) / (steps - 1)
    assert np.abs(share - expected).max() < 0.01  # 16,384 tokens a step: the share's sd is about 0.004
    fixed = MaskingSpec(mask_ratio=0.4)  # the first step is the fixed ratio's, token for token: shared exactly
    assert np.array_equal(_masked(spec, ids[:rows]), _masked(fixed, ids[:rows]))
    assert np.array_equal(_masked(spec, ids[rows * 3:rows * 4]), _masked(spec, ids)[rows * 3:rows * 4])  # any slice


def test_a_ratio_range_draws_each_sequence_its_own_uniform_rate():
    spec = MaskingSpec(mask_ratio=0.4, ratio_range=(0.15, 0.6))
    ids = np.arange(4000)
    rates = np.sort(spec.row_ratios(5, 0, ids))
    uniform = 0.15 + 0.45 * (np.arange(1, 4001) - 0.5) / 4000
    assert np.abs(rates - uniform).max() < 0.03  # Kolmogorov-Smirnov distance to U(0.15, 0.6)
    assert rates.min() >= 0.15 and rates.max() < 0.6
    masked = _masked(spec, ids)
    assert np.corrcoef(masked.mean(axis=1), spec.row_ratios(5, 0, ids))[0, 1] > 0.95  # each row at its own rate
    assert np.array_equal(_masked(spec, ids[7:8]), masked[7:8])  # a row's rate is its own, whatever the batch
    assert not np.array_equal(spec.row_ratios(5, 0, ids), spec.row_ratios(6, 0, ids))  # and the seed's


@pytest.mark.parametrize("phases, key", [
    ({"steps": 10, "clm_share": 1.0, "plan": [{"objective": "clm", "steps": 10, "mask_ratio_end": 0.2}]},
     "phases.plan.0.mask_ratio_end"),
    ({"mask_ratio_range": [0.15, 1.2]}, "phases.mask_ratio_range.1"),
    ({"mask_ratio_range": [0.5, 0.2]}, "phases.mask_ratio_range"),
    ({"mask_ratio_end": 0.0}, "phases.mask_ratio_end"),
    ({"mask_ratio_end": 0.15, "mask_ratio_range": [0.15, 0.6]}, "phases.mask_ratio_range"),
])
def test_bad_masking_knobs_are_one_line_errors_naming_the_key(phases, key):
    with pytest.raises(ConfigError) as err:
        from_dict(RunConfig, {"phases": phases})
    assert str(err.value).startswith(f"{key}:") and "\n" not in str(err.value)


OPTIM = {"warmup_steps": 2, "decay_steps": 2}


def test_the_knobs_enter_a_run_only_when_set_and_name_it():
    fixed = from_dict(RunConfig, {"phases": {"steps": 10, "clm_share": 0.5}, "optim": OPTIM})
    assert "mask_ratio_end" not in str(weights_settings(fixed))  # runs without them keep their names
    ramp = from_dict(RunConfig, {"phases": {"steps": 10, "clm_share": 0.5, "mask_ratio_end": 0.15}, "optim": OPTIM})
    ranged = from_dict(RunConfig, {"phases": {"steps": 10, "clm_share": 0.5, "mask_ratio_range": [0.15, 0.6]},
                                   "optim": OPTIM})
    assert len({run_hash(fixed), run_hash(ramp), run_hash(ranged)}) == 3
    assert "-clm-5-mlm40to15-10-" in run_name(ramp)
    assert "-mlmu15to60-10-" in run_name(ranged)


def test_the_planner_shares_what_the_knobs_leave_identical():
    spec = from_dict(SweepSpec, {"phases": {"steps": 20, "clm_share": 0.5}, "optim": OPTIM,
                                 "sweep": {"runs": [{"phases.mask_ratio_end": 0.15},
                                                    {"phases.mask_ratio_range": [0.15, 0.6]}]}})
    plan = make_plan(spec)
    fixed, ramp, ranged = (plan.runs[n] for n in plan.runs)
    assert "mlm40to15" in ramp.name and "mlmu15to60" in ranged.name
    assert shared_steps(fixed, ramp) == 11  # the CLM half and the ramp's first MLM step (its ratio is the fixed one)
    assert shared_steps(fixed, ranged) == 10  # a per-sequence rate differs from the first MLM step
    prefix = {s for s in fixed.segments} & {s for s in ramp.segments} & {s for s in ranged.segments}
    assert [plan.segments[s].end for s in prefix] == [10]


def test_the_loop_ramps_each_phase_from_its_own_first_sample():
    from raybiphase.pretrain.loop import masking_spec

    run = from_dict(RunConfig, {"phases": {"steps": 20, "clm_share": 0.5, "mask_ratio_end": 0.15}, "optim": OPTIM})
    phase = run.phases.resolved()[1]
    spec = masking_spec(phase, run, first_sample=500 + 10 * 16, rows_per_step=16)
    assert spec.ramp == (660, 16, 10) and spec.ratio_end == 0.15
    ratios = spec.row_ratios(0, 0, np.array([660, 675, 676, 660 + 16 * 9]))
    assert ratios[:2].tolist() == [0.4, 0.4] and ratios[-1] == pytest.approx(0.15)
