"""The planner compares runs by their schedules' pieces: a step is a hashable value, two runs part exactly where a
step-by-step comparison parts them, the table a segment id hashes is the one every committed sweep's ids were made
from, and a new setting of a step changes both sharing and ids without a new code."""

from __future__ import annotations

import dataclasses
import hashlib
import random

import numpy as np
import pytest

from raybiphase.config import MASKED, SweepSpec, from_dict, load
from raybiphase.config.identity import digest
from raybiphase.phases import Schedule, StepKind
from raybiphase.planning.plan import make_plan
from raybiphase.planning.steps import OBJECTIVE_CODE, RESET, first_difference, id_bytes, id_rows, step_order, step_value


def _run(steps: int, plan: list[dict], lr: float = 1e-3, warmup: int = 2, decay: int = 2):
    return from_dict(SweepSpec, {"phases": {"steps": steps, "plan": plan}, "train": {"global_batch_tokens": 2048},
                                 "optim": {"lr": lr, "warmup_steps": warmup, "decay_steps": decay}}).run


def _reference_rows(run) -> np.ndarray:
    """The per-step table written out step by step from the phases and Schedule.lr, one row per step."""
    schedule = Schedule.from_config(run)
    rows = []
    for step in range(schedule.total_steps):
        phase, lr = schedule.at(step)
        start, frozen = schedule.boundaries[schedule.phase_index(step)], phase.frozen_layers
        code = OBJECTIVE_CODE[phase.objective] + (
            (1 + int(digest({"frozen_layers": list(frozen)}, 12), 16)) / (16**12 + 2) if frozen else 0.0)
        code += RESET if step == start and phase.optimizer == "reset" else 0.0
        ratio = 0.0
        if phase.objective in MASKED and phase.mask_ratio_range is not None:
            ratio = 1.0 + int(digest({"mask_ratio_range": list(phase.mask_ratio_range)}, 12), 16) / 16**12
        elif phase.objective in MASKED and phase.mask_ratio_end is not None:
            ratio = (phase.mask_ratio + (phase.mask_ratio_end - phase.mask_ratio) * (step - start)
                     / max(phase.steps - 1, 1))
        elif phase.objective in MASKED:
            ratio = phase.mask_ratio
        rows.append((code, ratio, lr))
    return np.array(rows)


def _random_run(rng: random.Random):
    steps = rng.randint(4, 40)
    warmup = rng.randint(0, steps // 3)
    decay = rng.randint(0, steps - warmup)
    plan, left = [], steps
    while left:
        phase = {"objective": rng.choice(["clm", "mlm", "mntp"]), "steps": (size := rng.randint(1, left))}
        left -= size
        if phase["objective"] != "clm":
            phase["mask_ratio"] = rng.choice([0.3, 0.4])
            knob = rng.choice(["", "end", "range"])
            phase.update({"end": {"mask_ratio_end": 0.15}, "range": {"mask_ratio_range": [0.15, 0.6]}}.get(knob, {}))
        if plan and rng.random() < 0.3:
            phase.update(optimizer="reset", rewarmup_steps=rng.randint(1, size))
        if rng.random() < 0.2:
            phase["frozen_layers"] = [0]
        plan.append(phase)
    return _run(steps, plan, lr=rng.choice([1e-3, 5e-4]), warmup=warmup, decay=decay)


def test_the_table_ids_hash_is_the_step_by_step_one_on_random_schedules():
    rng = random.Random(0)
    for _ in range(60):
        run = _random_run(rng)
        schedule = Schedule.from_config(run)
        rows = id_rows(schedule, 0, schedule.total_steps)
        assert rows.tobytes() == _reference_rows(run).tobytes()
        assert [list(step_order(step_value(schedule, t))) for t in range(schedule.total_steps)] == rows.tolist()


def test_runs_part_where_a_step_by_step_comparison_parts_them():
    """On random pairs (one mutated from the other, so they share a prefix), the first differing step found piece by
    piece is the first row where the step-by-step tables differ; a step's value is hashable and equal exactly where
    the rows are."""
    rng = random.Random(1)
    for _ in range(100):
        a = _random_run(rng)
        b = _random_run(rng) if rng.random() < 0.3 else _mutated(a, rng)
        sa, sb = Schedule.from_config(a), Schedule.from_config(b)
        end = min(sa.total_steps, sb.total_steps)
        differ = np.nonzero((_reference_rows(a)[:end] != _reference_rows(b)[:end]).any(axis=1))[0]
        assert first_difference(sa, sb, 0, end) == (int(differ[0]) if len(differ) else end)
        for step in range(end):
            same = step_value(sa, step) == step_value(sb, step)
            assert same == (step not in differ) and hash(step_value(sa, step)) is not None


def _mutated(run, rng: random.Random):
    """`run` with one thing changed: its length, its last phase's ratio, or its warmup."""
    plan = [dataclasses.asdict(p) for p in run.phases.resolved()]
    change = rng.choice(["longer", "ratio", "warmup"])
    if change == "longer":
        plan[-1]["steps"] += rng.randint(1, 10)
    elif change == "ratio" and plan[-1]["objective"] != "clm" and plan[-1]["mask_ratio_range"] is None:
        plan[-1]["mask_ratio"] = 0.2
    steps = sum(p["steps"] for p in plan)
    warmup = run.optim.warmup_steps + (change == "warmup" and run.optim.warmup_steps + run.optim.decay_steps < steps)
    return _run(steps, plan, lr=run.optim.lr, warmup=warmup, decay=run.optim.decay_steps)


@dataclasses.dataclass(frozen=True)
class _WiderKind(StepKind):
    """A StepKind with one more setting, as a new phase setting would add it."""

    label_smoothing: float = 0.0


def _with_label_smoothing(schedule: Schedule, from_step: int, value: float) -> Schedule:
    """`schedule` whose pieces from `from_step` (a piece boundary) set the new field."""
    pieces = tuple(dataclasses.replace(p, kind=_WiderKind(**dataclasses.asdict(p.kind), label_smoothing=value))
                   if p.start >= from_step else p for p in schedule.pieces())
    wider = Schedule(schedule.phases, schedule.peak_lr, schedule.warmup_steps, schedule.decay_steps)
    wider.__dict__["_pieces"] = pieces  # the pieces as a schedule with the new phase setting would cut them
    return wider


def test_a_new_step_setting_is_one_field_that_parts_runs_and_their_ids():
    schedule = Schedule.from_config(_run(20, [{"objective": "clm", "steps": 10}, {"objective": "mlm", "steps": 10}]))
    smoothed = _with_label_smoothing(schedule, 10, 0.1)
    assert first_difference(schedule, smoothed, 0, 20) == 10
    assert id_bytes(schedule, 0, 10) == id_bytes(smoothed, 0, 10)
    assert id_bytes(schedule, 0, 20) != id_bytes(smoothed, 0, 20)
    assert _with_label_smoothing(schedule, 10, 0.0).pieces() == tuple(
        dataclasses.replace(p, kind=_WiderKind(**dataclasses.asdict(p.kind))) if p.start >= 10 else p
        for p in schedule.pieces())  # at its default the field adds nothing to an id:
    assert id_bytes(_with_label_smoothing(schedule, 10, 0.0), 0, 20) == id_bytes(schedule, 0, 20)
    whole = hashlib.sha256(id_bytes(smoothed, 0, 20)).hexdigest()
    halves = hashlib.sha256(id_bytes(smoothed, 0, 13) + id_bytes(smoothed, 13, 20)).hexdigest()
    assert whole == halves  # ids hash a prefix, however the segments cut it


@pytest.mark.parametrize("spec, segment", [
    ("sweeps/split_grid.yaml", "610m-clm-3k-5.5k-e44faba8"),  # with sdpa, the paper's twelve datasets held out
    ("sweeps/beyond.yaml", "tiny-mlm15-1-800-c9227f22"),  # a ratio schedule's tail after the shared first step
    ("sweeps/beyond.yaml", "tiny-mlm40-400-800-fa06a484"),  # the MLM phase after an optimizer reset
])
def test_segment_ids_name_the_same_steps_as_the_checkpoints_a_sweep_wrote(spec, segment):
    assert segment in make_plan(load(SweepSpec, spec)).segments
