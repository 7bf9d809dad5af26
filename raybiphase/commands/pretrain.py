"""`raybiphase pretrain CONFIG [--set k=v] [--resume-from CKPT]`: pretrain one encoder on Ray Train.

Checkpoints go under <sweep.storage>/<sweep.name>/runs/<run name>/; running the same command again resumes from the
run's latest checkpoint, and a finished run is not recomputed.
"""

from __future__ import annotations

import os

from raybiphase.commands import config_parser
from raybiphase.config import SweepSpec, load


def main() -> int:
    parser = config_parser("raybiphase pretrain", "Pretrain one encoder on Ray Train.")
    parser.add_argument("--resume-from", help="checkpoint directory to continue from (same schedule)")
    parser.add_argument("--max-failures", type=int, default=int(os.environ.get("RAYBIPHASE_MAX_FAILURES", 2)))
    args = parser.parse_args()
    spec = load(SweepSpec, args.config, args.overrides)
    from raybiphase.pretrain.trainer import run_pretrain  # lazy: --help and a bad config answer before torch loads

    result = run_pretrain(spec, resume_from=args.resume_from, max_failures=args.max_failures)
    print(f"pretrain: done; final metrics {result.metrics}; "
          f"checkpoint {result.checkpoint.path if result.checkpoint else None}")
    return 0
