"""A rehearsal of the cloud cluster on one machine: a head that offers no CPU, a worker node that cannot see the
driver's files, a bucket (a real S3-compatible server on 127.0.0.1) for data and results, `ray job submit`.

The worker node is started inside its own mount namespace (`unshare -m`) with empty tmpfs mounted over the checkout,
the caches and /tmp: its processes cannot read anything the driver wrote locally, so whatever crosses from the
driver to the work (shards, offline assets, checkpoints, records) crosses through the bucket. cluster/README.md
shows the same rehearsal as commands.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHRUNK = [  # the quickstart's CLM->MLM and CLM runs (a shared prefix continued from the bucket), one task, small
    "sweep.grid={phases.clm_share: [0.5, 1.0]}", "resources.num_workers=1", "resources.max_concurrent=2",
    "data.max_documents=600", "phases.steps=8", "optim.warmup_steps=2", "optim.decay_steps=2",
    "train.eval_every=4", "train.checkpoint_every=4", "finetune.tasks=[tweets]", "finetune.lrs=[0.001]",
    "finetune.seeds=[0]", "finetune.max_steps=4", "finetune.eval_every=2", "finetune.max_examples=64",
    "finetune.max_eval_examples=64",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hidden_paths() -> list[Path]:
    """What the worker node must not see: the checkout, the caches (assets, shards, HF), the temp folders."""
    return [REPO, Path.home() / ".cache", Path(tempfile.gettempdir())]


def isolated_worker_command(ray_bin: str, address: str, keep: Path) -> list[str]:
    """`ray start` for a worker node in a new mount namespace where the hidden paths are empty; the Python
    environment stays visible (bound back in when it lives under a hidden path)."""
    venv = Path(sys.prefix)
    steps = [f"mount --bind {shlex.quote(str(venv))} {shlex.quote(str(keep))}"]
    steps += [f"mount -t tmpfs tmpfs {shlex.quote(str(p))}" for p in hidden_paths()]
    steps += [f"mkdir -p {shlex.quote(str(venv))}", f"mount --bind {shlex.quote(str(keep))} {shlex.quote(str(venv))}"]
    steps.append(f"exec {shlex.quote(ray_bin)} start --address={address} --num-cpus=2 --object-store-memory="
                 f"{300 << 20} --disable-usage-stats")
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", " && ".join(steps)]


def _mount_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/mnt")


def _raylets() -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "raylet":
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


@pytest.mark.cluster
@pytest.mark.slow
def test_the_quickstart_on_two_nodes_crosses_only_through_the_bucket(s3_bucket, offline_cache):
    import pyarrow.parquet as pq
    import ray

    from raybiphase import storage

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to give the worker node its own mount namespace")
    ray.shutdown()  # this test owns the machine's Ray from here on (the marker runs it last)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", RAYBIPHASE_MAX_FAILURES="0")
    ray_bin = str(Path(sys.executable).parent / "ray")
    port, dashboard = _free_port(), _free_port()
    root = f"{s3_bucket}/two-nodes"
    keep = Path(tempfile.mkdtemp(prefix="rbp-venv-", dir="/dev/shm"))
    head = [ray_bin, "start", "--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=true",
            f"--dashboard-port={dashboard}", f"--object-store-memory={300 << 20}", "--disable-usage-stats"]
    try:
        subprocess.run(head, env=env, check=True, capture_output=True, timeout=120)
        worker = subprocess.run(isolated_worker_command(ray_bin, f"127.0.0.1:{port}", keep), env=env,
                                capture_output=True, text=True, timeout=120)
        assert worker.returncode == 0, worker.stderr[-2000:]
        ours = _mount_namespace(os.getpid())
        isolated = [pid for pid in _raylets() if _mount_namespace(pid) != ours]
        assert len(isolated) == 1, "the worker node's raylet does not run in its own mount namespace"
        seen = Path(f"/proc/{isolated[0]}/root{REPO}")  # the checkout as the worker node sees it
        assert not (seen / "README.md").exists() and not (seen / "raybiphase").exists(), "the worker node sees the checkout"

        overrides = [f"sweep.storage={root}/results", f"data.dir={root}/shards", *SHRUNK]
        submit = [ray_bin, "job", "submit", f"--address=http://127.0.0.1:{dashboard}", "--working-dir", ".", "--",
                  "python", "-m", "raybiphase.sweep", "sweeps/quickstart.yaml",
                  *[arg for o in overrides for arg in ("--set", o)]]
        started = time.time()
        while True:  # the head's job agent comes up after `ray start` returns: on a loaded machine, minutes later
            proc = subprocess.run(submit, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
            if "No available agent to submit job" not in proc.stderr + proc.stdout or time.time() > started + 240:
                break
            time.sleep(5)
        assert proc.returncode == 0 and "succeeded" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
        print(f"two-node quickstart: {time.time() - started:.0f}s")
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(keep, ignore_errors=True)

    results = f"{root}/results/quickstart"
    fs, path = storage.filesystem(storage.join(results, storage.FINETUNE_FILE))
    finetune = pq.read_table(path, filesystem=fs).to_pandas()
    assert len(finetune[finetune["source"] == "raybiphase"]) == 3  # (two runs + their untrained control) x 1 x 1 x 1
    assert finetune["test_score"].between(0, 1).all()
    assert storage.is_file(storage.join(results, storage.PRETRAIN_FILE))
    assert storage.is_file(storage.join(results, storage.REPORT_DIR, "report.md"))
    assert storage.is_file(storage.join(root, "shards", "manifest.json"))
    # the worker node had no assets: it read them from the bucket, where the driver put them
    assert storage.is_file(storage.join(root, "results", "assets", "tweets", "MANIFEST.json"))
    assert not (REPO / "results" / "quickstart" / "two-nodes").exists()
