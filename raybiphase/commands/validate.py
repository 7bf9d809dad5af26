"""Check a config or sweep spec without running anything: `python -m raybiphase validate CONFIG [--set k=v]`.

Prints the resolved settings as dotted names (the names overrides, Tune, Parquet and W&B use), or one error line:
the base run's settings, and every run that sweep.grid and sweep.runs make from it. `--json`: one JSON object,
{"settings": {dotted name: value}, "runs": [run name, ...]}, for scripts.
"""

import json

from raybiphase.commands import config_parser
from raybiphase.config import SweepSpec, flatten, load


def main() -> int:
    parser = config_parser("raybiphase validate", __doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object: the settings and the runs")
    args = parser.parse_args()
    cfg = load(SweepSpec, args.config, args.overrides)
    from raybiphase.finetune.tasks import get_task  # lazy: --help answers before the task loaders import
    from raybiphase.planning.plan import make_plan

    for task in cfg.finetune.tasks:
        get_task(task)
    plan = make_plan(cfg)  # every run of sweep.grid and sweep.runs, checked as the sweep would build it
    if args.json:
        print(json.dumps({"settings": flatten(cfg), "runs": list(plan.runs)}, default=list))
        return 0
    for key, value in flatten(cfg).items():
        print(f"{key} = {value}")
    return 0
