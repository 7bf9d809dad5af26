"""`raybiphase prepare CONFIG [--set k=v]`: tokenize and pack the corpus of a config into Parquet shards
(raybiphase.data.prepare says how)."""

from __future__ import annotations

from raybiphase import storage
from raybiphase.commands import config_parser
from raybiphase.config import SweepSpec, load


def main() -> int:
    parser = config_parser("raybiphase prepare", "Tokenize and pack the corpus of a config into Parquet shards.")
    args = parser.parse_args()
    cfg = load(SweepSpec, args.config, args.overrides)
    from raybiphase.data import assets  # lazy: --help answers before Ray Data and the tokenizers load
    from raybiphase.data.prepare import prepare
    from raybiphase.finetune.heldout import check_held_out_tasks, evaluation_texts

    check_held_out_tasks(cfg.run.data)
    assets.use_mirror(storage.absolute(cfg.sweep.storage))
    prepare(cfg.run.data, storage_root=storage.absolute(cfg.sweep.storage), evaluation_texts=evaluation_texts)
    return 0
