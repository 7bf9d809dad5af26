"""How long a sweep takes, before it runs: the timeline's segments start as their dependencies end,
longest remaining chain first, and the paper's plan gives the figures the issue measured with the same model."""

from __future__ import annotations

import random

import pytest

from raybiphase.config import SweepSpec, load
from raybiphase.planning.plan import dependencies, make_plan
from raybiphase.planning.timeline import (
    _finetune_hours,
    by_priority,
    fewest_slots_for_the_chain,
    remaining_chain,
    segment_gpus,
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


@pytest.mark.parametrize("slots, days", [(4, 2.46), (8, 1.23), (64, 0.63)])
def test_events_not_waves_bring_the_paper_down_to_its_longest_chain(paper, slots, days):
    spec, plan = paper
    timeline = simulate(plan, spec, slots)
    assert timeline.pretraining_hours / 24 == pytest.approx(days, abs=0.05)  # the table, same model
    assert timeline.pretraining_hours >= timeline.chain_hours * (1 - 1e-9)  # no cluster beats the chain
    assert timeline.total_hours >= timeline.pretraining_hours
    assert timeline.gpus == slots * spec.run.resources.num_workers


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
    assert lines[0].startswith("wall-clock: 2.5 days of pretraining with 4 segment(s) at once (128 GPUs")
    assert lines[0].endswith("with fine-tuning (full grid, filling idle GPUs) at most 3.3 days")  # each checkpoint's grid
    assert lines[1].startswith("longest chain: 15.2 hours; 21 segment(s) at once (672 GPUs) reach it")


def _stepwise(plan, spec, slots, done=frozenset(), running=None):
    """The schedule played the plain way, as a reference: every event rescans the segments left for the ready ones,
    longest remaining chain first, and starts as many as there are free slots."""
    import heapq

    hours, per_gpus = wall_hours(plan, spec), segment_gpus(spec.run)
    chain = remaining_chain(plan, hours)
    finetune = _finetune_hours(plan, spec)
    done, todo = set(done), [s for s in plan.segments.values() if s.id not in done and s.id not in (running or {})]
    heap = sorted((left, sid) for sid, left in (running or {}).items())
    now, backlog = 0.0, 0.0 if done or running else finetune.get(None, 0.0)
    while todo or heap:
        ready = by_priority([s for s in todo if all(d in done for d in dependencies(s, plan.runs))], chain)
        for segment in ready[:max(0, slots - len(heap))]:
            heapq.heappush(heap, (now + hours[segment.id], segment.id))
            todo.remove(segment)
        end, sid = heapq.heappop(heap)
        backlog = max(0.0, backlog - (slots * per_gpus - (len(heap) + 1) * per_gpus) * (end - now))
        now = end
        done.add(sid)
        backlog += finetune.get(sid, 0.0)
    return now, now + backlog / (slots * per_gpus)


def _random_plans(count: int):
    rng = random.Random(7)
    for _ in range(count):
        grid = {"phases.steps": rng.sample([200, 400, 600, 800], rng.randint(1, 3)),
                "phases.clm_share": rng.sample([0.0, 0.25, 0.5, 0.75, 1.0], rng.randint(1, 4)),
                "phases.mask_ratio": rng.sample([0.2, 0.3, 0.4], rng.randint(1, 2))}
        spec = load(SweepSpec, "sweeps/quickstart.yaml", [f"sweep.grid={grid}", "optim.warmup_steps=20",
                                                          "optim.decay_steps=40"])
        yield spec, make_plan(spec)


def test_the_heap_schedule_plays_out_as_the_stepwise_one_from_any_state():
    rng = random.Random(3)
    for spec, plan in _random_plans(12):
        ids = list(plan.segments)
        done = frozenset(ids[:rng.randint(0, len(ids) // 2)])
        running = {s: rng.random() for s in ids if s not in done and rng.random() < 0.3 and
                   all(d in done for d in dependencies(plan.segments[s], plan.runs))}
        for slots in (1, 2, 3, 5, len(ids)):
            for state in ({}, {"done": done, "running": running}):
                timeline = simulate(plan, spec, slots, **state)
                assert (timeline.pretraining_hours, timeline.total_hours) == _stepwise(plan, spec, slots, **state)


def test_the_slot_search_finds_what_trying_every_count_finds():
    for spec, plan in _random_plans(25):
        chain = simulate(plan, spec).chain_hours
        every = next((n for n in range(1, len(plan.segments) + 1)
                      if simulate(plan, spec, n).pretraining_hours <= chain * 1.01), len(plan.segments))
        assert fewest_slots_for_the_chain(plan, spec) == every
