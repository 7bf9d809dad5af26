"""`python -m raybiphase.sweep SPEC`: kept for the README, the cluster configs and users' job scripts."""

from raybiphase.cli import run_main
from raybiphase.sweep.driver import main

run_main(main)
