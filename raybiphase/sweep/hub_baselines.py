"""Public encoders beside the sweep's arms (finetune.baselines): each fine-tuned once on the sweep's grid, its rows
with source `hub`, run its id and checkpoint its id@commit.

A Hub id is pinned to the commit it resolves to when the sweep first reaches it (`encoders.encoder_source`): once per
sweep in a process, so the commit its trials and rows carry is the one resolved when the sweep started, wherever
the Hub's head has moved since. Two entries naming one model at one commit are one baseline. Trials are kept under
<sweep.storage>/hub-baselines/<settings digest>/<model@commit>/ (finetune.parquet and the trials' records), one folder
per model and commit: a later sweep at the same storage with the same fine-tuning settings reuses every trial already
made at that commit and copies the rows into its own table with its name, and one whose id resolves to a newer commit
fine-tunes that commit afresh (a trial at one commit never stands for another).

In a sweep, each public encoder's trials run beside pretraining, from its start, on the sweep's one scheduler
(`hub_jobs`, each with its cache as its `Records`); once every trial has ended, `hub_baseline_rows` finds them all in
the caches and copies the rows into the sweep's table.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pandas as pd

from raybiphase import storage
from raybiphase.config import SweepSpec
from raybiphase.finetune.encoders import encoder_source, is_hub_id
from raybiphase.finetune.fanout import Fanout, plan_specs
from raybiphase.finetune.records import trial_settings
from raybiphase.finetune.spec import FinetuneSource
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from raybiphase.results.rows import trial_key
from raybiphase.sweep.finetuning import trials_done
from raybiphase.sweep.scheduler import Records, finetune_checkpoints

HUB_BASELINES_DIR = "hub-baselines"
_RESOLVED: dict[tuple[str, str, str], str] = {}  # (sweep storage, sweep name, finetune.baselines entry) -> pinned


def _resolved(spec: SweepSpec, model: str) -> str:
    """`encoders.encoder_source(model)`, resolved once per sweep in this process and carried from then on."""
    key = (storage.absolute(spec.sweep.storage), spec.sweep.name, model)
    if key not in _RESOLVED:
        _RESOLVED[key] = encoder_source(model)
    return _RESOLVED[key]


def hub_sources(spec: SweepSpec) -> list[FinetuneSource]:
    """One source per distinct public encoder of finetune.baselines, each pinned (a Hub id to its commit, the one
    it resolved to when this sweep first asked: `_resolved`)."""
    pinned = list(dict.fromkeys(model if is_hub_id(model) else storage.absolute(model)
                                for model in (_resolved(spec, m) for m in spec.finetune.baselines)))
    return [FinetuneSource(model.partition("@")[0] if "@" in model else Path(model.rstrip("/")).name, 0, model,
                           {"model.init_from": model}, row_source=result_rows.HUB) for model in pinned]


def hub_cache(spec: SweepSpec, source: FinetuneSource) -> str:
    """Where the trials of one public encoder at one commit (`source`, from `hub_sources`) are kept for every sweep
    at this storage with these fine-tuning settings: a readable name (the id, or a folder's name, and the commit)
    and a digest of the whole pinned reference, so no two models or commits share a folder."""
    readable = re.sub(r"[^A-Za-z0-9._@-]", "--", source.run)[:80]
    commit = source.hf_dir.rpartition("@")[2][:12] if is_hub_id(source.hf_dir) else "local"
    digest = hashlib.sha256(source.hf_dir.encode()).hexdigest()[:12]
    return storage.join(storage.absolute(spec.sweep.storage), HUB_BASELINES_DIR, trial_settings(spec.finetune),
                        f"{readable}@{commit}-{digest}")


def _missing(spec: SweepSpec, source: FinetuneSource, records: Records) -> bool:
    """Whether a row of `source`'s grid is not yet in its cache."""
    done = {trial_key(dict(zip(result_rows.TRIAL_KEY, key))) for key in records.done}
    return any(trial.key not in done for trial in plan_specs([source], spec.finetune))


def hub_jobs(spec: SweepSpec) -> list[tuple[FinetuneSource, Records]]:
    """Each public encoder of finetune.baselines with where its trials are kept (`hub_cache`): the scheduler's jobs
    beside pretraining (raybiphase.sweep.scheduler.Scheduler.run's `beside`)."""
    out = []
    for source in hub_sources(spec):
        cache = hub_cache(spec, source)
        table = storage.join(cache, storage.FINETUNE_FILE)
        out.append((source, Records(storage.join(cache, "trials"), table, frozenset(trials_done(table, result_rows.HUB)))))
    return out


def hub_baseline_rows(spec: SweepSpec, *, console=None) -> pd.DataFrame:
    """Fine-tune each public encoder's trials not yet in its cache (`hub_cache`; none, after a sweep's scheduler ran
    them), then its rows for this sweep's grid, under this sweep's name (the caller appends them to the sweep's
    table)."""
    kwargs = {"console": console} if console is not None else {}
    cfg, found = spec.finetune, []
    for source, records in hub_jobs(spec):
        table = records.table
        if _missing(spec, source, records):  # none once a sweep's scheduler ran its trials: run here, now
            rows = finetune_checkpoints([source], Fanout.of(spec), storage=storage.parent(records.experiment),
                                        name=storage.basename(records.experiment), done=records.done, **kwargs)
            if rows:
                store.append_rows(table, rows, key=result_rows.FINETUNE_KEY)
        cached = store.read_rows(table)
        if cached.empty:
            continue
        keep = ((cached["checkpoint"] == source.hf_dir) & cached["task"].isin(cfg.tasks) & cached["lr"].isin(cfg.lrs)
                & cached["seed"].isin(cfg.seeds))
        found.append(cached[keep].assign(sweep=spec.sweep.name))
    return pd.concat(found, ignore_index=True) if found else pd.DataFrame()
