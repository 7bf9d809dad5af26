"""Rebuild a sweep's damaged tables from its journals: `python -m raybiphase repair SPEC [--set k=v]`.

Give it the spec (and `--set`s) the sweep ran with. Damaged table parts and trial records are moved to
`<sweep>/damaged/`, every row the runs' histories, checkpoint metas and trial records hold is written back (rows
already present are kept as they are), summary.parquet is rewritten; what could not be rebuilt is said. Nothing
trains and Ray does not start; while a driver runs the sweep (it holds the sweep folder's lease), repair is
refused in one line.
"""

from raybiphase.commands import config_parser
from raybiphase.config import SweepSpec, load


def main() -> int:
    parser = config_parser("raybiphase repair", __doc__.splitlines()[0])
    args = parser.parse_args()
    spec = load(SweepSpec, args.config, args.overrides)
    from raybiphase.sweep.repair import repair  # lazy: --help answers before torch and the fan-out import

    repair(spec)
    return 0
