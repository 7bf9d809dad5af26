"""The dry run's power lines: per finding and model size, the smallest true effect the planned runs, seeds and
replicates resolve (raybiphase.results.stats.power: 5% two-sided, Holm over the finding's sizes, 80% power).

Each finding's design comes from the plan's final checkpoints as the report will match them (docs/statistics.md):
finding 1 pairs every MLM arm from scratch with the CLM arm of its size and budget on the SC and QA tasks; finding 4
every CLM-then-MLM split with the MLM arm of its size, budget and ratio; finding 5 each run continued from a CLM
checkpoint with the one of its length continued from an MLM checkpoint; an arm's replicates (train.seed) count as
its runs. Findings 2 (curves, LR spreads) and 3 (slopes) are not priced here. The noise is measured where the
sweep's summary.parquet has replicated rows, else `power.ASSUMED` (with its part shared by a run's tasks), and
the line says which. As the report does (raybiphase.results.stats.noise.Strata), each (size, objective) stratum's
noise is measured by its replicated arms, with their degrees of freedom (runs - 1, summed); an arm of a stratum
without one counts sweep.unmeasured_sd^2 times the variance, and a size with no replicated arm at all is not
decided.
"""

from __future__ import annotations

import pandas as pd

from raybiphase import storage
from raybiphase.config import SweepSpec
from raybiphase.finetune.tasks import get_task
from raybiphase.planning.replicate_cost import extra_runs, replicate_arms
from raybiphase.results.stats.effects import pair_contrast
from raybiphase.results.stats.findings import Study
from raybiphase.results.stats.power import ASSUMED, NoiseModel, detected, effect_se, mde, measured_noise
from raybiphase.results.store import read_table

OBJECTIVE = {"clm": "CLM", "mlm": "MLM", "split": "CLM→MLM", "from-clm": "continued", "from-mlm": "continued"}
"""A planned arm's kind as the report's objective, the stratum its noise is measured in."""
EFFECT = 2.0
"""The true effect (points) whose chance of being found each power line states."""
FINDINGS = ("1. MLM beats CLM on SC and QA", "4. CLM then MLM beats MLM only", "5. Continued MLM from CLM beats "
            "continued MLM from MLM")


def _kind(plan, run) -> str:
    objectives = [p.objective for p in run.config.phases.resolved()]
    if run.source is not None:
        first = [p.objective for p in plan.runs[run.source].config.phases.resolved()]
        return "from-clm" if first == ["clm"] else "from-mlm"
    return {("clm",): "clm", ("mlm",): "mlm"}.get(tuple(objectives), "split")


def designs(plan, spec: SweepSpec) -> dict[str, dict[str, tuple[pd.DataFrame, dict[str, int]]]]:
    """finding -> size -> (its matched pairs: task, arm_a, arm_b; each arm's runs), from the plan's final
    checkpoints (one arm per replicate group, named by its first run)."""
    runs_of = {first: len(names) for first, names in replicate_arms(plan).items()}
    extra = extra_runs(plan)
    arms = [r for r in plan.runs.values() if r.name not in extra]
    tasks = list(spec.finetune.tasks)
    sc_qa = [t for t in tasks if get_task(t).family in ("SC", "QA")]
    rules = {FINDINGS[0]: ("mlm", "clm", sc_qa, lambda r: (r.steps,)),
             FINDINGS[1]: ("split", "mlm", tasks, lambda r: (r.steps, r.config.phases.mask_ratio)),
             FINDINGS[2]: ("from-clm", "from-mlm", tasks, lambda r: (r.steps, r.config.phases.mask_ratio))}
    out: dict[str, dict] = {}
    for finding, (side_a, side_b, on, key) in rules.items():
        for size in sorted({r.config.model.size for r in arms}):
            here = [r for r in arms if r.config.model.size == size]
            pairs = [(task, a.name, b.name) for a in here if _kind(plan, a) == side_a
                     for b in here if _kind(plan, b) == side_b and key(a) == key(b) for task in on]
            if pairs:
                frame = pd.DataFrame(pairs, columns=["task", "arm_a", "arm_b"])
                out.setdefault(finding, {})[size] = (frame, {r.name: runs_of.get(r.name, 1) for r in here})
    return out


def strata_df(plan) -> dict[tuple[str, str], int]:
    """(size, objective) -> the degrees of freedom its replicated arms give (runs - 1, summed; 0: unmeasured)."""
    out: dict[tuple[str, str], int] = {}
    for first, names in replicate_arms(plan).items():
        run = plan.runs[first]
        key = (run.config.model.size, OBJECTIVE[_kind(plan, run)])
        out[key] = out.get(key, 0) + len(names) - 1
    return out


def _judged(plan, pairs: pd.DataFrame, runs: dict[str, int], df: dict, unmeasured_sd: float
            ) -> tuple[dict[str, float], float] | None:
    """(each arm's runs, an unmeasured arm's counted as 1 / unmeasured_sd^2 of a run; the test's degrees of
    freedom) as the report will judge the pairs; None when no stratum of the plan is measured."""
    measured = [d for d in df.values() if d > 0]
    if not measured:
        return None
    arms = {*pairs["arm_a"], *pairs["arm_b"]}
    strata = {arm: (plan.runs[arm].config.model.size, OBJECTIVE[_kind(plan, plan.runs[arm])]) for arm in arms}
    effective = {arm: runs[arm] / (1.0 if df.get(strata[arm], 0) else unmeasured_sd**2) for arm in arms}
    dfs = [df[key] for key in set(strata.values()) if df.get(key, 0)] or [min(measured)]
    return effective, float(min(dfs))


def sweep_noise(spec: SweepSpec) -> NoiseModel:
    """The noise measured on the sweep's own rows (its summary.parquet, replicated arms), else ASSUMED."""
    path = storage.join(storage.absolute(spec.sweep.storage), spec.sweep.name, storage.SUMMARY_FILE)
    if not storage.exists(path):
        return ASSUMED
    study = Study(pd.DataFrame(read_table(path)))
    return measured_noise(study.cells, study.noise["score"]) or ASSUMED


def power_lines(plan, spec: SweepSpec) -> list[str]:
    """One line on the noise, then one per finding the plan can decide: its MDE at each size."""
    found = designs(plan, spec) if spec.finetune.tasks else {}
    if not found:
        return []
    noise, seeds, df = sweep_noise(spec), len(spec.finetune.seeds), strata_df(plan)
    lines = [f"power: the smallest true effect found 80% of the time at 5% two-sided (Holm over a finding's sizes), "
             f"and the chance a +{EFFECT:g}-point effect is, {noise.source}: fine-tuning seed SD "
             f"{noise.seed_sd:.2f} pts, pretraining-run SD {noise.pretrain_sd:.2f} pts of which "
             f"{noise.shared:.0%} of the variance is shared by a run's tasks (raybiphase.results.stats.power), "
             f"{seeds} seed(s), an unreplicated size and objective at {spec.sweep.unmeasured_sd:g}x the noisiest "
             f"measured one's SD (sweep.unmeasured_sd)"]
    for finding, by_size in found.items():
        parts = []
        for size, (pairs, runs) in by_size.items():
            judged = _judged(plan, pairs, runs, df, spec.sweep.unmeasured_sd)
            count = len(pairs[["arm_a", "arm_b"]].drop_duplicates())
            if judged is None:
                parts.append(f"{size} not decided: no replicated arm ({count} pair(s))")
                continue
            effective, dof = judged
            se = effect_se(pair_contrast(pairs), seeds=seeds, runs=effective, noise=noise)
            most = max(runs[a] for a in effective)
            replicated = f", up to {most} runs an arm" if most > 1 else ""
            widened = ", unreplicated strata widened" if any(effective[a] < runs[a] for a in effective) else ""
            chance = detected(EFFECT, se, tests=len(by_size), df=dof)
            parts.append(f"{size} {mde(se, tests=len(by_size), df=dof):.2f} pts, +{EFFECT:g} found in "
                         f"{chance:.0%} ({count} pair(s), {pairs['task'].nunique()} task(s){replicated}, "
                         f"{dof:g} df{widened})")
        lines.append(f"power: {finding}: {'; '.join(parts)}")
    return lines
