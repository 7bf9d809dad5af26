"""A sweep staged by model size (`sweep.stages: by_size`): the gate on which segments may start and the decisions
it records (what staging is expected to save, before the sweep runs: raybiphase.planning.stage_forecast).

The sizes run smallest first. A size's segments start once every smaller size's launched segments are done and no
fine-tuning is left; at that moment the size's arms are decided once (raybiphase.results.stats.staging.stage_decision on
the smaller sizes' rows at `sweep.decide_probability`) and the decision is appended to the sweep's
`stages.parquet`, one row per run, never rewritten: a resumed sweep reads it back and decides the same. A segment
starts only if some run through it was launched. Pure: no Ray, no torch.
"""

from __future__ import annotations

import dataclasses

from raybiphase import storage
from raybiphase.planning.plan import Plan, Segment
from raybiphase.planning.stage_forecast import plan_sizes, recorded, size_params
from raybiphase.results import store
from raybiphase.results.stats.staging import StageDecision, stage_decision
from raybiphase.storage import SweepPaths
from raybiphase.telemetry.console import STDOUT, Console

STAGES_KEY = ("size", "run")


def decide_size(paths: SweepPaths, plan: Plan, size: str, probability: float) -> StageDecision:
    """A size's decision from the sweep folder's fine-tuning rows (every arm launches when fewer than two smaller
    sizes are planned, or no rows exist), appended to its stages table (a size already there keeps its rows)."""
    sizes = plan_sizes(plan)
    runs = sizes[size]
    smaller = [z for z in sizes if size_params(z) < size_params(size)]
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
        smaller = [z for z in self.sizes if size_params(z) < size_params(size)]
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
