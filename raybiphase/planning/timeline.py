"""How long a sweep takes on the cluster its spec asks for, before it runs: each segment's wall time (its GPU-hours
at the spec's MFU over the GPUs it holds), the longest chain of segments that must run one after another, and an
event-driven simulation of the driver (a segment starts as soon as its dependencies are done and one of
`resources.max_concurrent` slots is free, longest remaining chain first; fine-tuning fills the GPUs segments leave
idle, a checkpoint's trials once its segment has ended).

This is a model of the time line, for the dry run and the progress line's ETA; the one loop that runs the jobs is
raybiphase.sweep.scheduler, which orders segments by the same priority (`by_priority`).
"""

from __future__ import annotations

import dataclasses
import heapq
import math

from raybiphase.config import SweepSpec
from raybiphase.config.estimates import segment_gpus
from raybiphase.planning.cost import checkpoint_finetune_gpu_hours, hours_text, segment_gpu_hours
from raybiphase.planning.plan import Plan, Segment, dependencies


@dataclasses.dataclass(frozen=True)
class Timeline:
    slots: int  # segments at once
    gpus: int  # GPUs of the cluster: slots x GPUs per segment
    pretraining_hours: float  # until the last segment ends
    total_hours: float  # until the last fine-tuning trial ends too (at most: the full grid)
    chain_hours: float  # the longest chain of segments: no cluster finishes pretraining sooner


def wall_hours(plan: Plan, spec: SweepSpec) -> dict[str, float]:
    """Each segment's wall-clock hours on the GPUs it holds."""
    gpus = segment_gpus(spec.run)
    return {s.id: segment_gpu_hours(s, spec) / gpus for s in plan.segments.values()}


def remaining_chain(plan: Plan, hours: dict[str, float]) -> dict[str, float]:
    """For each segment, its own hours plus the longest chain of segments that can start only after it."""
    after: dict[str, list[str]] = {s: [] for s in plan.segments}
    for segment in plan.segments.values():
        for dep in dependencies(segment, plan.runs):
            after[dep].append(segment.id)
    chain: dict[str, float] = {}
    for sid in reversed(list(plan.segments)):  # dependency order, read backwards: children first
        chain[sid] = hours[sid] + max((chain[c] for c in after[sid]), default=0.0)
    return chain


def by_priority(segments: list[Segment], chain: dict[str, float]) -> list[Segment]:
    """Longest remaining chain first; plan order among equals."""
    order = {s.id: i for i, s in enumerate(segments)}
    return sorted(segments, key=lambda s: (-chain[s.id], order[s.id]))


@dataclasses.dataclass(frozen=True)
class _Work:
    """What a simulation plays out, computed once per plan and spec however many slot counts are tried."""

    hours: dict[str, float]  # segment -> wall hours
    chain: dict[str, float]  # segment -> remaining chain (`remaining_chain`)
    after: dict[str, list[str]]  # segment -> the segments that wait for it
    waits_on: dict[str, int]  # segment -> how many segments it waits for
    order: dict[str, int]  # segment -> its place in plan order (ties in priority)
    finetune: dict[str | None, float]  # `_finetune_hours`
    per_gpus: int  # GPUs one segment holds


def _work(plan: Plan, spec: SweepSpec) -> _Work:
    hours = wall_hours(plan, spec)
    after: dict[str, list[str]] = {s: [] for s in plan.segments}
    waits_on = {}
    for segment in plan.segments.values():
        deps = dependencies(segment, plan.runs)
        waits_on[segment.id] = len(deps)
        for dep in deps:
            after[dep].append(segment.id)
    return _Work(hours, remaining_chain(plan, hours), after, waits_on, {s: i for i, s in enumerate(plan.segments)},
                 _finetune_hours(plan, spec), segment_gpus(spec.run))


def simulate(plan: Plan, spec: SweepSpec, slots: int | None = None, *, done: frozenset[str] = frozenset(),
             running: dict[str, float] | None = None) -> Timeline:
    """The driver's schedule, played out with each segment's estimated hours (module docstring); from a sweep under
    way: `done` segments are over, `running` ones need the given hours more."""
    return _simulate(_work(plan, spec), slots or spec.run.resources.max_concurrent, done, running or {})


def _simulate(work: _Work, slots: int, done: frozenset[str], running: dict[str, float]) -> Timeline:
    pretraining, total, _ = _play(work, slots, done, running)
    return Timeline(slots, slots * work.per_gpus, pretraining, total, max(work.chain.values(), default=0.0))


def _play(work: _Work, slots: int, done: frozenset[str], running: dict[str, float]) -> tuple[float, float, int]:
    """(hours until the last segment ends, until the last fine-tuning trial ends, most segments ever running at
    once): an event per segment end, each on heaps (ready segments by priority, running ones by end time), so a
    play costs O(segments x log segments). Ready segments start while fewer than `slots` run."""
    gpus = slots * work.per_gpus
    waiting = {sid: count for sid, count in work.waits_on.items() if sid not in done and sid not in running}
    for sid in done:
        for child in work.after[sid]:
            if child in waiting:
                waiting[child] -= 1
    ready = [(-work.chain[sid], work.order[sid], sid) for sid, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    heap = [(left, sid) for sid, left in running.items()]  # (end time, segment id)
    heapq.heapify(heap)
    now, backlog = 0.0, 0.0 if done or running else work.finetune.get(None, 0.0)  # the controls' trials: at once
    widest = len(heap)
    while ready or heap:
        while ready and len(heap) < slots:
            sid = heapq.heappop(ready)[2]
            heapq.heappush(heap, (now + work.hours[sid], sid))
        widest = max(widest, len(heap))
        end, sid = heapq.heappop(heap)
        backlog = max(0.0, backlog - (gpus - (len(heap) + 1) * work.per_gpus) * (end - now))  # idle GPUs fine-tune
        now = end
        backlog += work.finetune.get(sid, 0.0)
        for child in work.after[sid]:
            if child in waiting:
                waiting[child] -= 1
                if waiting[child] == 0:
                    heapq.heappush(ready, (-work.chain[child], work.order[child], child))
    return now, now + backlog / gpus, widest


def _finetune_hours(plan: Plan, spec: SweepSpec) -> dict[str | None, float]:
    """GPU-hours of the fan-out (every trial of each checkpoint's grid: an upper bound) by the segment whose end
    makes them ready; the controls' under None."""
    if not spec.finetune.tasks:
        return {}
    runs = plan.checkpoints()
    out: dict[str | None, float] = {None: sum(checkpoint_finetune_gpu_hours(c.config.model.size, spec)
                                              for c in plan.controls.values())}
    for (segment, step), grid in plan.grids(spec).items():
        size = plan.runs[runs[(segment, step)][0]].config.model.size
        out[segment] = out.get(segment, 0.0) + checkpoint_finetune_gpu_hours(size, spec, grid)
    return out


def fewest_slots_for_the_chain(plan: Plan, spec: SweepSpec, tolerance: float = 0.01) -> int:
    """The fewest segments at once whose pretraining ends within `tolerance` of the longest chain (all the segments
    when no count reaches it); `_fewest_slots` says how it is searched."""
    return _fewest_slots(_work(plan, spec), tolerance)


def _fewest_slots(work: _Work, tolerance: float) -> int:
    """A bisection over slot counts, a play each: below the work's own bound (every segment's hours over the slots
    already exceed the target) no count reaches the chain, and from the most segments the unbounded schedule ever
    runs at once the schedule is that one, so the search lies between and takes about log2 of that many plays. It
    returns a count that reaches the target where one fewer does not: the fewest wherever reaching it does not come
    and go as slots grow. A greedy schedule's hours can grow with its slots (Graham's anomalies), so that is checked,
    not proved: tests compare this search with one over every count on random plans and on every committed spec."""
    count = len(work.hours)
    target = max(work.chain.values(), default=0.0) * (1 + tolerance)
    unbounded, _, widest = _play(work, count, frozenset(), {})
    if unbounded > target or count == 0:  # no count reaches it
        return count
    low = max(1, min(widest, math.floor(sum(work.hours.values()) / (target * (1 + 1e-9))))) if target > 0 else 1
    high = max(widest, 1)  # reaches it
    while low < high:
        middle = (low + high) // 2
        if _play(work, middle, frozenset(), {})[0] <= target:
            high = middle
        else:
            low = middle + 1
    return high


def timeline_lines(plan: Plan, spec: SweepSpec) -> list[str]:
    """The dry run's answer to "how long": for the spec's cluster, and what more segments at once would buy."""
    work = _work(plan, spec)
    asked = _simulate(work, spec.run.resources.max_concurrent, frozenset(), {})
    reach = _fewest_slots(work, 0.01)
    lines = [f"wall-clock: {hours_text(asked.pretraining_hours)} of pretraining with {asked.slots} segment(s) at once "
             f"({asked.gpus} GPUs, segments started as their dependencies end, longest remaining chain first)"
             + (f"; with fine-tuning (full grid, filling idle GPUs) at most {hours_text(asked.total_hours)}"
                if spec.finetune.tasks else "")]
    lines.append(f"longest chain: {hours_text(asked.chain_hours)}; {reach} segment(s) at once "
                 f"({reach * segment_gpus(spec.run)} GPUs) reach it (--set resources.max_concurrent=N shows another)")
    return lines
