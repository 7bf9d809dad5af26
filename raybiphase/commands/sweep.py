"""`raybiphase sweep SPEC [--set k=v] [--dry-run]` (or `python -m raybiphase.sweep SPEC`): plan and run a pretraining
+ fine-tuning sweep; the dry run prints the plan, the data budget, the distinct checkpoints and the GPU-hours.

RAYBIPHASE_STORAGE, when set, overrides sweep.storage (the KubeRay job uses it). One driver runs a sweep folder at a
time (raybiphase.sweep.lease): a second one exits with one line naming the holder; the dry run takes no lease.
"""

from __future__ import annotations

import os

from raybiphase.commands import config_parser
from raybiphase.config import SweepSpec, load


def main() -> int:
    parser = config_parser("raybiphase sweep", "Plan and run a pretraining + fine-tuning sweep.")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (tree, steps, GPU-hours) and exit")
    parser.add_argument("--json", action="store_true", help="with --dry-run: the plan as one JSON object (plan_json)")
    args = parser.parse_args()
    if args.json and not args.dry_run:
        parser.error("--json goes with --dry-run")
    overrides = list(args.overrides)
    if os.environ.get("RAYBIPHASE_STORAGE"):
        overrides.append(f"sweep.storage={os.environ['RAYBIPHASE_STORAGE']}")
    spec = load(SweepSpec, args.config, overrides)
    if args.dry_run:
        from raybiphase.planning.preflight import plan_sweep  # lazy: the dry run loads neither Ray nor the loop

        if args.json:
            import io
            import json

            from raybiphase.telemetry.console import Console

            spec, plan = plan_sweep(spec, dry_run=True, console=Console(io.StringIO()))
            print(json.dumps(plan_json(plan, spec)))
            return 0
        plan_sweep(spec, dry_run=True)
        return 0
    from raybiphase.storage import SweepPaths, check_reachable
    from raybiphase.sweep.lease import Lease

    # a bucket never reached is a wrong address or missing credentials, not an outage: said within seconds
    check_reachable(spec.sweep.storage, "sweep.storage")
    # another driver on the folder: said in a fraction of a second, not after the training stack loads
    Lease(SweepPaths.of(spec.sweep.storage, spec.sweep.name).lease, spec.sweep.lease_timeout_s).check_free()
    from raybiphase.sweep.driver import run_sweep  # lazy: --help and a bad spec answer before torch and Ray load

    run_sweep(spec, spec_path=" ".join([args.config, *(f"--set {o}" for o in overrides)]))
    return 0


def plan_json(plan, spec: SweepSpec) -> dict:
    """The dry run's plan for scripts: every run (its steps and segments), every segment (its steps and the runs
    it serves), the controls, naive and planned steps, the GPU-hour estimates and the fine-tuning trials."""
    return {
        "runs": {name: {"steps": run.steps, "segments": list(run.segments)} for name, run in plan.runs.items()},
        "segments": {sid: {"start": s.start, "end": s.end, "runs": list(s.runs)} for sid, s in plan.segments.items()},
        "controls": {name: list(control.runs) for name, control in plan.controls.items()},
        "steps": {"naive": sum(run.steps for run in plan.runs.values()), "planned": plan.planned_steps},
        "gpu_hours": {"pretraining_planned": plan.gpu_hours(spec), "pretraining_naive": plan.gpu_hours(spec, planned=False),
                      "finetuning": plan.finetune_gpu_hours(spec) if spec.finetune.tasks else 0.0},
        "finetune_trials": plan.finetune_trials(spec) if spec.finetune.tasks else 0,
        "checkpoints": len(plan.checkpoints()),
    }
