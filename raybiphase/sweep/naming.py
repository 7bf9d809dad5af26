"""Run names in the paper's scheme plus a short hash of the full config (../shared/paper.md).

    610m-clm-42k                 CLM only, 42k steps
    610m-mlm40-42k               MLM at 40%, 42k steps
    610m-clm-10k-mlm40-42k       10k CLM steps, then MLM 40% up to 42k in total
    610m-clm-dec42k-mlm40-64k    continued from a decayed 42k CLM checkpoint with 22k MLM steps (64k in total)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from raybiphase.config import Config, to_dict


def steps_label(steps: int) -> str:
    """42000 -> '42k', 5500 -> '5.5k', 100 -> '100'."""
    if steps >= 1000 and steps % 100 == 0:
        return f"{steps / 1000:g}k"
    return str(steps)


def config_hash(cfg: Config) -> str:
    data = to_dict(cfg)
    data.pop("sweep")  # where results go does not change the run
    data.pop("finetune")
    data.pop("resources")  # nor does the worker count (the batch is global)
    data["phases"] = {  # the shorthand and the explicit plan of the same phases are the same run
        "plan": [dataclasses.asdict(p) for p in cfg.phases.resolved()],
        "mask_prob": cfg.phases.mask_prob,
        "random_prob": cfg.phases.random_prob,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:6]


def run_name(cfg: Config, *, source_label: str | None = None, source_steps: int = 0) -> str:
    parts = [cfg.model.size]
    if source_label:  # continued pretraining: the source's objective and the decayed step count
        parts.append(f"{source_label}-dec{steps_label(source_steps)}" if source_steps else source_label)
    done = source_steps
    phases = cfg.phases.resolved()
    for phase in phases:
        done += phase.steps
        tag = "clm" if phase.objective == "clm" else f"mlm{round(phase.mask_ratio * 100)}"
        parts.append(f"{tag}-{steps_label(done)}")
    return "-".join(parts) + "-" + config_hash(cfg)
