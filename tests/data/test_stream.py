"""Data pipeline: packing, addressable samples, disjoint worker slices, exact resume, bad shards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from raybiphase.config import DataConfig
from raybiphase.data.masking import MaskingSpec
from raybiphase.data.prepare import pack, prepare, shard_name
from raybiphase.data.stream import (
    epochs_read,
    locate,
    open_dataset,
    phase_stream,
    read_samples,
    validation_batches,
    worker_sample_ids,
)
from raybiphase.errors import UserError


def test_pack_splits_long_documents_and_keeps_every_token():
    docs = [np.arange(10, 10 + n, dtype=np.int32) for n in (3, 150, 7, 40)]
    blocks = np.concatenate(list(pack(docs, 32, bos=0, eos=1)))
    stream = np.concatenate([np.concatenate([[0], d, [1]]) for d in docs])
    assert blocks.shape[1] == 32
    assert np.array_equal(blocks.reshape(-1), stream[: blocks.size])  # order kept, only the final partial block cut
    assert stream.size - blocks.size < 32


def test_worker_slices_partition_each_global_batch():
    one = worker_sample_ids(3, 4, 16, rank=0, world=1).reshape(4, 16)
    two = [worker_sample_ids(3, 4, 16, rank=r, world=2).reshape(4, 8) for r in range(2)]
    assert np.array_equal(np.concatenate(two, axis=1), one)
    assert np.array_equal(one[0], np.arange(48, 64))


def test_epochs_visit_every_row_once_in_a_new_shard_order():
    rows = (5, 3, 4, 6, 2, 4, 3, 5)  # 32 rows in 8 shards
    shard, row = locate(np.arange(96), rows, seed=7)
    orders = []
    for epoch in range(3):
        part = slice(epoch * 32, (epoch + 1) * 32)
        assert sorted(zip(shard[part], row[part])) == [(s, r) for s, n in enumerate(rows) for r in range(n)]
        orders.append(tuple(dict.fromkeys(shard[part])))
    assert len(set(orders)) == 3  # a new seeded shard order every epoch
    again, _ = locate(np.arange(96), rows, seed=7)
    other, _ = locate(np.arange(96), rows, seed=8)
    assert np.array_equal(again, shard) and not np.array_equal(other, shard)  # a pure function of the seed


def test_shuffled_rows_are_a_per_shard_per_epoch_permutation_and_stored_rows_run_in_order():
    rows = (50, 30, 40, 60)  # 180 rows in 4 shards
    ids = np.arange(360)  # two epochs
    stored_shard, stored_row = locate(ids, rows, seed=7, shuffle_rows=False)
    shard, row = locate(ids, rows, seed=7)
    assert np.array_equal(shard, stored_shard)  # the same shard at every sample: a batch still reads one or two shards
    for epoch in range(2):
        part = slice(epoch * 180, (epoch + 1) * 180)
        assert sorted(zip(shard[part], row[part])) == [(s, r) for s, n in enumerate(rows) for r in range(n)]
        runs = np.diff(stored_row[part])
        assert (runs[shard[part][1:] == shard[part][:-1]] == 1).all()  # stored: consecutive rows
        steps = np.diff(row[part])[shard[part][1:] == shard[part][:-1]]
        assert (steps == 1).mean() < 0.1  # shuffled: a batch's neighbours are rarely neighbours in the shard
    first, second = row[:180], row[180:]
    assert not np.array_equal(first[shard[:180] == 0], second[shard[180:] == 0])  # a new permutation each epoch
    again = locate(ids, rows, seed=7)[1]
    assert np.array_equal(again, row) and not np.array_equal(locate(ids, rows, seed=8)[1], row)  # pure in the seed
    window = locate(np.arange(100, 140), rows, seed=7)[1]
    assert np.array_equal(window, row[100:140])  # any slice of sample ids reads the same blocks: resume and branch


@pytest.mark.parametrize("data_end", [20, 32, 40, 64, 70])
def test_epochs_read_counts_the_passes_locate_makes_over_the_blocks(data_end):
    rows = (5, 3, 4, 6, 2, 4, 3, 5)  # 32 blocks
    shard, row = locate(np.arange(data_end), rows, seed=7)
    reads = np.zeros((len(rows), max(rows)), dtype=int)
    np.add.at(reads, (shard, row), 1)
    assert reads.max() == np.ceil(epochs_read(data_end, sum(rows)))  # past 1.0 a block is read again
    assert (reads.max() > 1) == (epochs_read(data_end, sum(rows)) > 1)


def _collect(manifest, world, first_step, steps, objective="mlm"):
    mask = MaskingSpec(mask_ratio=0.4) if objective == "mlm" else None
    per_rank = []
    for rank in range(world):
        ds = phase_stream(manifest, objective=objective, mask=mask, seed=3, first_step=first_step, steps=steps,
                          rows_per_step=8, rank=rank, world=world)
        batches = list(ds.iter_batches(batch_size=8 // world, batch_format="numpy"))
        per_rank.append(batches)
    # global batch k = the concatenation of every rank's k-th micro-batch
    return [{k: np.concatenate([per_rank[r][i][k] for r in range(world)]) for k in ("input_ids", "labels", "sample_id")}
            for i in range(steps)]


@pytest.mark.ray
def test_one_or_two_workers_see_the_same_global_batches(small_data):
    _, manifest = small_data
    one, two = _collect(manifest, 1, 0, 5), _collect(manifest, 2, 0, 5)
    for a, b in zip(one, two, strict=True):
        for key in a:
            assert np.array_equal(a[key], b[key])


@pytest.mark.ray
def test_stream_started_at_step_s_is_the_tail_of_the_full_stream(small_data):
    _, manifest = small_data
    full, tail = _collect(manifest, 2, 0, 6), _collect(manifest, 2, 4, 2)
    for a, b in zip(full[4:], tail, strict=True):
        for key in a:
            assert np.array_equal(a[key], b[key])


@pytest.mark.ray
def test_clm_batches_are_next_token_labels_of_the_stored_blocks(small_data):
    _, manifest = small_data
    (batch,) = _collect(manifest, 1, 2, 1, objective="clm")
    blocks = read_samples(manifest, batch["sample_id"], seed=3)
    assert np.array_equal(batch["input_ids"], blocks)
    assert np.array_equal(batch["labels"][:, :-1], blocks[:, 1:]) and (batch["labels"][:, -1] == -100).all()


def test_validation_batches_are_fixed(small_shards):
    _, manifest = small_shards
    a = validation_batches(manifest, batch_size=4, batches=2, mask_ratio=0.4)
    b = validation_batches(manifest, batch_size=4, batches=2, mask_ratio=0.4)
    assert len(a["clm"]) == len(a["mlm"]) == 2
    for objective in a:
        for x, y in zip(a[objective], b[objective]):
            assert np.array_equal(x["input_ids"], y["input_ids"]) and np.array_equal(x["labels"], y["labels"])
    masked = (a["mlm"][0]["labels"] != -100).mean()
    assert 0.25 < masked < 0.55


def test_prepare_twice_does_nothing(small_shards, monkeypatch):
    data, manifest = small_shards
    import raybiphase.data.prepare as prep

    monkeypatch.setattr(prep, "plan_pieces", lambda *_: pytest.fail("prepare re-read the corpus"))
    assert prepare(data, quiet=True) == manifest.dir


def test_manifest_counts_and_special_tokens(small_shards):
    data, manifest = small_shards
    meta = json.loads((Path(manifest.dir) / "manifest.json").read_text())
    assert meta["documents"] == data.max_documents and meta["val"]["rows"] == data.val_blocks
    assert sum(manifest.shard_rows) == meta["train_rows"] and max(manifest.shard_rows) <= data.shard_rows
    blocks = read_samples(manifest, np.arange(64), seed=0)
    assert blocks.max() < manifest.vocab_size
    assert (blocks == manifest.special_ids["bos_token"]).any() and (blocks == manifest.special_ids["eos_token"]).any()
    assert not (blocks == manifest.special_ids["mask_token"]).any()


@pytest.fixture
def copy_of(small_shards, tmp_path):
    _, manifest = small_shards
    target = tmp_path / "copy"
    shutil.copytree(manifest.dir, target)
    return target


def test_missing_shard_is_named(copy_of):
    (copy_of / shard_name(0, 1)).unlink()
    with pytest.raises(UserError, match=f"shard {shard_name(0, 1)} listed in the manifest is missing"):
        open_dataset(copy_of, seq_len=64)


def test_corrupt_shard_is_named(copy_of):
    path = copy_of / shard_name(0, 2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=f"{shard_name(0, 2)} is corrupt"):
        open_dataset(copy_of, seq_len=64)
    path.write_bytes(bytes(data[:100]))
    with pytest.raises(UserError, match=f"{shard_name(0, 2)} is corrupt"):
        open_dataset(copy_of, seq_len=64)


def test_manifest_that_disagrees_with_the_run(copy_of):
    with pytest.raises(UserError, match="data.seq_len: the run asks for 128 but the shards .* hold 64-token blocks"):
        open_dataset(copy_of, seq_len=128)
    with pytest.raises(UserError, match="data.tokenizer: the shards .* were made with another tokenizer"):
        open_dataset(copy_of, seq_len=64, tokenizer_fingerprint="0" * 16)
    (copy_of / "manifest.json").unlink()
    with pytest.raises(UserError, match="no prepared dataset"):
        open_dataset(copy_of, seq_len=64)


def test_empty_or_unreadable_corpus(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UserError, match="yielded no documents"):
        prepare(DataConfig(source=str(empty), dir=str(tmp_path / "out")), quiet=True, on_ray=False)
    with pytest.raises(UserError, match="data.source: 'nonsense' is not"):
        prepare(DataConfig(source="nonsense", dir=str(tmp_path / "out2")), quiet=True, on_ray=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_shards_tokenized_on_ray_equal_those_made_in_process(small_data, small_shards):
    """Ray Data changes where tokenization runs, never what it makes: the same shards, byte for byte."""
    (_, on_ray), (_, plain) = small_data, small_shards
    on_ray, plain = Path(on_ray.dir), Path(plain.dir)
    files = sorted(p.name for p in on_ray.glob("*.parquet"))
    assert files == sorted(p.name for p in plain.glob("*.parquet")) and len(files) > 2
    for name in files:
        assert (on_ray / name).read_bytes() == (plain / name).read_bytes(), name


def test_manifest_holds_the_corpus_unigram_entropy(small_shards):
    import numpy as np
    import pyarrow.parquet as pq

    _, manifest = small_shards
    files = [*manifest.shard_files, manifest.val_file]
    ids = np.concatenate([np.concatenate(pq.read_table(f"{manifest.dir}/{f}").column("input_ids").to_numpy(zero_copy_only=False))
                          for f in files])
    ids = ids[~np.isin(ids, list(manifest.special_ids.values()))]  # document text only, as prepare counts it
    p = np.bincount(ids) / len(ids)
    p = p[p > 0]
    # the packed blocks drop a partial last block: within 0.01 nats of the count over every document
    assert manifest.unigram_entropy == pytest.approx(float(-(p * np.log(p)).sum()), abs=0.01)
    assert 5.0 < manifest.unigram_entropy < np.log(manifest.vocab_size)
