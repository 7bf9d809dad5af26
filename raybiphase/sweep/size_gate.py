"""A sweep staged by model size (`sweep.stages: by_size`): the gate on which segments may start, the decisions it
records, and the dry run's lines on what staging is expected to save.

The sizes run smallest first. A size's segments start once every smaller size's launched segments are done and no
fine-tuning is left; at that moment the size's arms are decided once (raybiphase.results.stats.staging.stage_decision on
the smaller sizes' rows at `sweep.decide_probability`) and the decision is appended to the sweep's
`stages.parquet`, one row per run, never rewritten: a resumed sweep reads it back and decides the same. A segment
starts only if some run through it was launched. Pure: no Ray, no torch (the dry run imports it).
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from raybiphase import storage
from raybiphase.config import SweepSpec
from raybiphase.config.sizes import SIZES
from raybiphase.results import store
from raybiphase.results.stats.staging import StageDecision, stage_decision
from raybiphase.storage import SweepPaths
from raybiphase.sweep.cost import checkpoint_finetune_gpu_hours, gpu_hours_text, segment_gpu_hours
from raybiphase.sweep.plan import Plan, Segment
from raybiphase.telemetry.console import STDOUT, Console

STAGES_KEY = ("size", "run")
PRIOR_LAUNCH = 0.5
"""The dry run's prior, before the smaller sizes' rows exist: the chance each arm of a predicted size launches."""


def _params(size: str) -> float:
    return float(SIZES[size].non_embedding_params()) if size in SIZES else float("inf")


def plan_sizes(plan: Plan) -> dict[str, list[str]]:
    """Each model size of the plan, smallest first, with its runs in plan order."""
    out: dict[str, list[str]] = {}
    for run in plan.runs.values():
        out.setdefault(run.config.model.size, []).append(run.name)
    return dict(sorted(out.items(), key=lambda item: _params(item[0])))


def recorded(paths: SweepPaths) -> dict[str, set[str]]:
    """The sizes already decided in the sweep's stages table: size -> the runs launched."""
    rows = store.read_rows(paths.table(storage.STAGES_FILE))
    if rows.empty:
        return {}
    return {size: set(group.loc[group["launched"].astype(bool), "run"]) for size, group in rows.groupby("size")}


def decide_size(paths: SweepPaths, plan: Plan, size: str, probability: float) -> StageDecision:
    """A size's decision from the sweep folder's fine-tuning rows (every arm launches when fewer than two smaller
    sizes are planned, or no rows exist), appended to its stages table (a size already there keeps its rows)."""
    sizes = plan_sizes(plan)
    runs = sizes[size]
    smaller = [z for z in sizes if _params(z) < _params(size)]
    table = paths.table(storage.FINETUNE_FILE)
    if len(smaller) < 2 or not storage.exists(table):
        decision = StageDecision(size, tuple(runs), (), (), f"every arm launches: {len(smaller)} smaller size(s) "
                                                            "planned, two needed to predict")
    else:
        from raybiphase.results.report import enriched_summary  # lazy: the report's plotting stack

        decision = with_sources(stage_decision(enriched_summary(paths.root), size, runs, probability), plan)
    store.append_rows(paths.table(storage.STAGES_FILE), decision.records(probability), key=STAGES_KEY)
    return decision


def with_sources(decision: StageDecision, plan: Plan) -> StageDecision:
    """The decision with every run a launched run continues from (model.init_from '@NAME') launched too: a
    continued run cannot train without its source's weights."""
    launch, sources = set(decision.launch), list(decision.launch)
    while sources:
        source = plan.runs[sources.pop()].source
        if source is not None and source not in launch and plan.runs[source].config.model.size == decision.size:
            launch.add(source)
            sources.append(source)
    return dataclasses.replace(decision, launch=tuple(r for r in plan.runs if r in launch),
                               skipped=tuple(s for s in decision.skipped if s.run not in launch))


class SizeStages:
    """The by_size gate the scheduler asks before a segment whose dependencies are done starts (module docstring),
    telling it the segments `done` so far and whether any fine-tuning job is still running or failed
    (`finetuning_open`)."""

    def __init__(self, paths: SweepPaths, plan: Plan, probability: float, console: Console = STDOUT):
        self.paths, self.plan, self.probability, self.say = paths, plan, probability, console.say
        self.sizes = plan_sizes(plan)
        self.size_of = {s.id: plan.runs[s.runs[0]].config.model.size for s in plan.segments.values()}
        self.launched = recorded(paths)

    def ready(self, segment: Segment, done: set[str], finetuning_open: bool = False) -> bool:
        size = self.size_of[segment.id]
        return self.open(size, done, finetuning_open) and bool(self.launch(size) & set(segment.runs))

    def open(self, size: str, done: set[str], finetuning_open: bool = False) -> bool:
        """Decided already (a gate once open stays open), or every smaller size complete and, where there is one,
        no fine-tuning left."""
        if size in self.launched:
            return True
        smaller = [z for z in self.sizes if _params(z) < _params(size)]
        return all(self.complete(z, done, finetuning_open) for z in smaller) and not (smaller and finetuning_open)

    def complete(self, size: str, done: set[str], finetuning_open: bool = False) -> bool:
        launched = self.launch(size) if self.open(size, done, finetuning_open) else None
        return launched is not None and all(s.id in done for s in self.plan.segments.values()
                                            if self.size_of[s.id] == size and launched & set(s.runs))

    def launch(self, size: str) -> set[str]:
        """The size's launched runs: recorded, or decided now (only once its gate is open)."""
        if size not in self.launched:
            decision = decide_size(self.paths, self.plan, size, self.probability)
            self.launched[size] = set(decision.launch)
            skipped = "; ".join(f"{s.run} ({s.findings})" for s in decision.skipped)
            self.say(f"staging: {size}: {len(decision.launch)} of {len(self.sizes[size])} run(s) launch"
                     + (f", skipped: {skipped}" if skipped else "") + f" ({decision.reason})")
        return self.launched[size]


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
