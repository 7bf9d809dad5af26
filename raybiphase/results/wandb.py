"""Optional Weights & Biases logging: offline by default, rank zero only, no secrets (design.md, decision 9).

    run = init_run("pretrain", name=segment_name, group=sweep_name, config_flat=flatten(cfg), project=project)
    log(run, {"train/mlm_loss": 2.1}, step=100)       # every helper is a no-op when run is None
    finish(run)
    log_report(results_dir, project, sweep)           # summary tables and the report's figures

- No project configured (`sweep.wandb_project` is None) -> `init_run` returns None and nothing imports wandb.
- `WANDB_MODE=offline` unless the user set WANDB_MODE or WANDB_API_KEY: a configured user gets what they configured;
  anyone else gets local files under WANDB_DIR (default ./wandb) and no network (`wandb sync` uploads them later).
- One run per pretraining segment (`kind="pretrain"`) and per fine-tuning trial (`kind="finetune"`), grouped by
  sweep; the config holds the dotted keys (`phases.mask_ratio`), the same names as the YAML and Parquet columns.
- Secrets: a config key with a word "key", "token", "secret", "password" (split at . _ / -: `sweep.wandb_api_key`,
  `data.hf_token`) is dropped, and so is any value that contains the WANDB_API_KEY; `train.global_batch_tokens`
  and `data.tokenizer` stay. Console capture is off, so printed text never reaches W&B either.
- Rank zero only: under Ray Train V2 `setup_wandb(rank_zero_only=True)` was ignored (design.md), so `init_run`
  returns None unless the world rank (argument, else the RANK variable Ray Train's torch backend sets) is 0.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "credentials"})
KINDS = ("pretrain", "finetune", "report")


def clean_config(config_flat: Mapping[str, Any]) -> dict[str, Any]:
    """The flat config without secrets: keys naming a key/token/secret/password, values holding the API key."""
    api_key = os.environ.get("WANDB_API_KEY", "")
    out = {}
    for key, value in config_flat.items():
        if SECRET_WORDS & set(re.split(r"[^a-z0-9]+", key.lower())):
            continue
        if api_key and api_key in str(value):
            continue
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def default_mode() -> str | None:
    """'offline' unless the user configured W&B (WANDB_MODE or WANDB_API_KEY set); None lets wandb decide."""
    if "WANDB_MODE" in os.environ or "WANDB_API_KEY" in os.environ:
        return None
    return "offline"


def world_rank(rank: int | None = None) -> int:
    """The given rank, else the RANK variable (set in every Ray Train torch worker), else 0 (a driver)."""
    if rank is not None:
        return rank
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def init_run(
    kind: str,
    name: str,
    group: str,
    config_flat: Mapping[str, Any],
    project: str | None,
    *,
    rank: int | None = None,
    directory: str | os.PathLike | None = None,
):
    """Start a W&B run (a wandb Run) for a pretraining segment, a fine-tuning trial or a report; or None.

    None when no project is configured or when this process is not world rank zero.
    """
    if not project or world_rank(rank) != 0:
        return None
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    import wandb

    settings = wandb.Settings(console="off", save_code=False, disable_git=True, x_disable_stats=True,
                              silent=True)
    return wandb.init(
        project=project,
        name=name,
        group=group,
        job_type=kind,
        config=clean_config(config_flat),
        mode=default_mode(),
        dir=str(directory) if directory is not None else os.environ.get("WANDB_DIR"),
        reinit="create_new",  # a driver logs many trials one after the other
        settings=settings,
    )


def log(run, metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Log metrics (dotted or slashed names, e.g. val/mlm_loss) at a step; no-op without a run."""
    if run is not None:
        run.log(dict(metrics), step=step)


def finish(run, summary: Mapping[str, Any] | None = None) -> None:
    """Record final values (validation and test score of a trial, say) and close the run; no-op without a run."""
    if run is None:
        return
    for key, value in (summary or {}).items():
        run.summary[key] = value
    run.finish()


def _table(frame):
    """A wandb.Table; lists and other non-scalars become strings (W&B tables hold scalars)."""
    import wandb

    frame = frame.copy()
    for column in frame.columns:
        if frame[column].map(lambda v: isinstance(v, (list, tuple, dict)) or hasattr(v, "__array__")).any():
            frame[column] = frame[column].map(str)
    return wandb.Table(dataframe=frame)


def log_report(results_dir: str | os.PathLike, project: str | None, sweep: str) -> str | None:
    """Upload summary.parquet (and its per-LR table) and every PNG of RESULTS_DIR/report as one 'report' run.

    Returns the run's id, or None when no project is configured.
    """
    from raybiphase.results.aggregate import lr_table
    from raybiphase.results.store import read_rows
    from raybiphase.storage import FINETUNE_FILE, SUMMARY_FILE, join

    run = init_run("report", f"{sweep}-report", sweep, {"sweep.name": sweep}, project)
    if run is None:
        return None
    import wandb

    payload: dict[str, Any] = {}
    summary = read_rows(join(results_dir, SUMMARY_FILE))
    if len(summary):
        payload["tables/summary"] = _table(summary)
    trials = read_rows(join(results_dir, FINETUNE_FILE))
    if len(trials):
        payload["tables/per_lr"] = _table(lr_table(trials))
    for png in sorted((Path(results_dir) / "report").glob("*.png")):
        payload[f"figures/{png.stem}"] = wandb.Image(str(png), caption=png.stem)
    if payload:
        run.log(payload)
    run_id = run.id
    run.finish()
    return run_id
