"""Configuration: the run config (what shapes a run's weights) apart from the sweep spec; strict YAML, --set, one
dotted name per setting."""

from raybiphase.config.identity import run_hash, weights_settings
from raybiphase.config.load import ConfigError, flatten, from_dict, load, replace, to_dict
from raybiphase.config.run import (
    MASKED,
    DataConfig,
    ModelConfig,
    OptimConfig,
    Phase,
    PhasesConfig,
    ResourcesConfig,
    RunConfig,
    TrainConfig,
)
from raybiphase.config.sweep import ExportGrid, FinetuneConfig, FinetuneGrid, SweepConfig, SweepSpec, shapes_weights

__all__ = [
    "MASKED", "ConfigError", "DataConfig", "ExportGrid", "FinetuneConfig", "FinetuneGrid", "ModelConfig",
    "OptimConfig", "Phase", "PhasesConfig", "ResourcesConfig", "RunConfig", "SweepConfig", "SweepSpec", "TrainConfig",
    "flatten", "from_dict", "load", "replace", "run_hash", "shapes_weights", "to_dict", "weights_settings",
]
