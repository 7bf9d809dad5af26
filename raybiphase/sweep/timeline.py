"""How long a sweep takes on the cluster its spec asks for, before it runs: each segment's wall time (its GPU-hours
at the spec's MFU over the GPUs it holds), the longest chain of segments that must run one after another, and an
event-driven simulation of the driver (a segment starts as soon as its dependencies are done and one of
`resources.max_concurrent` slots is free, longest remaining chain first; fine-tuning fills the GPUs segments leave
idle, a checkpoint's trials once its segment has ended).

The same priority orders the driver's segments (raybiphase.sweep.driver.pretrain_all).
"""

from __future__ import annotations

import dataclasses
import heapq

from raybiphase.config import SweepSpec
from raybiphase.sweep.cost import checkpoint_finetune_gpu_hours, segment_gpu_hours
from raybiphase.sweep.plan import Plan, Segment, dependencies


@dataclasses.dataclass(frozen=True)
class Timeline:
    slots: int  # segments at once
    gpus: int  # GPUs of the cluster: slots x GPUs per segment
    pretraining_hours: float  # until the last segment ends
    total_hours: float  # until the last fine-tuning trial ends too (at most: the full grid)
    chain_hours: float  # the longest chain of segments: no cluster finishes pretraining sooner


def segment_gpus(spec: SweepSpec) -> int:
    """GPUs one segment holds (a CPU run counts its workers, so the arithmetic stays the same)."""
    res = spec.resources
    return max(1, round(res.num_workers * res.gpus_per_worker) if res.gpus_per_worker > 0 else res.num_workers)


def wall_hours(plan: Plan, spec: SweepSpec) -> dict[str, float]:
    """Each segment's wall-clock hours on the GPUs it holds."""
    gpus = segment_gpus(spec)
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


def simulate(plan: Plan, spec: SweepSpec, slots: int | None = None, *, done: frozenset[str] = frozenset(),
             running: dict[str, float] | None = None) -> Timeline:
    """The driver's schedule, played out with each segment's estimated hours (module docstring); from a sweep under
    way: `done` segments are over, `running` ones need the given hours more."""
    slots = slots or spec.resources.max_concurrent
    hours, per_gpus = wall_hours(plan, spec), segment_gpus(spec)
    chain = remaining_chain(plan, hours)
    finetune = _finetune_hours(plan, spec)  # segment id -> GPU-hours its checkpoints' trials need
    gpus = slots * per_gpus
    done = set(done)
    todo = [s for s in plan.segments.values() if s.id not in done and s.id not in (running or {})]
    heap = [(left, sid) for sid, left in (running or {}).items()]  # (end time, segment id)
    heapq.heapify(heap)
    now, backlog = 0.0, 0.0 if done or running else finetune.pop(None, 0.0)  # the controls' trials: at once
    while todo or heap:
        ready = by_priority([s for s in todo if all(d in done for d in dependencies(s, plan.runs))], chain)
        for segment in ready[:slots - len(heap)]:
            heapq.heappush(heap, (now + hours[segment.id], segment.id))
            todo.remove(segment)
        end, sid = heapq.heappop(heap)
        backlog = max(0.0, backlog - (gpus - (len(heap) + 1) * per_gpus) * (end - now))  # idle GPUs fine-tune
        now = end
        done.add(sid)
        backlog += finetune.get(sid, 0.0)
    total = now + backlog / gpus
    return Timeline(slots, gpus, now, total, max(chain.values(), default=0.0))


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
    """The fewest segments at once whose pretraining ends within `tolerance` of the longest chain."""
    chain = max(remaining_chain(plan, wall_hours(plan, spec)).values(), default=0.0)
    for slots in range(1, len(plan.segments) + 1):
        if simulate(plan, spec, slots).pretraining_hours <= chain * (1 + tolerance):
            return slots
    return len(plan.segments)


def timeline_lines(plan: Plan, spec: SweepSpec) -> list[str]:
    """The dry run's answer to "how long": for the spec's cluster, and what more segments at once would buy."""
    asked = simulate(plan, spec)
    reach = fewest_slots_for_the_chain(plan, spec)
    days = lambda hours: f"{hours / 24:,.1f} days" if hours >= 48 else f"{hours:,.1f} hours"  # noqa: E731
    lines = [f"wall-clock: {days(asked.pretraining_hours)} of pretraining with {asked.slots} segment(s) at once "
             f"({asked.gpus} GPUs, segments started as their dependencies end, longest remaining chain first)"
             + (f"; with fine-tuning (full grid, filling idle GPUs) at most {days(asked.total_hours)}"
                if spec.finetune.tasks else "")]
    lines.append(f"longest chain: {days(asked.chain_hours)}; {reach} segment(s) at once "
                 f"({reach * segment_gpus(spec)} GPUs) reach it (--set resources.max_concurrent=N shows another)")
    return lines
