"""How long a sweep takes, before it runs: the timeline's segments start as their dependencies end,
longest remaining chain first, and the paper's plan gives the figures the issue measured with the same model."""

from __future__ import annotations

import pytest

from raybiphase.config import SweepSpec, load
from raybiphase.sweep.plan import make_plan
from raybiphase.sweep.timeline import (
    by_priority,
    fewest_slots_for_the_chain,
    remaining_chain,
    simulate,
    timeline_lines,
    wall_hours,
)


@pytest.fixture(scope="module")
def paper():
    spec = load(SweepSpec, "sweeps/paper.yaml")
    return spec, make_plan(spec)


def test_the_remaining_chain_is_a_segment_plus_its_longest_line_of_descendants(paper):
    spec, plan = paper
    hours = wall_hours(plan, spec)
    chain = remaining_chain(plan, hours)
    for segment in plan.segments.values():
        later = [s for s in plan.segments.values() if segment.id in (s.parent, plan.runs[s.after_run].segments[-1]
                                                                     if s.after_run else None)]
        assert chain[segment.id] == pytest.approx(hours[segment.id] + max((chain[s.id] for s in later), default=0))
    roots = [s for s in plan.segments.values() if not s.parent and not s.after_run]
    assert by_priority(roots, chain)[0].id == max(roots, key=lambda s: chain[s.id]).id


@pytest.mark.parametrize("slots, days", [(4, 2.4), (8, 1.2), (64, 0.63)])
def test_events_not_waves_bring_the_paper_down_to_its_longest_chain(paper, slots, days):
    spec, plan = paper
    timeline = simulate(plan, spec, slots)
    assert timeline.pretraining_hours / 24 == pytest.approx(days, abs=0.05)  # the table, same model
    assert timeline.pretraining_hours >= timeline.chain_hours * (1 - 1e-9)  # no cluster beats the chain
    assert timeline.total_hours >= timeline.pretraining_hours
    assert timeline.gpus == slots * spec.resources.num_workers


def test_more_slots_never_take_longer_and_the_fewest_that_reach_the_chain_do(paper):
    spec, plan = paper
    times = [simulate(plan, spec, n).pretraining_hours for n in range(1, 20)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:]))
    reach = fewest_slots_for_the_chain(plan, spec)
    chain = simulate(plan, spec).chain_hours
    assert simulate(plan, spec, reach).pretraining_hours <= chain * 1.01 < simulate(plan, spec, reach - 1).pretraining_hours


def test_a_sweep_under_way_simulates_what_is_left(paper):
    """A finished segment leaves less to do; a half-done one shortens the sweep by at most half the segment, and by
    all of that half where it heads the only longest chain and the slots reach it."""
    spec, plan = paper
    hours = wall_hours(plan, spec)
    chain = remaining_chain(plan, hours)
    first = max((s for s in plan.segments.values() if not s.parent and not s.after_run), key=lambda s: chain[s.id])
    whole = simulate(plan, spec)
    rest = simulate(plan, spec, done=frozenset({first.id}))
    assert rest.pretraining_hours < whole.pretraining_hours
    slots = fewest_slots_for_the_chain(plan, spec)
    full = simulate(plan, spec, slots).pretraining_hours
    halfway = simulate(plan, spec, slots, running={first.id: hours[first.id] / 2}).pretraining_hours
    assert full - hours[first.id] / 2 - 1e-9 <= halfway <= full
    ties = [s for s in plan.segments if chain[s] >= chain[first.id] * (1 - 1e-9) and s != first.id]
    if not any(not plan.segments[s].parent and not plan.segments[s].after_run for s in ties):
        assert halfway == pytest.approx(full - hours[first.id] / 2, rel=0.01)


def test_the_dry_run_says_how_long_and_what_more_slots_buy(paper):
    spec, plan = paper
    lines = timeline_lines(plan, spec)
    assert lines[0].startswith("wall-clock: 2.4 days of pretraining with 4 segment(s) at once (128 GPUs")
    assert lines[0].endswith("with fine-tuning (full grid, filling idle GPUs) at most 4.6 days")  # each checkpoint's grid
    assert lines[1].startswith("longest chain: 15.2 hours; 20 segment(s) at once (640 GPUs) reach it")
