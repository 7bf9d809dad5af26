"""W&B while a sweep trains: a segment's run logged live by its rank-0 worker, with its lineage in its config, and
checkpoints and exports as W&B artifacts that reference their bucket URIs (nothing is uploaded twice).

    job = SegmentJob(..., wandb=segment_settings(spec, segment.id, parent="seg-a", serves=("run-1", "run-2")))
    run = segment_run(job.wandb, job.name, flatten(job.run), rank)   # None: no project, or not rank 0
    log_checkpoint(run, "s3://bucket/sweep/runs/seg-b/checkpoint_000100", name="seg-b", step=100, export=False)

A segment's run id is stable (`stable_id(sweep, "segment", name)`): a worker group restarted after a failure, or a
resumed sweep, continues the same W&B run. A plain `raybiphase pretrain` run logs as `kind="pretrain"` under the id
the driver's whole-curve run would take, so it, too, is one W&B run however often it resumes.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from raybiphase import storage
from raybiphase.telemetry.wandb import define_curves, init_run, stable_id, sweep_settings


def segment_settings(spec, name: str, *, parent: str | None, serves: Sequence[str]) -> dict | None:
    """`sweep_settings` of a sweep spec for one segment (None without a project): logged as `kind="segment"`, with
    its lineage (`lineage.segment`, `lineage.parent`: the segment it continues, "" for a root, `lineage.serves`:
    the pretraining runs whose weights it trains) added to its config."""
    settings = sweep_settings(spec)
    if settings is None:
        return None
    lineage = {"lineage.segment": name, "lineage.parent": parent or "", "lineage.serves": list(serves)}
    return {**settings, "kind": "segment", "lineage": lineage}


def segment_run(settings: Mapping[str, Any] | None, name: str, config_flat: Mapping[str, Any], rank: int):
    """The W&B run a pretraining worker logs to as it trains (`settings`: `segment_settings`, or `sweep_settings`
    for a single run), its curves against tokens seen; None without settings or off world rank 0."""
    if not settings:
        return None
    kind = settings.get("kind", "pretrain")
    run = init_run(kind, name, settings["group"], {**config_flat, **settings.get("lineage", {})},
                   settings["project"], rank=rank, mode=settings.get("mode"), sync_to=settings.get("sync_to"),
                   run_id=stable_id(settings["group"], kind, name))
    define_curves(run)
    return run


def reference_uri(location: str) -> str:
    """A bucket URI as it is; a local path as the file:// URI W&B references it by."""
    return location if storage.is_uri(location) else "file://" + os.path.abspath(location)


def artifact_name(name: str, step: int) -> str:
    """A W&B artifact name for a checkpoint of `name` at `step` (letters, digits, '-', '_' and '.' only)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{name}-step{step}")


def log_checkpoint(run, location: str, *, name: str, step: int, export: bool) -> None:
    """Log the committed checkpoint at `location` (and its HF export when `export`) as W&B artifacts by reference:
    type "checkpoint" and "model", aliased `step-<step>`, W&B keeping the URI, not a copy. No-op without a run. A
    store W&B cannot reference (no client library or credentials for its scheme) is a warning; training goes on."""
    if run is None:
        return
    import wandb  # lazy: an optional dependency, imported only when a project is set

    pieces = [("checkpoint", location)] + ([("model", storage.hf_dir(location))] if export else [])
    for kind, uri in pieces:
        artifact = wandb.Artifact(artifact_name(name if kind == "checkpoint" else f"{name}-hf", step), type=kind,
                                  metadata={"step": step, "uri": uri})
        try:
            artifact.add_reference(reference_uri(uri), checksum=False)
        except Exception as error:  # a missing client library, no credentials for the store: W&B's or the cloud's
            warnings.warn(f"W&B: {uri} not logged as an artifact ({error})", stacklevel=2)
            continue
        run.log_artifact(artifact, aliases=[f"step-{step}"])
