"""Starting or joining Ray, sized honestly for the machine (a Tune trial, a Train controller and its workers each hold CPUs).

`ensure_ray()` joins the cluster named by RAY_ADDRESS (as under `ray job submit`; `auto`: the one `ray start` left
on this machine) or starts a local one of its own with the machine's CPUs, a 1 GiB object store (keeps /dev/shm small) and Ray's own logs kept off the console
(RAYBIPHASE_VERBOSE=1 shows every worker's output; the logs are always under /tmp/ray/session_latest/logs).
"""

from __future__ import annotations

import json
import logging
import os

from raybiphase import ray_internals
from raybiphase.errors import env_number
from raybiphase.locks import FENCE_ENV
from raybiphase.outages import NOTICE_ENV, OUTAGE_ENV

FORWARDED_ENV = (
    "HF_HUB_OFFLINE",  # tests and the offline quickstart set it; production may download
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",  # an S3-compatible store
    "RAYBIPHASE_ASSET_MIRROR",  # where nodes without the offline assets copy them from
    "RAYBIPHASE_DATASETS_DIR",  # local snapshots of the fine-tuning datasets' hub repositories
    "RAYBIPHASE_STORAGE_RETRY_S", OUTAGE_ENV, NOTICE_ENV,  # how long an unreachable bucket is waited out
    FENCE_ENV,  # the lease the driver holds: a worker writes nothing to the sweep once another driver took it
)  # and every WANDB_* setting but these: the key (raybiphase.telemetry.wandb shares it in memory) and a local folder
PRIVATE_ENV = frozenset({"WANDB_API_KEY", "WANDB_DIR"})


def worker_env() -> dict[str, str]:
    """The environment every Ray worker gets from the driver (never a secret)."""
    env = {"TOKENIZERS_PARALLELISM": "false"}
    for name, value in os.environ.items():
        if name in FORWARDED_ENV or (name.startswith("WANDB_") and name not in PRIVATE_ENV):
            env[name] = value
    # under `ray job submit`, Ray merges this with the job's runtime_env and refuses a variable set in both
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")).get("runtime_env") or {}
    return {k: v for k, v in env.items() if k not in (job.get("env_vars") or {})}


def ensure_ray(num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    ray_internals.check()  # before Ray starts: a Ray that moved what this code reaches is said in one line
    verbose = os.environ.get("RAYBIPHASE_VERBOSE") == "1"  # show every worker's log lines on the console
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's tables stay off the console (verbose=0)
    # Tune's TensorBoard logger (in this process) says a line for every NaN metric a trial reports, and a trial
    # reports NaN where a score is not defined yet; the rows and the report say what a trial scored
    logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)
    # Tune times its controller's steps and warns past 0.5 s; its Tuners run in threads of this process beside the
    # sweep's scheduler, so the times measure the driver's other work (a segment ending, rows written), not Tune's:
    # an H100 sweep printed 9 such warnings, each for a keep-alive result that took 0.5-1.1 s to log
    logging.getLogger("ray.tune.utils.util").setLevel(logging.ERROR)
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Ray Train's controller polls its workers this often (default 2 s): each stage of a group's start, each
    # checkpoint's report and a finished segment's release wait for a poll. Measured on a tiny 8-step fit (3
    # checkpoints): 14.7 s at 0.5, 11.7 s at 0.25, 11.4 s at 0.1. Ray Train passes RAY_TRAIN_* settings from the
    # driver to its controller.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
    runtime_env = {"env_vars": worker_env()}
    if os.environ.get("RAY_ADDRESS"):
        context = ray.init(address=os.environ["RAY_ADDRESS"], logging_level=logging.WARNING, log_to_driver=verbose,
                           runtime_env=runtime_env)
    else:  # a Ray of our own even where `ray start` left one on this machine (RAY_ADDRESS=auto joins that one)
        say_other_clusters()
        # one node this process owns: no autoscaler drains it, so Ray Train's preemption watcher (an actor per
        # worker group, polling the GCS for drain notices) would watch for nothing. It costs about 1.5 CPU-seconds
        # per segment; a SIGTERM still reaches the loop's own handler (raybiphase.pretrain.preemption).
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        # Ray turns token authentication on for a local cluster by default and warns that it did, on every start
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        context = ray.init(
            address="local",
            num_cpus=num_cpus or int(env_number("RAYBIPHASE_NUM_CPUS", os.cpu_count() or 2, minimum=1)),
            object_store_memory=1 << 30,
            # the dashboard serves Ray's state API, through which Ray Train's placement-group cleaner learns that a
            # fit's controller died: without it a lost controller's worker group keeps its CPUs (seen: 0.45 of 2
            # CPUs still held 3 minutes after the fault rehearsal's controller was killed)
            include_dashboard=True,
            logging_level=logging.WARNING,
            log_to_driver=verbose,
            runtime_env=runtime_env,
        )
    dashboard = getattr(context, "dashboard_url", None)
    if dashboard:  # where to watch the jobs, actors and logs while the sweep runs
        print(f"Ray dashboard: http://{dashboard}" if "://" not in dashboard else f"Ray dashboard: {dashboard}",
              flush=True)
    quiet_data()


def own_machine() -> tuple[dict[str, float], bool] | None:
    """For a process on its own local Ray: that Ray's total resources and whether flash-attn imports here (its
    workers run here); None on a cluster joined through RAY_ADDRESS, whose autoscaler may add what it lacks."""
    import importlib.util

    import ray

    if os.environ.get("RAY_ADDRESS"):
        return None
    return ray.cluster_resources(), importlib.util.find_spec("flash_attn") is not None


def say_other_clusters() -> None:
    """One line when a Ray cluster (`ray start`) already runs on this machine: this process starts its own beside
    it, which a user on a cluster's head node would not expect."""
    running, recorded = ray_internals.local_clusters()  # Ray's own lookups (checked at start: ensure_ray)
    if running:
        print(f"Ray: a cluster already runs on this machine ({', '.join(running)}); starting a local one of its own "
              "(RAY_ADDRESS=auto uses that one)", flush=True)
    if recorded and recorded not in running:  # measured: each Ray Train fit then waits ~11 s more on Ray's state API
        print(f"Ray: this machine's record of a `ray start` cluster names one that no longer runs ({recorded}); "
              "`ray stop` clears it", flush=True)


def quiet_data() -> None:
    """Ray Data settings every process that builds a dataset uses: ordered output, no progress bars."""
    import ray

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    # it warns, once per process, that the bars this function turns off are off (preparation says its own progress)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = True
