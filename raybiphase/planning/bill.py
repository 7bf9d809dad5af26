"""The dry run's bill: what the plan's GPU-hours cost on demand and on spot capacity, and the checkpoint interval
that keeps a segment's expected overhead on spot lowest.

Spot capacity is cheaper and is taken back: with `sweep.preemptions_per_node_hour` = r, a segment on n nodes
loses one every 1 / (n r) hours on average (its mean time between failures, M). A loss costs the steps since the
last checkpoint (half an interval I, on average) and a restart R (`sweep.restart_minutes`: a replacement node, Ray
Train's restart, the restore, the compile); every checkpoint costs a stall C while its shards go to the bucket
(12 bytes per parameter at `sweep.checkpoint_gb_per_s`). The expected share of a segment's time lost is then

    overhead(I) = C / I + (I / 2 + R) / M

to first order, lowest at I* = sqrt(2 C M) (Young, 1974; Daly, 2006). A fine-tuning trial that loses its node
runs again from its start (it has no checkpoint): a trial of T hours loses T / 2 on average, r T times.

Every figure here is an estimate from the plan's GPU-hours (pretraining at sweep.mfu, fine-tuning at
sweep.finetune_mfu of sweep.gpu_peak_tflops) and the sweep's example prices and rates; the prices are not quotes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from raybiphase.config import SweepConfig, SweepSpec
from raybiphase.config.estimates import best_interval_hours, checkpoint_hours, mtbf_hours, segment_gpus, segment_nodes
from raybiphase.config.sizes import SIZES
from raybiphase.planning.cost import gpu_hours_text
from raybiphase.planning.plan import Plan, Segment
from raybiphase.planning.timeline import wall_hours


@dataclass(frozen=True)
class Interval:
    """A checkpoint interval and what it costs a segment, as shares of its time."""

    hours: float
    stall: float  # C / I
    rework: float  # (I / 2 + R) / M

    @property
    def overhead(self) -> float:
        return self.stall + self.rework


def overhead(interval_h: float, checkpoint_h: float, restart_h: float, mtbf_h: float) -> Interval:
    """overhead(I) of the module docstring for an interval of `interval_h` hours (M infinite: no preemption)."""
    rework = (interval_h / 2 + restart_h) / mtbf_h if math.isfinite(mtbf_h) else 0.0
    return Interval(interval_h, checkpoint_h / interval_h, rework)


def pretraining_rework(plan: Plan, spec: SweepSpec) -> float:
    """Expected GPU-hours spot adds to pretraining: each segment's preemptions (its wall hours / M), each costing
    half its checkpoint interval and a restart on every GPU it holds."""
    hours, mtbf, gpus = wall_hours(plan, spec), mtbf_hours(spec.run, spec.sweep), segment_gpus(spec.run)
    if not math.isfinite(mtbf):
        return 0.0
    restart = spec.sweep.restart_minutes / 60
    total = 0.0
    for segment in plan.segments.values():
        interval = min(segment.config.train.checkpoint_every, segment.steps) * hours[segment.id] / segment.steps
        total += hours[segment.id] / mtbf * (interval / 2 + restart) * gpus
    return total


def finetuning_rework(plan: Plan, spec: SweepSpec) -> float:
    """Expected GPU-hours spot adds to fine-tuning: a trial of T hours on g GPUs is preempted r T times and loses
    T / 2 each time, so the grid's F GPU-hours grow by F r T / 2 (T: the grid's average trial)."""
    trials = plan.finetune_trials(spec)
    if not trials:
        return 0.0
    gpu_hours = plan.finetune_gpu_hours(spec)
    trial_hours = gpu_hours / trials / (spec.finetune.gpus_per_trial or 1)
    return gpu_hours * spec.sweep.preemptions_per_node_hour * trial_hours / 2


def bill_lines(plan: Plan, spec: SweepSpec) -> list[str]:
    """The dry run's cost lines: pretraining and fine-tuning, on demand and on spot with the rework, then the
    checkpoint advice per model size. None for a sweep on CPUs (resources.gpus_per_worker 0): its GPU-hours are a
    stand-in, with no price."""
    sw = spec.sweep
    if not spec.run.resources.gpus_per_worker:
        return []
    pretraining, rework = plan.gpu_hours(spec), pretraining_rework(plan, spec)
    lines = [f"bill: pretraining {gpu_hours_text(pretraining)} GPU-hours: {_usd(pretraining * sw.gpu_hour_usd)} on "
             f"demand (${sw.gpu_hour_usd:.2f}/GPU-hour); on spot (${sw.spot_gpu_hour_usd:.2f}) "
             f"{_usd((pretraining + rework) * sw.spot_gpu_hour_usd)} with {gpu_hours_text(rework)} GPU-hours of "
             f"expected rework ({_share(rework, pretraining)} more wall-clock; {sw.preemptions_per_node_hour:g} "
             f"preemptions per node-hour, segments on {segment_nodes(spec.run, sw)} node(s), "
             f"{sw.restart_minutes:g}-minute restarts)"]
    if spec.finetune.tasks:
        finetuning, again = plan.finetune_gpu_hours(spec), finetuning_rework(plan, spec)
        lines.append(f"bill: fine-tuning at most {gpu_hours_text(finetuning)} GPU-hours: "
                     f"{_usd(finetuning * sw.gpu_hour_usd)} on demand; on spot "
                     f"{_usd((finetuning + again) * sw.spot_gpu_hour_usd)} with {gpu_hours_text(again)} GPU-hours of "
                     "expected rework (a preempted trial runs again from its start)")
    lines.append("bill: prices and rates are the spec's examples, not quotes (sweep.gpu_hour_usd, "
                 "sweep.spot_gpu_hour_usd, sweep.preemptions_per_node_hour)")
    return lines + checkpoint_lines(plan, spec)


def checkpoint_lines(plan: Plan, spec: SweepSpec) -> list[str]:
    """Per model size, smallest first, its longest segment's checkpoint interval: the stall, at the upload rate
    the spec gives (called assumed while it is the default, which no one measured for this cluster), the expected
    overhead on spot, and the interval (in steps) that minimises it."""
    hours, mtbf, restart = wall_hours(plan, spec), mtbf_hours(spec.run, spec.sweep), spec.sweep.restart_minutes / 60
    longest: dict[str, Segment] = {}
    for segment in plan.segments.values():
        size = segment.config.model.size
        if size not in longest or segment.steps > longest[size].steps:
            longest[size] = segment
    gb_per_s = spec.sweep.checkpoint_gb_per_s
    assumed = gb_per_s == SweepConfig.checkpoint_gb_per_s  # the default: nobody measured it for this cluster
    rate = f"{'an assumed ' if assumed else ''}{gb_per_s:g} GB/s (sweep.checkpoint_gb_per_s)"
    lines = []
    for size, segment in sorted(longest.items(), key=lambda item: list(SIZES).index(item[0])):  # smallest first
        step_h = hours[segment.id] / segment.steps
        every = segment.config.train.checkpoint_every
        stall = checkpoint_hours(segment.config, spec.sweep)
        now = overhead(every * step_h, stall, restart, mtbf)
        best_h = best_interval_hours(stall, mtbf)
        best_steps = min(round(best_h / step_h), segment.steps) if math.isfinite(best_h) else segment.steps
        best = overhead(max(1, best_steps) * step_h, stall, restart, mtbf)
        advice = (f"the interval that minimises it: {max(1, best_steps):,} steps ({_time(best.hours)}), "
                  f"{_pct(best.overhead)}" if best_steps < segment.steps
                  else f"it is lowest with one checkpoint at the segment's end ({segment.steps:,} steps), "
                       f"{_pct(best.overhead)}")
        auto = " (auto)" if spec.run.train.checkpoint_every == "auto" else ""
        lines.append(f"checkpoints ({size}): every {every:,} steps{auto} ({_time(every * step_h)}), each stalling "
                     f"{_time(stall)} at {rate}; expected overhead on spot {_pct(now.overhead)} (stalls "
                     f"{_pct(now.stall)}, rework {_pct(now.rework)}); {advice}")
    return lines


def _usd(amount: float) -> str:
    return f"${amount:,.0f}" if amount >= 10 else f"${amount:,.2f}"


def _share(part: float, whole: float) -> str:
    return _pct(part / whole) if whole else "0%"


def _pct(share: float) -> str:
    return f"{share:.1%}"


def _time(hours: float) -> str:
    seconds = hours * 3600
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{hours:.1f} h"
