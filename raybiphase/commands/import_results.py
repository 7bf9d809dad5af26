"""`raybiphase import TREE RESULTS_DIR [--sweep paper]`: import evaluation-result trees (the authors' published raw
results) into finetune.parquet with source="paper" (raybiphase.results.importer reads the layout)."""

from __future__ import annotations

import argparse

from raybiphase import storage


def main() -> int:
    parser = argparse.ArgumentParser(prog="raybiphase import", description=__doc__.split("\n")[0])
    parser.add_argument("tree", help="folder or bucket URI holding <model>/<family>/<dataset>/lr<LR>_sd<SEED>/results.json files")
    parser.add_argument("results_dir", help="results folder of a sweep (finetune.parquet goes there)")
    parser.add_argument("--sweep", default="paper", help="value of the sweep column (default: paper)")
    args = parser.parse_args()
    from raybiphase.results.importer import import_tree  # lazy: --help answers before pandas loads

    added, skipped = import_tree(args.tree, args.results_dir, args.sweep)
    print(f"imported {added} trials into {storage.join(args.results_dir, storage.FINETUNE_FILE)} "
          f"({skipped} already there)")
    return 0
