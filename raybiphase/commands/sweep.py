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
    args = parser.parse_args()
    overrides = list(args.overrides)
    if os.environ.get("RAYBIPHASE_STORAGE"):
        overrides.append(f"sweep.storage={os.environ['RAYBIPHASE_STORAGE']}")
    spec = load(SweepSpec, args.config, overrides)
    if args.dry_run:
        from raybiphase.sweep.preflight import plan_sweep  # lazy: the dry run loads neither Ray nor the loop

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
