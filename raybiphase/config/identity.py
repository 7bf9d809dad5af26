"""A run's identity: the settings that shape its weights, and the hash its name ends with.

Settings that never change a run's weights carry `metadata=NOT_WEIGHTS` on their field (raybiphase.config.run);
`weights_settings` leaves them out, and a run's identity (its name's hash, the planner's shared segments) is built
from it alone.

    run_hash(run)                                         # 'a1b2c3', unchanged by train.eval_every
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from raybiphase.config.load import to_dict
from raybiphase.config.run import RUN_SECTIONS, DataConfig, Phase, RunConfig

DECONTAMINATION_FIELDS = ("decontaminate", "decontam_ngram", "decontam_tasks")
"""The data settings that enter a run's identity and the shards' fingerprint only as `DataConfig.decontamination`
states them."""


def _shaping(section: Any) -> dict[str, Any]:
    plain = to_dict(section)
    return {f.name: plain[f.name] for f in dataclasses.fields(section) if f.metadata.get("weights", True)}


def _data_settings(data: DataConfig) -> dict[str, Any]:
    """The data section as it enters the run's identity: decontamination as `DataConfig.decontamination` states
    it (the held-out tasks as a set), and only when it holds something out."""
    plain = {k: v for k, v in _shaping(data).items() if k not in DECONTAMINATION_FIELDS
             and not (k == "hf_revision" and v is None)}  # unpinned runs keep the names they had before it
    held_out = data.decontamination()
    return {**plain, "decontamination": held_out} if held_out else plain


def _phase_settings(phase: Phase) -> dict[str, Any]:
    """A phase as it enters the run's identity; the masking and optimizer knobs only when set, so the runs that use
    none keep the names they had before the knobs existed."""
    plain = {f.name: getattr(phase, f.name) for f in dataclasses.fields(phase)}  # asdict: a phase's values are flat
    unset = {"mask_ratio_end": None, "mask_ratio_range": None, "optimizer": "carry", "rewarmup_steps": None,
             "frozen_layers": ()}
    return {k: v for k, v in plain.items() if k not in unset or v != unset[k]}


def weights_settings(run: RunConfig) -> dict[str, Any]:
    """The settings that shape the run's weights, by section: every field not marked NOT_WEIGHTS, with the phases
    resolved (the two-phase shorthand and the explicit plan of the same phases are the same run)."""
    out = {name: _shaping(getattr(run, name)) for name in RUN_SECTIONS}
    out["data"] = _data_settings(run.data)
    out["phases"] = {"plan": [_phase_settings(p) for p in run.phases.resolved()],
                     "mask_prob": run.phases.mask_prob, "random_prob": run.phases.random_prob}
    return {name: section for name, section in out.items() if section}


def digest(settings: dict[str, Any], length: int) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:length]


def run_hash(run: RunConfig) -> str:
    """Six hex digits of `weights_settings`: the suffix of the run's name (raybiphase.naming)."""
    return digest(weights_settings(run), 6)
