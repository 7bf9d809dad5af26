"""Check a config or sweep spec without running anything: `python -m raybiphase validate CONFIG [--set k=v]`.

Prints the resolved settings as dotted names (the names overrides, Tune, Parquet and W&B use), or one error line.
"""

from raybiphase.cli import config_parser, run_main
from raybiphase.config import SweepSpec, flatten, load


def main() -> int:
    args = config_parser("raybiphase validate", __doc__.splitlines()[0]).parse_args()
    cfg = load(SweepSpec, args.config, args.overrides)
    for key, value in flatten(cfg).items():
        print(f"{key} = {value}")
    return 0


if __name__ == "__main__":
    run_main(main)
