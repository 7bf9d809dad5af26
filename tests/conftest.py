"""Shared fixtures: the offline assets (fetched once per machine), one local Ray cluster, a small real dataset."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def offline_cache():
    from raybiphase import assets

    return assets.fetch(log=lambda *a: None)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for the whole session, sized like this 2-core machine."""
    import ray

    from raybiphase.raycluster import ensure_ray

    ensure_ray(num_cpus=2)
    yield
    ray.shutdown()


SMALL_DATA = {
    "max_documents": 2000,
    "vocab_size": 2048,
    "seq_len": 64,
    "val_blocks": 16,
    "shard_rows": 256,
}


@pytest.fixture(scope="session")
def small_data(offline_cache, ray_cluster, tmp_path_factory):
    """A real prepared dataset: 2,000 offline documents, a 2,048-token BPE, 64-token blocks in 256-row shards."""
    from raybiphase.config import DataConfig
    from raybiphase.prepare import prepare
    from raybiphase.stream import open_dataset

    data = DataConfig(**SMALL_DATA, dir=str(tmp_path_factory.mktemp("data") / "small"))
    path = prepare(data, quiet=True)
    return data, open_dataset(path, seq_len=data.seq_len)
