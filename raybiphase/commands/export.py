"""`raybiphase export CHECKPOINT OUT`: export a checkpoint (any step) as an HF folder with its model card.

The card holds the run's settings, its data and, when the sweep fine-tuned it, its scores; `--push-to-hub` also
uploads the folder.
"""

from __future__ import annotations

import argparse


def main() -> int:
    parser = argparse.ArgumentParser(prog="raybiphase export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a raybiphase checkpoint folder (.../runs/<run>/step-N), local or s3://")
    parser.add_argument("out", help="the folder (or bucket URI) to write; must not exist or be empty")
    parser.add_argument("--name", help="the model's name on its card (default: the run's name in the sweep)")
    parser.add_argument("--push-to-hub", metavar="REPO", help="also upload to this Hub repository (user/name)")
    parser.add_argument("--private", action="store_true", help="create the Hub repository private")
    args = parser.parse_args()
    from raybiphase.pretrain.export import export_checkpoint  # lazy: --help answers before torch loads

    export_checkpoint(args.checkpoint, args.out, name=args.name, push=args.push_to_hub, private=args.private)
    return 0
