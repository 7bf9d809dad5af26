"""`raybiphase report RESULTS_DIR [--wandb ENTITY/PROJECT] [--wandb-project P] [--unmeasured-sd X]`: draw the
report (the paper's comparisons, tables, figures) from a results folder."""

from __future__ import annotations

import argparse

from raybiphase.config.sweep import UNMEASURED_SD, check_unmeasured_sd
from raybiphase.storage import basename, check_reachable


def main() -> int:
    parser = argparse.ArgumentParser(prog="raybiphase report", description=" ".join(__doc__.split()))
    parser.add_argument("results_dir", help="a sweep's results folder or bucket URI (pretrain.parquet, finetune.parquet)")
    parser.add_argument("--wandb-project", default=None, help="also upload the tables and figures to this project")
    parser.add_argument("--wandb", default=None, metavar="ENTITY/PROJECT",
                        help="also upload the tables and figures to ENTITY/PROJECT and save a W&B Report there, "
                             "its panels over the sweep's W&B runs (needs `wandb login` and the `wandb` extra)")
    parser.add_argument("--unmeasured-sd", type=float, default=None, metavar="X",
                        help="the findings' SD factor for a model size and objective no replicated arm measures (at "
                             "least 1; default: the sweep.unmeasured_sd the sweep recorded in its sweep.json, else "
                             f"{UNMEASURED_SD:g})")
    args = parser.parse_args()
    if args.unmeasured_sd is not None:
        check_unmeasured_sd(args.unmeasured_sd, "--unmeasured-sd")
    from raybiphase.results.report import write_report  # lazy: --help answers before pandas and plotting load

    check_reachable(args.results_dir, "results_dir")  # a bucket out of reach: one line now, not retried reads
    if args.wandb:
        from raybiphase.results import wandb_report

        entity, project = wandb_report.parse_target(args.wandb)
        wandb_report.check_wandb(entity)  # no key, or the server out of reach: one line before anything is drawn
    path, sections = write_report(args.results_dir, args.unmeasured_sd)
    print(f"wrote {path}")
    sweep = basename(args.results_dir)
    from raybiphase.results.wandb_upload import log_report

    if args.wandb_project:
        log_report(args.results_dir, args.wandb_project, sweep)
    if args.wandb:
        log_report(args.results_dir, project, sweep, entity=entity)
        url = wandb_report.publish(sections, entity=entity, project=project, sweep=sweep, title=f"Results: {sweep}")
        print(f"W&B report: {url}")
    return 0
