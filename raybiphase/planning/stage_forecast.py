"""What staging by model size (`sweep.stages: by_size`) is expected to save, before the sweep runs: the dry run's
line beside the full plan's GPU-hours, and the sizes of a plan in the order the gate opens them.

The sizes run smallest first; the two smallest always run whole, and a larger size's arms launch as its decision
says (raybiphase.results.stats.staging.stage_decision on the smaller sizes' rows at `sweep.decide_probability`),
read back from the sweep's `stages.parquet` once the gate (raybiphase.sweep.size_gate) recorded it. Before any rows
exist each arm of a predicted size counts with the prior `PRIOR_LAUNCH`. Pure: no Ray, no torch.
"""

from __future__ import annotations

import pandas as pd

from raybiphase import storage
from raybiphase.config import SweepSpec
from raybiphase.config.sizes import SIZES
from raybiphase.planning.cost import checkpoint_finetune_gpu_hours, gpu_hours_text, segment_gpu_hours
from raybiphase.planning.plan import Plan
from raybiphase.results import store
from raybiphase.results.stats.staging import stage_decision
from raybiphase.storage import SweepPaths

PRIOR_LAUNCH = 0.5
"""The dry run's prior, before the smaller sizes' rows exist: the chance each arm of a predicted size launches."""


def size_params(size: str) -> float:
    """A size's non-embedding parameters, the order its stage opens in (a size not in the table: last)."""
    return float(SIZES[size].non_embedding_params()) if size in SIZES else float("inf")


def plan_sizes(plan: Plan) -> dict[str, list[str]]:
    """Each model size of the plan, smallest first, with its runs in plan order."""
    out: dict[str, list[str]] = {}
    for run in plan.runs.values():
        out.setdefault(run.config.model.size, []).append(run.name)
    return dict(sorted(out.items(), key=lambda item: size_params(item[0])))


def recorded(paths: SweepPaths) -> dict[str, set[str]]:
    """The sizes already decided in the sweep's stages table: size -> the runs launched."""
    rows = store.read_rows(paths.table(storage.STAGES_FILE))
    if rows.empty:
        return {}
    return {size: set(group.loc[group["launched"].astype(bool), "run"]) for size, group in rows.groupby("size")}


def stage_lines(plan: Plan, spec: SweepSpec) -> list[str]:
    """The dry run's staging line (none unless sweep.stages is by_size): the full plan's GPU-hours beside the
    staged plan's expected ones (`staged_gpu_hours`)."""
    if spec.sweep.stages != "by_size":
        return []
    sizes = list(plan_sizes(plan))
    full, staged, known = staged_gpu_hours(plan, spec)
    basis = "; ".join(known) or (f"before any rows, each arm of {', '.join(sizes[2:])} launches with prior "
                                 f"probability {PRIOR_LAUNCH:g}")
    why = (f"{', '.join(sizes[:2])} always run; {basis}" if len(sizes) > 2 else
           f"{', '.join(sizes)}: every size runs whole, a prediction needs two smaller sizes")
    return [f"staging: by_size at decide_probability {spec.sweep.decide_probability:g}: the full plan "
            f"{gpu_hours_text(full)} GPU-hours (pretraining and fine-tuning, controls aside), staged "
            f"{gpu_hours_text(staged)} expected ({why})"]


def staged_gpu_hours(plan: Plan, spec: SweepSpec) -> tuple[float, float, list[str]]:
    """(the full plan's GPU-hours, the staged plan's expected ones, a phrase per size the records or rows decide).
    The two smallest sizes always run; a larger size's arms launch as the sweep's stages table or its rows decide
    where every smaller size has rows (`decide_size`'s rule), else each with the prior PRIOR_LAUNCH, independently;
    a segment or checkpoint costs its GPU-hours times the chance that one of its runs launches."""
    chance, known = _launch_chances(plan, spec, SweepPaths.of(spec.sweep.storage, spec.sweep.name), plan_sizes(plan))
    full = staged = 0.0
    for segment in plan.segments.values():
        cost = segment_gpu_hours(segment, spec)
        full, staged = full + cost, staged + cost * _any(chance[r] for r in segment.runs)
    grids = plan.grids(spec) if spec.finetune.tasks else {}
    for key, runs in (plan.checkpoints().items() if spec.finetune.tasks else ()):
        cost = checkpoint_finetune_gpu_hours(plan.runs[runs[0]].config.model.size, spec, grids[key])
        full, staged = full + cost, staged + cost * _any(chance[r] for r in runs)
    return full, staged, known


def _any(chances) -> float:
    """The chance at least one of independent launches happens."""
    none = 1.0
    for c in chances:
        none *= 1 - c
    return 1 - none


def _launch_chances(plan: Plan, spec: SweepSpec, paths: SweepPaths,
                    sizes: dict[str, list[str]]) -> tuple[dict[str, float], list[str]]:
    """Each run's chance of launching, and a phrase per size the records or rows decide."""
    chance = {run: 1.0 for run in plan.runs}
    recorded_sizes = recorded(paths) if storage.exists(paths.table(storage.STAGES_FILE)) else {}
    summary = _summary(paths)
    known = []
    for size, runs in list(sizes.items())[2:]:
        if size in recorded_sizes:
            launched, how = recorded_sizes[size], "recorded"
        elif summary is not None and set(list(sizes)[:list(sizes).index(size)]) <= set(summary["size"]):
            decision = stage_decision(summary, size, runs, spec.sweep.decide_probability)
            launched, how = set(decision.launch), f"from {', '.join(decision.based_on)}" if decision.based_on else ""
        else:
            launched, how = None, ""
        if launched is None or not how:
            chance.update({run: PRIOR_LAUNCH for run in runs})
            continue
        chance.update({run: float(run in launched) for run in runs})
        known.append(f"{size} {how}: {len(launched & set(runs))} of {len(runs)} run(s) launch")
    return chance, known


def _summary(paths: SweepPaths) -> pd.DataFrame | None:
    """The sweep folder's enriched summary, None without fine-tuning rows."""
    if not storage.exists(paths.table(storage.FINETUNE_FILE)):
        return None
    from raybiphase.results.report import enriched_summary  # lazy: only where rows exist

    summary = enriched_summary(paths.root)
    return summary if len(summary) else None
