"""Starting or joining Ray, sized honestly for the machine (see ../shared/design.md, "Ray 2.60 on a 2-core machine").

`ensure_ray()` joins the cluster named by RAY_ADDRESS (as under `ray job submit`) or starts a local one with the
machine's CPUs, a 1 GiB object store (keeps /dev/shm small) and Ray's own logs kept off the console
(RAYBIPHASE_VERBOSE=1 shows every worker's output; the logs are always under /tmp/ray/session_latest/logs).
"""

from __future__ import annotations

import logging
import os


def ensure_ray(num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    verbose = os.environ.get("RAYBIPHASE_VERBOSE") == "1"  # show every worker's log lines on the console
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's tables stay off the console (verbose=0)
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    env_vars = {"TOKENIZERS_PARALLELISM": "false"}
    if "HF_HUB_OFFLINE" in os.environ:  # tests and the offline quickstart set it; production may download
        env_vars["HF_HUB_OFFLINE"] = os.environ["HF_HUB_OFFLINE"]
    runtime_env = {"env_vars": env_vars}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], logging_level=logging.WARNING, log_to_driver=verbose, runtime_env=runtime_env)
    else:
        ray.init(
            num_cpus=num_cpus or int(os.environ.get("RAYBIPHASE_NUM_CPUS", os.cpu_count() or 2)),
            object_store_memory=1 << 30,
            include_dashboard=True,
            logging_level=logging.WARNING,
            log_to_driver=verbose,
            runtime_env=runtime_env,
        )
    quiet_data()


def quiet_data() -> None:
    """Ray Data settings every process that builds a dataset uses: ordered output, no progress bars."""
    import ray

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = True
