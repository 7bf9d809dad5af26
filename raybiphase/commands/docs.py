"""`raybiphase docs [--check]`: write the reference pages under docs/ from the code (settings, results columns,
benchmark records); `--check` writes nothing and exits 1 naming the first page that differs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(prog="raybiphase docs", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 if a page differs")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose docs/ to write (default: this one)")
    args = parser.parse_args()
    from raybiphase.commands.example_report import write_figures  # lazy: --help answers before plotting loads
    from raybiphase.commands.pages import REGENERATE, first_stale, pages  # lazy: --help answers before pandas loads

    if args.check:
        stale = first_stale(args.root)
        if stale:
            print(f"{stale} differs from what the code renders; run `{REGENERATE}`", file=sys.stderr)
            return 1
        print("docs agree with the code")
        return 0
    changed = False
    for name, text in pages(args.root).items():
        path = args.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        changed |= name.endswith("/report.md") and (not path.exists() or path.read_text() != text)
        path.write_text(text)
        print(f"wrote {name}")
    for name in write_figures(args.root, changed=changed):
        print(f"wrote {name}")
    return 0
