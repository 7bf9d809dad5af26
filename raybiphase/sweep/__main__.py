"""`python -m raybiphase.sweep SPEC`: kept for the README, the cluster configs and users' job scripts."""

from raybiphase.commands import run_main
from raybiphase.commands.sweep import main

run_main(main)
