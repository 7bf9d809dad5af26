"""`raybiphase report RESULTS_DIR [--wandb-project P]`: draw the report (the paper's comparisons, tables, figures)
from a results folder."""

from __future__ import annotations

import argparse

from raybiphase.storage import basename, check_reachable


def main() -> int:
    parser = argparse.ArgumentParser(prog="raybiphase report", description=__doc__.split("\n")[0])
    parser.add_argument("results_dir", help="a sweep's results folder or bucket URI (pretrain.parquet, finetune.parquet)")
    parser.add_argument("--wandb-project", default=None, help="also upload the tables and figures to this project")
    args = parser.parse_args()
    from raybiphase.results.report import write_report  # lazy: --help answers before pandas and plotting load

    check_reachable(args.results_dir, "results_dir")  # a bucket out of reach: one line now, not retried reads
    path, _ = write_report(args.results_dir)
    print(f"wrote {path}")
    if args.wandb_project:
        from raybiphase.results.wandb import log_report

        log_report(args.results_dir, args.wandb_project, basename(args.results_dir))
    return 0
