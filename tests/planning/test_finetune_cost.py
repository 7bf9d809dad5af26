"""The dry run's fine-tuning count: one epoch at most, two passes per retrieval step, evaluations as often as the
spec says, inputs at their measured widths, and the packaged widths equal to their record (no Ray, no torch)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from raybiphase.config import SweepSpec, load
from raybiphase.config.sizes import SIZES
from raybiphase.finetune.input_lengths import MEASURED, QUANTILES, RECORD, STAND_INS, WIDTH_QUANTILE, width
from raybiphase.finetune.tasks import OFFLINE_TASKS
from raybiphase.planning.cost import checkpoint_finetune_gpu_hours, trial_count

REPO = Path(__file__).resolve().parents[2]
PAPER_TASKS = "[sst2, mnli, qqp, conll2003, ontonotes, uner, squad, squad_v2, record, msmarco, nq, mldr]"


def _spec(**finetune) -> SweepSpec:
    """sweeps/paper.yaml's fine-tuning (batch 32, at most 1,000 steps, validation every 100, max_len 2,048)."""
    settings = {"exports": "[]", **finetune}
    return load(SweepSpec, "sweeps/paper.yaml", [f"finetune.{key}={value}" for key, value in settings.items()])


def _pass_s(size: str, spec: SweepSpec, inputs: int, tokens: int, batches: int) -> float:
    """A training pass by hand: FLOPs at finetune_mfu of the peak, plus the floor per layer and batch."""
    model = SIZES[size]
    rate = spec.sweep.gpu_peak_tflops * 1e12 * spec.sweep.finetune_mfu
    return (spec.sweep.finetune_launch_s_per_layer * model.layers * batches
            + model.flops_per_token(0, tokens) * inputs * tokens / rate)


def test_a_dataset_smaller_than_steps_times_batch_trains_one_epoch():
    spec = _spec()
    conll = trial_count(("conll2003",), "610m", spec)  # 14,041 sentences less 5% validation: 13,338
    assert (conll.steps, conll.validations) == (417, 5)
    assert trial_count(("sst2",), "610m", spec).steps == 1000  # 63,981 examples: the step cap ends it first
    capped = trial_count(("sst2",), "610m", _spec(max_examples=640))
    assert (capped.steps, capped.validations) == (20, 1)
    # the short epoch costs its steps only: 417 steps of 32 sentences at their width
    assert conll.train_s == pytest.approx(_pass_s("610m", spec, 417 * 32, width("conll2003", "train", 2048), 417))


def test_a_retrieval_step_encodes_a_query_and_a_passage():
    spec = _spec(max_len=128)
    query, passage = width("msmarco", "train_query", 128), width("msmarco", "train_passage", 128)
    assert (query, passage) == (64, 128)  # SQuAD's questions p98 27 tokens -> 64; its paragraphs capped at max_len
    trial = trial_count(("msmarco", "nq", "mldr"), "210m", spec)
    assert trial.train_s == pytest.approx(_pass_s("210m", spec, 1000 * 32, query, 1000)
                                          + _pass_s("210m", spec, 1000 * 32, passage, 1000))
    assert trial.train_s > 2 * 1000 * spec.sweep.finetune_launch_s_per_layer * SIZES["210m"].layers


def test_evaluations_follow_eval_every_and_each_task_of_a_group_is_scored():
    every_100, every_50 = trial_count(("conll2003",), "610m", _spec()), trial_count(("conll2003",), "610m",
                                                                                    _spec(eval_every=50))
    assert (every_100.validations, every_50.validations) == (5, 9)  # 417 steps: at 100..400 and 417; 50..400, 417
    # eval_s = validations x one validation + one test: two counts pin both parts
    one_validation = (every_50.eval_s - every_100.eval_s) / 4
    assert one_validation > 0 and every_100.eval_s - 5 * one_validation > 0
    spec = _spec()
    alone, grouped = trial_count(("msmarco",), "610m", spec), trial_count(("msmarco", "nq", "mldr"), "610m", spec)
    assert grouped.train_s == pytest.approx(alone.train_s) and grouped.eval_s > alone.eval_s
    # nq and mldr train on MS MARCO's pairs: listed without msmarco, their trial still trains a full epoch cap
    assert trial_count(("nq", "mldr"), "610m", spec).steps == 1000


def test_the_floor_and_mfu_reproduce_the_trial_they_were_calibrated_on():
    """210m on an H100, tweets at max_len 512, batch 32, eager: 634 examples/s (sweep.finetune_mfu's docstring);
    tweets are padded to 64 tokens."""
    spec = _spec(tasks="[tweets]", max_len=512, max_steps=100, max_examples=3200)
    trial = trial_count(("tweets",), "210m", spec)
    assert width("tweets", "train", 512) == 64
    assert trial.steps * 32 / trial.train_s == pytest.approx(634, rel=0.01)


def test_measured_widths_cut_the_price_and_unmeasured_tasks_keep_max_len():
    assert width("squad", "train", 2048) == 384 and width("squad", "train", 256) == 256
    assert width("record", "train", 2048) == 2048 and width("mldr", "eval_passage", 512) == 512
    spec = _spec()
    assert checkpoint_finetune_gpu_hours("610m", spec) < checkpoint_finetune_gpu_hours(
        "610m", _spec(tasks="[record]")) * 12  # record, at max_len, costs more than the average task


def test_the_packaged_widths_are_the_committed_records():
    record = json.loads((REPO / RECORD).read_text())
    assert set(record["tasks"]) == set(OFFLINE_TASKS) == set(MEASURED)
    for name, parts in record["tasks"].items():
        assert {part: (s["mean"], s[f"p{WIDTH_QUANTILE}"]) for part, s in parts.items()} == MEASURED[name], name
        for stats in parts.values():
            quantiles = [stats[f"p{q}"] for q in QUANTILES]
            assert quantiles == sorted(quantiles) and stats["measured"] <= stats["of"]
    assert record["paper_tasks"] == {name: {"measured_on": on, "why": why} for name, (on, why) in STAND_INS.items()}
    assert set(STAND_INS) == set(PAPER_TASKS.strip("[]").split(", "))
    assert "bench_input_lengths.py" in record["command"] and "tiktoken" in record["tokenizer"]
    assert all(on is None or on in MEASURED for on, _ in STAND_INS.values())
    assert math.isclose(MEASURED["squad"]["train"][0], record["tasks"]["squad"]["train"]["mean"])


def test_length_bucketed_batches_read_every_unit_once_in_batches_of_about_one_length():
    from raybiphase.finetune.input_lengths import BUCKET_BATCHES, training_order

    lengths = list(np.random.default_rng(7).integers(10, 500, size=10 * BUCKET_BATCHES * 8 + 5))
    plain = training_order(lengths, 8, seed=3)
    assert (plain == np.random.default_rng(3).permutation(len(lengths))).all()  # off: the order trials always read
    bucketed = training_order(lengths, 8, seed=3, bucket=True)
    assert sorted(bucketed) == list(range(len(lengths)))  # a permutation: one epoch reads every unit once
    assert (bucketed == training_order(lengths, 8, seed=3, bucket=True)).all()
    assert (bucketed != training_order(lengths, 8, seed=4, bucket=True)).any()

    def spread(order) -> float:  # mean (longest - shortest) over the full batches
        values = np.asarray(lengths)[order[: len(order) // 8 * 8]].reshape(-1, 8)
        return float((values.max(1) - values.min(1)).mean())
    assert spread(bucketed) < spread(plain) / 10
    assert set(bucketed[-5:]) == set(plain[-5:])  # the last run's 5 units: a short batch, kept last
    assert len(training_order([], 8, seed=0, bucket=True)) == 0


def test_bucketing_is_a_recorded_setting_and_prices_training_at_about_the_mean():
    from raybiphase.finetune.records import trial_settings

    plain, bucketed = _spec(), _spec(bucket_by_length=True)
    assert trial_settings(plain.finetune) != trial_settings(bucketed.finetune)  # other batches: records not reused
    assert width("squad", "train", 2048, bucketed=True) == 239  # mean 174.8 + 64, below the p98's 384
    assert width("record", "train", 2048, bucketed=True) == 2048  # unmeasured: max_len either way
    squad, squad_bucketed = (trial_count(("squad",), "610m", spec) for spec in (plain, bucketed))
    assert squad_bucketed.train_s < squad.train_s and squad_bucketed.eval_s == squad.eval_s  # evaluation unchanged
