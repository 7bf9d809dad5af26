"""Pretraining replicates in the plan: arms pretrained more than once, and what the extra runs cost.

A replicate is the same run with another `train.seed`: another init and another data order, nothing else (its
name ends `-s1`, `-s2`...). Replicates share no segment with each other (the seed is part of every step's
identity), so each costs a whole run; the dry run says which arms have them and what they add, for pretraining
and fine-tuning alike, so that a user can weigh a finding's evidence against its price.
The spread the replicates show once they ran is the report's (raybiphase.results.replicate_spread).
"""

from __future__ import annotations

from raybiphase.config import SweepSpec, replace, run_hash
from raybiphase.planning.cost import checkpoint_finetune_gpu_hours, segment_gpu_hours


def replicate_arms(plan) -> dict[str, list[str]]:
    """The arms pretrained more than once: the first replicate's run name -> every replicate's, lowest seed first."""
    arms: dict[str, list] = {}
    for run in plan.runs.values():
        first = run.config if run.config.train.seed == 0 else replace(run.config, {"train.seed": 0})
        arms.setdefault(run_hash(first), []).append(run)
    return {runs[0].name: [r.name for r in runs] for runs in
            (sorted(group, key=lambda r: r.config.train.seed) for group in arms.values()) if len(runs) > 1}


def extra_runs(plan) -> set[str]:
    """The runs beyond the first (lowest-seed) replicate of each arm."""
    return {name for names in replicate_arms(plan).values() for name in names[1:]}


def replicate_lines(plan, spec: SweepSpec) -> list[str]:
    """The dry run's replicates line: which arms, how many runs, and the GPU-hours their extra runs add (counted in
    the totals above): pretraining segments that only extra replicates pass through, and the fine-tuning of the
    checkpoints and controls that only they have."""
    arms = replicate_arms(plan)
    if not arms:
        return []
    extra = extra_runs(plan)
    only_extra = lambda names: set(names) <= extra  # noqa: E731
    pretraining = sum(segment_gpu_hours(segment, spec) for segment in plan.segments.values()
                      if only_extra(r.name for r in plan.runs.values() if segment.id in r.segments))
    checkpoints, grids = plan.checkpoints(), plan.grids(spec)
    sized = [(plan.runs[runs[0]].config.model.size, grids[key]) for key, runs in checkpoints.items()
             if only_extra(runs)]
    sized += [(c.config.model.size, None) for c in plan.controls.values() if only_extra(c.runs)]
    finetuning = sum(checkpoint_finetune_gpu_hours(size, spec, grid) for size, grid in sized)  # 0 with no tasks
    seeds = sorted({plan.runs[n].config.train.seed for names in arms.values() for n in names})
    return [f"replicates: {len(arms)} arm(s) pretrained {max(map(len, arms.values()))} times at most (train.seed "
            f"{', '.join(map(str, seeds))}: init and data order): {', '.join(arms)}; the {len(extra)} extra run(s) "
            f"add {pretraining:,.0f} GPU-hours of pretraining and at most {finetuning:,.1f} of fine-tuning "
            f"(in the totals above)"]
