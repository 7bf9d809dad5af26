"""Shared command-line plumbing: a config file plus `--set dotted.key=value`, and one-line errors.

Each module of this package is named for the command it parses (`raybiphase report` is report.py), so a few share
a name with the library module behind that command: results/report.py, data/prepare.py, data/assets.py,
pretrain/export.py and sweep/repair.py do what the command of their name asks, config/sweep.py is the spec the
`sweep` command runs, and config/docs.py is every setting's text, which `docs` renders into the settings page.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from raybiphase.errors import ConfigError, UserError


def config_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A command that takes a config: its `--help` lists every setting by dotted name, default and docstring."""
    from raybiphase.config import SweepSpec
    from raybiphase.config.docs import settings_help

    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=settings_help(SweepSpec),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="YAML config or sweep spec")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting by its dotted name, e.g. --set phases.mask_ratio=0.3 (repeatable)",
    )
    return parser


def run_main(main: Callable[[], int | None]) -> None:
    """Call main(); user errors (config, data, assets) become one line on stderr and exit code 2."""
    try:
        code = main()
    except (ConfigError, UserError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # the output was piped into `head` and the reader left: not an error
        sys.stdout = None
        sys.exit(0)
    sys.exit(code or 0)
