"""Staging a sweep by model size: which of a size's arms to launch, given the finished smaller sizes' rows
(docs/statistics.md, "Staging by size"). This is the decision; the sweep's gate that applies it to segments and
records it is raybiphase.sweep.size_gate.

    decision = stage_decision(enriched_summary, "1b", plan_runs_at_1b, probability=0.9)
    decision.launch, decision.skipped

Pure pandas, no Ray. The smaller sizes predict every arm at the size (raybiphase.results.stats.prediction) and, for each
finding an effect at one size decides (1, 3's retrieval trend, 4, 5), the probability that its effect there lies
in the paper's direction, over the plan's arms at that size only. A finding is *decided* at `probability` p when
that chance is at least p or at most 1 - p. An arm serves the findings whose contrast compares it; it is skipped
only when it serves at least one and every finding it serves is decided. An arm no prediction covers (new at
the size, or on a task with no slope) serves nothing predicted and launches; so does every arm when fewer than
two smaller sizes have rows (`predict` needs two) or nothing can be predicted.

The rule's error rate: the chance is a one-sided predictive probability, so under the prediction's assumptions (a
line in ln parameters, arm offsets the same at every size) a finding is decided the wrong way (its true effect at
the size lying the other way) in at most 1 - p of studies, whatever the truth; tests/results/test_staging.py
measures it by simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from raybiphase.errors import UserError
from raybiphase.results.rows import OURS
from raybiphase.results.stats.prediction import Forecast, predict, run_at
from raybiphase.results.tables import Section, markdown


@dataclass(frozen=True)
class Skip:
    """An arm not launched at its size: why, and what it was predicted to score."""

    run: str
    """The plan's run name at the size."""
    findings: str
    """Each finding it serves with its chance: `1. MLM beats CLM on SC and QA 97%; ...`."""
    prediction: str
    """Its predicted score per task in points with the 95% interval: `sst2 81.20 [79.90, 82.50]; ...`."""


@dataclass(frozen=True)
class StageDecision:
    """One size's staging decision."""

    size: str
    launch: tuple[str, ...]
    """The plan's runs at the size that train."""
    skipped: tuple[Skip, ...]
    based_on: tuple[str, ...]
    """The smaller sizes whose rows decided it (empty: everything launches)."""
    reason: str
    """One sentence: what the decision rests on."""
    chances: tuple[tuple[str, float], ...] = ()
    """Each finding the plan's arms at the size compare, with its predicted chance there."""

    def records(self, probability: float) -> list[dict]:
        """One row per run at the size for the sweep's staging table (raybiphase.storage.STAGES_FILE)."""
        common = {"size": self.size, "based_on": ", ".join(self.based_on), "decide_probability": probability}
        skipped = [{**common, "run": s.run, "launched": False, "findings": s.findings, "prediction": s.prediction}
                   for s in self.skipped]
        return skipped + [{**common, "run": run, "launched": True, "findings": "", "prediction": ""}
                          for run in self.launch]


def decided(chance: float, probability: float) -> bool:
    """Whether a finding's chance at a size settles it at `probability`: at least p, or at most 1 - p."""
    return math.isfinite(chance) and (chance >= probability or chance <= 1 - probability)


def stage_decision(summary: pd.DataFrame, size: str, runs: list[str], probability: float) -> StageDecision:
    """Which of `runs` (the plan's run names at `size`) to launch, from the enriched summary of the smaller sizes'
    rows (module docstring)."""
    ours = summary[summary["source"] == OURS] if "source" in summary else summary
    try:
        forecast = predict(ours, size)
    except UserError as err:
        return StageDecision(size, tuple(runs), (), (), f"every arm launches: {err}")
    return decide(forecast, runs, probability)


def decide(forecast: Forecast, runs: list[str], probability: float,
           contrasts: list[tuple[str, np.ndarray]] | None = None) -> StageDecision:
    """`stage_decision` on a forecast at the size already made. `contrasts`: the findings' weights over the
    forecast of `runs` alone (`Forecast.contrasts`), when known: a simulation reuses them draw after draw."""
    size = forecast.size
    targets = {run: run_at(run, size) for run in runs}
    forecast = forecast.restricted(set(targets.values()))
    serves: dict[str, list[tuple[str, float]]] = {}
    served = forecast.served(contrasts)
    for claim, chance, cells in served:
        for target in set(cells):
            serves.setdefault(target, []).append((claim, chance))
    skipped = []
    for run, target in targets.items():
        findings = serves.get(target, [])
        if findings and all(decided(chance, probability) for _, chance in findings):
            skipped.append(Skip(run, "; ".join(f"{claim} {chance:.0%}" for claim, chance in findings),
                                _prediction(forecast.cells, target)))
    names = {s.run for s in skipped}
    reason = (f"from {', '.join(forecast.based_on)}: an arm is skipped when every finding it serves has a chance "
              f">= {probability:g} or <= {1 - probability:g} at {size}")
    return StageDecision(size, tuple(r for r in runs if r not in names), tuple(skipped), forecast.based_on, reason,
                         tuple((claim, chance) for claim, chance, _ in served))


def _prediction(cells: pd.DataFrame, target: str) -> str:
    mine = cells[cells["run"] == target].sort_values("task", kind="stable")
    return "; ".join(f"{task} {m:.2f} [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else f"{task} {m:.2f}"
                     for task, m, lo, hi in zip(mine["task"], mine["predicted"], mine["low"], mine["high"]))


def staged_section(stages: pd.DataFrame) -> Section | None:
    """The report's list of the arms a by_size sweep skipped, each with the findings it served and its prediction
    (the sweep's stages table); None when the sweep was not staged or skipped nothing."""
    if stages.empty or stages["launched"].astype(bool).all():
        return None
    skipped = stages[~stages["launched"].astype(bool)]
    table = skipped[["size", "run", "based_on", "findings", "prediction"]].rename(columns={
        "based_on": "predicted from", "findings": "findings it serves, each decided (chance in the paper's "
        "direction)", "prediction": "predicted score per task (%), 95% interval"})
    p = float(skipped["decide_probability"].iloc[0])
    note = (f"Staged by size (sweep.stages: by_size): these arms were not pretrained, each finding they serve "
            f"having a predicted chance of at least {p:g} or at most {1 - p:g} from the smaller sizes. Their "
            "findings at that size rest on the prediction, not on runs; the rule and its error rate: "
            "docs/statistics.md.")
    return Section("staging", "Arms not launched: decided by the smaller sizes", None, note,
                   markdown(table.sort_values(["size", "run"], kind="stable")))
