"""`raybiphase predict RESULTS_DIR --size SIZE [--json]`: every arm's score at a larger size, from the smaller ones.

Per task, a line in ln(parameters) with an offset per arm, fitted on the smaller sizes' rows; each score with a 95%
prediction interval, and each finding's chance of lying in the paper's direction there (docs/statistics.md).
"""

from __future__ import annotations

import argparse
import json

from raybiphase.config.sizes import SIZE_NAMES
from raybiphase.errors import UserError
from raybiphase.storage import FINETUNE_FILE, check_reachable, join


def main() -> int:
    parser = argparse.ArgumentParser(prog="raybiphase predict", description=__doc__.split("\n")[0])
    parser.add_argument("results_dir", help="a sweep's results folder or bucket URI, or one `raybiphase import` made")
    parser.add_argument("--size", required=True, help=f"the model size to predict: one of {', '.join(SIZE_NAMES)}")
    parser.add_argument("--json", action="store_true", help="a JSON list on stdout: run, task, predicted, low, high "
                                                            "on the summary's scale (fractions)")
    args = parser.parse_args()
    from raybiphase.results.report import enriched_summary
    from raybiphase.results.stats.prediction import parameters, predict  # lazy: --help answers before pandas loads
    from raybiphase.results.tables import markdown

    parameters(args.size)  # an unknown size: one line before anything is read
    check_reachable(args.results_dir, "results_dir")
    summary = enriched_summary(args.results_dir)
    if summary.empty:
        raise UserError(f"{args.results_dir}: no fine-tuning rows ({join(args.results_dir, FINETUNE_FILE)})")
    forecast = predict(summary, args.size)
    if args.json:
        print(json.dumps(forecast.records(), indent=1))
        return 0
    print(f"Predicted at {args.size} from {', '.join(forecast.based_on)} (test metric x 100, 95% prediction "
          f"interval of one run's score). {forecast.regime}\n")
    print(markdown(forecast.table()))
    chances = forecast.chances_table()
    if len(chances):
        print(f"\nThe findings at {args.size}: the chance each effect lies in the paper's direction\n")
        print(markdown(chances))
    return 0
