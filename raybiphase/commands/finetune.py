"""`raybiphase finetune MODEL OUT [SPEC] [--set k=v] [--name N]`: fine-tune any encoder checkpoint in HF format
with the sweep's protocol (raybiphase.sweep.published)."""

from __future__ import annotations

import argparse

from raybiphase import storage
from raybiphase.config import SweepSpec, from_dict, load
from raybiphase.config.load import parse_override


def main() -> int:
    parser = argparse.ArgumentParser(prog="raybiphase finetune", description=__doc__.split("\n")[0])
    parser.add_argument("model", help="an encoder checkpoint in HF format: a folder, a bucket URI, or a Hub model id "
                        "(id or id@revision) of any encoder transformers' AutoModel loads")
    parser.add_argument("out", help="results folder or bucket URI (finetune.parquet, summary.parquet, report/)")
    parser.add_argument("config", nargs="?", default=None, help="optional spec for the finetune.* settings")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting, e.g. --set 'finetune.tasks=[sst2]' (repeatable)")
    parser.add_argument("--name", default=None, help="the run name in the rows (default: the model folder's name)")
    args = parser.parse_args()
    spec = (load(SweepSpec, args.config, args.overrides) if args.config
            else from_dict(SweepSpec, {}, dict(parse_override(o) for o in args.overrides)))
    from raybiphase.sweep.published import finetune_model  # lazy: --help answers before torch and Ray load

    rows = finetune_model(args.model, args.out, spec, args.name)
    print(f"fine-tuned {args.model}: {len(rows)} new trial(s) in "
          f"{storage.join(storage.absolute(args.out), storage.FINETUNE_FILE)}")
    return 0
