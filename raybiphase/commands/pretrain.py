"""`raybiphase pretrain CONFIG [--set k=v] [--resume-from CKPT]`: pretrain one encoder on Ray Train.

Checkpoints go under <sweep.storage>/<sweep.name>/runs/<run name>/; running the same command again resumes from the
run's latest checkpoint, and a finished run is not recomputed. Its fit's restarts are the failure policy's
`command_restarts` (docs/failures.md): --max-failures, else RAYBIPHASE_MAX_FAILURES, else 2.
"""

from __future__ import annotations

from raybiphase.commands import config_parser
from raybiphase.config import SweepSpec, load
from raybiphase.failures import MAX_FAILURES_ENV, FailurePolicy


def main() -> int:
    parser = config_parser("raybiphase pretrain", "Pretrain one encoder on Ray Train.")
    parser.add_argument("--resume-from", help="checkpoint directory to continue from (same schedule)")
    parser.add_argument("--max-failures", type=int, help="restarts of a failed worker group (-1: no limit; default: "
                        f"{MAX_FAILURES_ENV}, else {FailurePolicy().command_restarts})")
    args = parser.parse_args()
    policy = FailurePolicy.for_command(args.max_failures)
    spec = load(SweepSpec, args.config, args.overrides)
    from raybiphase.finetune.heldout import check_held_out_tasks, evaluation_texts
    from raybiphase.pretrain.trainer import run_pretrain  # lazy: --help and a bad config answer before torch loads

    check_held_out_tasks(spec.run.data)
    result = run_pretrain(spec, resume_from=args.resume_from, max_failures=policy.command_restarts,
                          evaluation_texts=evaluation_texts)
    print(f"pretrain: done; final metrics {result.metrics}; "
          f"checkpoint {result.checkpoint.path if result.checkpoint else None}")
    return 0
