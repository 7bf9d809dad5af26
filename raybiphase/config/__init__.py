"""Configuration: the run config (what shapes a run's weights) apart from the sweep spec; strict YAML, --set, one dotted name per setting."""

from raybiphase.config.load import *  # noqa: F401,F403  (temporary, replaced below)
