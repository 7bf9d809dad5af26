"""Shared fixtures: the offline assets (fetched once per machine), one local Ray cluster, a small real dataset."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
# One intra-op thread in every test process and the processes it starts (set before torch loads), as Ray gives its
# workers: two test processes and Ray's workers share 2 cores, where torch's second OpenMP thread only waits for the
# first. Measured on a tiny EuroBERT's training step with the other core busy: 2.0x the wall time and 1.9x the
# CPU time at 2 threads; the unit tests of tests/pretrain and tests/data 43 vs 39 CPU-seconds on an idle machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


SECOND_RAY = ("test_trainer.py", "test_driver.py", "test_paper_mini.py", "test_staged_sweep.py")
"""The tests the second xdist process runs on a Ray of its own once its unit tests are done: the trainer's
rehearsals and the killed-driver rehearsal, which share the tiny run trained alone (`tiny_run`, trained once per
process that asks for it), and two of the studies whose segments train in the test's process."""

BESIDE_SHARED_RAY = ("results/test_control_calibration.py",)
"""Statistics simulations (no Ray, about 20 CPU-seconds) that a whole run hands to the process on the shared Ray:
the other process carries the unit tests and then the second Ray's rehearsals, and ended 15-55 s after it without
them once the pipeline rehearsal stopped at what it shows."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    import torch

    # the fault rehearsals first, the tests that start their own Ray cluster (`ray start --head`) last
    items.sort(key=lambda item: ("cluster" in item.keywords) - ("test_faults.py" in item.nodeid))
    for item in items:  # a test that needs the shared Ray (directly or through a fixture) is a `ray` test
        if "ray_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.ray)
        # Three groups in a whole run, one pytest-xdist process each at a time (xdist hands out the largest group
        # first): the tests without Ray; the tests on the shared Ray, the fault rehearsals first, and among them
        # BESIDE_SHARED_RAY; and SECOND_RAY, which the process through with the tests without Ray takes, on a Ray
        # of its own, so both processes carry about the same time (on a clean clone, 2 cores, they ended at 1374 s
        # and 1464 s with all the statistics' calibration simulations, about 60 s without Ray, on the shared Ray's
        # process). The fault rehearsals, whose check that a failed fit leaves no CPU held fails when a second Ray
        # loads the machine, run while the other process runs no Ray.
        if {"ray", "cluster"} & set(item.keywords):
            second = any(f"/{name}" in item.nodeid for name in SECOND_RAY)
            item.add_marker(pytest.mark.xdist_group("ray-second" if second else "ray"))
        elif not config.getoption("markexpr", ""):  # a selection by marks (the unit layer) spreads over both
            beside = any(f"/{name}" in item.nodeid for name in BESIDE_SHARED_RAY)
            item.add_marker(pytest.mark.xdist_group("ray" if beside else "no-ray"))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def offline_cache():
    from raybiphase.data import assets

    return assets.fetch(log=lambda *a: None)


@pytest.fixture(autouse=True)
def _unit_tests_never_start_ray(request, monkeypatch):
    """The unit layer (`-m "not slow and not ray"`) runs without Ray: a test not marked `ray` that starts it fails."""
    if {"ray", "cluster"} & set(request.node.keywords):
        return
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} started Ray but is not marked `ray`")

    monkeypatch.setattr(ray, "init", refuse)


@pytest.fixture(scope="session")
def s3_bucket():
    """A real S3-compatible server on 127.0.0.1 (moto's) and an empty bucket, found through the standard
    AWS_ENDPOINT_URL as a user's MinIO or cloud bucket would be; yields its s3:// URI."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    settings = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    boto3.client("s3").create_bucket(Bucket="raybiphase-test")
    yield "s3://raybiphase-test"
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def hub_snapshots(tmp_path_factory):
    """The session's RAYBIPHASE_DATASETS_DIR for Ray's workers: a folder of hub-layout dataset snapshots that tests
    write as they need them (empty until then)."""
    return tmp_path_factory.mktemp("hub-snapshots")


@pytest.fixture(scope="session")
def ray_cluster(s3_bucket, hub_snapshots):
    """One local Ray for the whole session, sized like this 2-core machine; its workers find the S3 server through
    the same AWS_* environment as the tests, and the hub's datasets in `hub_snapshots` (the driver, this process,
    reads them only in the tests that set RAYBIPHASE_DATASETS_DIR themselves)."""
    import ray

    from raybiphase.finetune.hub import DATASETS_DIR_ENV
    from raybiphase.raycluster import ensure_ray

    before = os.environ.get(DATASETS_DIR_ENV)
    os.environ[DATASETS_DIR_ENV] = str(hub_snapshots)  # Ray's workers take the environment at its start
    try:
        ensure_ray(num_cpus=2)
    finally:
        if before is None:
            os.environ.pop(DATASETS_DIR_ENV)
        else:
            os.environ[DATASETS_DIR_ENV] = before
    yield
    ray.shutdown()


SMALL_DATA = {
    "max_documents": 2000,
    "vocab_size": 2048,
    "seq_len": 64,
    "val_blocks": 16,
    "shard_rows": 256,
    "decontaminate": False,  # one dataset shared by sweeps of different tasks; decontamination has its own tests
}


def _prepared(folder, *, on_ray: bool):
    from raybiphase.config import DataConfig
    from raybiphase.data.prepare import prepare
    from raybiphase.data.stream import open_dataset

    data = DataConfig(**SMALL_DATA, dir=str(folder / "small"))
    path = prepare(data, quiet=True, on_ray=on_ray)
    return data, open_dataset(path, seq_len=data.seq_len)


@pytest.fixture(scope="session")
def small_shards(offline_cache, tmp_path_factory):
    """A real prepared dataset, made without Ray: 2,000 offline documents, a 2,048-token BPE, 64-token blocks in
    256-row shards."""
    return _prepared(tmp_path_factory.mktemp("shards"), on_ray=False)


@pytest.fixture(scope="session")
def small_data(offline_cache, ray_cluster, tmp_path_factory):
    """The same dataset as `small_shards`, tokenized through Ray Data: what pretraining tests train on."""
    return _prepared(tmp_path_factory.mktemp("data"), on_ray=True)


TINY_BASE = {
    "model": {"size": "tiny"},
    "phases": {"steps": 8, "clm_share": 0.5},
    "optim": {"warmup_steps": 2, "decay_steps": 2},
    "train": {"global_batch_tokens": 2048, "micro_batch_size": 8, "eval_every": 1, "checkpoint_every": 100,
              "eval_batches": 1},
    "resources": {"num_workers": 2, "cpus_per_worker": 0.45},
}


def tiny_base(tmp, small_data, name="t") -> dict:
    """A 2-worker, 8-step tiny EuroBERT run (4 CLM + 4 MLM steps) on the small dataset, as a config dict."""
    data, _ = small_data
    return {**TINY_BASE, "sweep": {"name": name, "storage": str(tmp)}, "data": {**SMALL_DATA, "dir": data.dir}}


def tiny_config(tmp, small_data, **overrides):
    from raybiphase.config import SweepSpec, from_dict

    return from_dict(SweepSpec, tiny_base(tmp, small_data), overrides)


@pytest.fixture(scope="session")
def tiny_run(small_data, tmp_path_factory):
    """The tiny run, trained once, uninterrupted, on its own: the reference for restarts and branches."""
    from raybiphase.pretrain.trainer import run_pretrain

    return run_pretrain(tiny_config(tmp_path_factory.mktemp("alone"), small_data))
