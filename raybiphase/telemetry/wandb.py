"""Optional Weights & Biases logging: online when a key is at hand, else offline; rank zero only; no secrets.

    run = init_run("pretrain", name=segment_name, group=sweep_name, config_flat=flatten(cfg), project=project)
    log(run, {"train/mlm_loss": 2.1}, step=100)       # every helper is a no-op when run is None
    finish(run)
    log_report(results_dir, project, sweep)           # summary tables and the report's figures

- No project configured (`sweep.wandb_project` is None) -> `init_run` returns None and nothing imports wandb.
- The driver decides the mode once (`driver_settings`): WANDB_MODE when the user set it, else online when a key is
  at hand (WANDB_API_KEY, or `wandb login`'s entry in ~/.netrc), else offline. Workers on other nodes have neither
  the variable nor the netrc: the driver hands the key to one named Ray actor (`share_key`), which keeps it in
  memory only, and a worker that must log online asks it (`init_run`). The key is never put in a config, a
  runtime environment, a log or a file. The other WANDB_* variables reach every worker through
  raybiphase.raycluster.
- An offline run's folder is copied to `<sweep storage>/<sweep>/wandb/` when it finishes (`sync_to`): node disks
  are deleted by the autoscaler, the bucket keeps them for `wandb sync`.
- Runs are grouped by sweep, with stable ids (`stable_id`): logging a run again, as a resumed sweep does,
  continues it. A sweep's segment logs live from its rank-0 worker (`kind="segment"`, raybiphase.telemetry.
  wandb_live); each pretraining run's whole curve is one `kind="pretrain"` run once its segments are done; each
  (checkpoint, task) of fine-tuning is one `kind="finetune"` run. The config holds the dotted keys (`phases.mask_ratio`), the same names as the YAML and Parquet columns.
- Secrets: a config key with a word "key", "token", "secret", "password" (split at . _ / -: `sweep.wandb_api_key`,
  `data.hf_token`) is dropped, and so is any value that contains the WANDB_API_KEY; `train.global_batch_tokens`
  and `data.tokenizer` stay. Console capture is off, so printed text never reaches W&B either.
- Rank zero only: under Ray Train V2 `setup_wandb(rank_zero_only=True)` was ignored (Ray 2.60), so `init_run`
  returns None unless the world rank (argument, else the RANK variable Ray Train's torch backend sets) is 0.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raybiphase import storage, transfer
from raybiphase.telemetry.wandb_files import wait_whole

SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "credentials"})
KINDS = ("pretrain", "segment", "finetune", "report")


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


KEY_ACTOR = "raybiphase-wandb-key"
WANDB_HOST = "api.wandb.ai"


def api_key() -> str | None:
    """The key this process could log in with: WANDB_API_KEY, else `wandb login`'s ~/.netrc entry."""
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"]
    import netrc

    host = (os.environ.get("WANDB_BASE_URL") or WANDB_HOST).split("://")[-1].rstrip("/")
    try:
        entry = netrc.netrc(os.environ.get("NETRC")).authenticators(host)
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return None
    return entry[2] if entry else None


def default_mode() -> str:
    """WANDB_MODE when the user set it, else 'online' when a key is at hand, else 'offline'."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if api_key() else "offline"


def driver_settings(project: str | None, group: str, sync_to: str | None) -> dict | None:
    """What workers need to log (None without a project): the project, the group, the driver's mode and where
    offline run folders go. Online, the key is shared through `share_key`, never through these settings."""
    if not project:
        return None
    mode = default_mode()
    if mode == "online":
        share_key()
    return {"project": project, "group": group, "mode": mode, "sync_to": sync_to}


def sweep_settings(spec) -> dict | None:
    """`driver_settings` of a sweep spec: its project, its name as the group, its wandb/ folder for offline runs."""

    root = storage.SweepPaths.of(spec.sweep.storage, spec.sweep.name).root
    return driver_settings(spec.sweep.wandb_project, spec.sweep.name, sync_to=storage.join(root, "wandb"))


def share_key() -> None:
    """Put the driver's key in a named actor of this Ray job (memory only) for workers on other nodes."""
    import ray

    key = api_key()
    if not key or not ray.is_initialized():
        return
    try:
        ray.get_actor(KEY_ACTOR)
    except ValueError:  # the driver keeps the handle: the actor lives as long as this job
        _HOLDER.append(_holder_class().options(name=KEY_ACTOR).remote(key))


def _key_from_driver() -> str | None:
    import ray

    if not ray.is_initialized():
        return None
    try:
        return ray.get(ray.get_actor(KEY_ACTOR).key.remote())
    except ValueError:
        return None


@functools.cache
def _holder_class():
    import ray

    @ray.remote(num_cpus=0)
    class KeyHolder:
        def __init__(self, key: str):
            self._key = key

        def key(self) -> str:
            return self._key

        def __repr__(self) -> str:  # never shows the key in Ray's logs or dashboard
            return "KeyHolder()"

    return KeyHolder


_SYNC: dict[int, str] = {}
_HOLDER: list = []


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
    mode: str | None = None,
    sync_to: str | None = None,
    run_id: str | None = None,
    entity: str | None = None,
):
    """Start a W&B run (a wandb Run) for a pretraining segment, a fine-tuning trial or a report; or None.

    None when no project is configured or when this process is not world rank zero. `mode` is the driver's
    (`driver_settings`); `sync_to` receives the run's folder at `finish` when it ran offline; `run_id` names the
    W&B run (`stable_id`), so logging it again continues it rather than making another.
    """
    if not project or world_rank(rank) != 0:
        return None
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    mode = mode or default_mode()
    if mode == "online" and not api_key():
        key = _key_from_driver()
        if key is None:
            mode = "offline"  # no key on this node and none shared: keep the run rather than fail the trial
        else:
            os.environ["WANDB_API_KEY"] = key  # this process's memory only
    import wandb

    settings = wandb.Settings(console="off", save_code=False, disable_git=True, x_disable_stats=True,
                              silent=True)
    run = wandb.init(
        project=project,
        entity=entity,
        name=name,
        group=group,
        job_type=kind,
        config=clean_config(config_flat),
        mode=mode,
        dir=str(directory) if directory is not None else os.environ.get("WANDB_DIR"),
        reinit="create_new",  # a driver logs many runs one after the other
        settings=settings,
        **({"id": run_id, "resume": "allow"} if run_id else {}),
    )
    if sync_to and mode == "offline":
        _SYNC[id(run)] = sync_to
    return run


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
    folder = Path(run.dir).parent  # .../wandb/offline-run-<time>-<id>
    run.finish()
    sync_to = _SYNC.pop(id(run), None)
    if sync_to and folder.is_dir():
        wait_whole(folder)  # wandb's service writes the run's end after finish() returns: copy it whole
        transfer.upload(folder, storage.join(sync_to, folder.name))


def stable_id(*parts: Any) -> str:
    """A W&B run id from what the run is (sweep, kind, name): the same run gets the same id on every invocation."""
    import hashlib

    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:16]


def log_pretraining_run(settings: dict | None, name: str, config_flat: Mapping[str, Any],
                        history: list[dict]) -> str | None:
    """One W&B run per pretraining run: the reports of every segment it went through (shared prefixes included),
    in step order, as one curve. `settings`: `sweep_settings` (None: nothing is logged). Returns the run id."""
    if not settings:
        return None
    run = init_run("pretrain", name, settings["group"], config_flat, settings["project"], rank=0,
                   mode=settings.get("mode"), sync_to=settings.get("sync_to"),
                   run_id=stable_id(settings["group"], "pretrain", name))
    define_curves(run)
    for row in sorted(history, key=lambda r: r["step"]):
        log(run, {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
            step=int(row["step"]))
    run_id = run.id
    finish(run)
    return run_id


STEP_METRIC = "tokens_seen"


def define_curves(run) -> None:
    """Every metric of a pretraining run plots against tokens seen (`tokens_seen`, logged with each report) in
    W&B's charts; the W&B step stays the optimizer step. No-op without a run."""
    if run is None:
        return
    run.define_metric(STEP_METRIC)
    run.define_metric("*", step_metric=STEP_METRIC)
