"""Addressable training data: global sample g -> (epoch, shard, row) -> masked batch, streamed by Ray Data.

Global batch k of a run holds the samples [k * B, (k + 1) * B) (B = sequences per optimizer step). Worker r of W
gets the contiguous slice [k * B + r * B / W, k * B + (r + 1) * B / W) of every global batch, in micro-batches,
so the union of what the workers see at step k is the same global batch whatever W is. Sample g lives in epoch
g // N (N = training blocks); each epoch visits the shards in a permutation seeded by (seed, epoch), rows in order.
Masking is a pure function of (seed, g, phase settings) (raybiphase.data.masking), so a run resumed, restarted or
branched at step s sees exactly the batches an uninterrupted run sees from s on; nothing needs Ray Data to
checkpoint an iterator (ray#37633): each worker builds its stream from its own start position.

    manifest = open_dataset(location, seq_len=128)   # a folder or a bucket URI
    ds = phase_stream(manifest, phase, first_step=0, steps=10, rows_per_step=16, rank=0, world=2, ...)
    for batch in ds.iter_torch_batches(batch_size=4): ...
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from raybiphase import storage, transfer
from raybiphase.data.assets import cache_dir
from raybiphase.data.masking import MaskingSpec, mask_batch
from raybiphase.errors import UserError
from raybiphase.raycluster import quiet_data

FULL_HASH_LIMIT = 2 << 30  # verify every shard's sha256 before training when the dataset is under 2 GiB
EVAL_SEED = 0  # the held-out MLM masking is the same in every run and phase
FORMAT_VERSION = 2  # of the prepared dataset (raybiphase.data.prepare writes it)
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Manifest:
    dir: str  # a folder or a bucket URI
    seq_len: int
    vocab_size: int
    special_ids: dict[str, int]
    tokenizer_fingerprint: str
    shard_files: tuple[str, ...]
    shard_rows: tuple[int, ...]
    val_file: str
    val_rows: int
    unigram_entropy: float | None = None
    """Nats per token of the corpus' token frequencies (prepare.unigram_entropy): the curves' reference line."""

    @property
    def train_rows(self) -> int:
        return sum(self.shard_rows)

    @property
    def tokenizer_dir(self) -> str:
        return storage.join(self.dir, "tokenizer")

    def local_tokenizer(self) -> Path:
        """The tokenizer folder on this node (copied from the bucket once per node)."""

        return transfer.local_copy(self.tokenizer_dir, cache_dir(), version=self.tokenizer_fingerprint)


def _check_file(root: str, entry: dict, sizes: dict[str, int], full_hash: bool) -> None:
    name = entry["file"]
    if name not in sizes:
        raise UserError(f"data: shard {name} listed in the manifest is missing from {root}")
    if sizes[name] != entry["bytes"]:
        raise UserError(f"data: shard {storage.join(root, name)} is corrupt ({sizes[name]} bytes, the manifest says "
                        f"{entry['bytes']})")
    if full_hash and hashlib.sha256(storage.read_bytes(storage.join(root, name))).hexdigest() != entry["sha256"]:
        raise UserError(f"data: shard {storage.join(root, name)} is corrupt (its sha256 differs from the manifest)")


def open_dataset(path: str | Path, *, seq_len: int, tokenizer_fingerprint: str | None = None) -> Manifest:
    """Read and check a prepared dataset (a folder or a bucket URI) before training starts; UserError names what
    is wrong. Every file's size is checked against the manifest, and every sha256 when the dataset is small."""
    root = storage.absolute(path)
    try:
        meta = storage.read_json(storage.join(root, MANIFEST))
    except ValueError:  # not JSON (storage.DamagedFile)
        raise UserError(f"data: {storage.join(root, MANIFEST)} is corrupt (not JSON)") from None
    except OSError as err:
        raise UserError(f"data: cannot read {root}: {' '.join(str(err).split())[:200]}") from None
    if meta is None:
        raise UserError(f"data: no prepared dataset at {root} (no {MANIFEST}); run raybiphase prepare CONFIG")
    if meta.get("format") != FORMAT_VERSION:
        raise UserError(f"data: the dataset at {root} has format {meta.get('format')}, this version reads "
                        f"{FORMAT_VERSION}; prepare it again into an empty data.dir")
    if meta["seq_len"] != seq_len:
        raise UserError(f"data.seq_len: the run asks for {seq_len} but the shards at {root} hold {meta['seq_len']}-token blocks")
    if tokenizer_fingerprint and meta["tokenizer_fingerprint"] != tokenizer_fingerprint:
        raise UserError(f"data.tokenizer: the shards at {root} were made with another tokenizer than the run's")
    sizes = storage.list_files(root)
    entries = [*meta["shards"], meta["val"]]
    full_hash = sum(e["bytes"] for e in entries) <= FULL_HASH_LIMIT
    for entry in entries:
        _check_file(root, entry, sizes, full_hash)
    return Manifest(
        dir=root,
        seq_len=seq_len,
        vocab_size=meta["vocab_size"],
        special_ids=meta["special_ids"],
        tokenizer_fingerprint=meta["tokenizer_fingerprint"],
        shard_files=tuple(s["file"] for s in meta["shards"]),
        shard_rows=tuple(s["rows"] for s in meta["shards"]),
        val_file=meta["val"]["file"],
        val_rows=meta["val"]["rows"],
        unigram_entropy=meta.get("unigram_entropy"),
    )


# ------------------------------------------------------------------------------------------- addressing


@functools.lru_cache(maxsize=16)
@storage.retrying()
def _load_blocks(location: str, seq_len: int) -> np.ndarray:
    """A shard's blocks, read straight from its folder or bucket (cached per process; a bucket that is down is
    waited out, as every storage call is, so a segment mid-step outlives an outage)."""
    fs, path = storage.filesystem(location)
    column = pq.read_table(path, columns=["input_ids"], filesystem=fs).column("input_ids").combine_chunks()
    return column.values.to_numpy().reshape(-1, seq_len)


def epochs_read(data_end: int, train_rows: int) -> float:
    """Passes over the training blocks once samples [0, data_end) are read. Past 1.0 `locate` has wrapped: the run (or
    the run it continues) trains on blocks already seen, which data.max_epochs must allow."""
    return data_end / train_rows


def locate(sample_ids: np.ndarray, shard_rows: tuple[int, ...], seed: int,
           shuffle_rows: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Global sample ids -> (shard index, row): a seeded permutation of the shards per epoch and, with
    `shuffle_rows` (data.row_order "shuffled"), of each shard's rows per epoch; sample g is in epoch
    g // sum(shard_rows), so ids past the end wrap into a new epoch (the data budget, raybiphase.pretrain.budget,
    stops runs that would get there unless data.max_epochs allows it). A pure function of (seed, sample id): resumes
    and branches read the same blocks."""
    rows = np.asarray(shard_rows)
    total = int(rows.sum())
    epochs, within = np.divmod(np.asarray(sample_ids, dtype=np.int64), total)
    shard = np.empty_like(within)
    row = np.empty_like(within)
    for epoch in np.unique(epochs):
        order = np.random.default_rng([seed, int(epoch)]).permutation(len(rows))
        starts = np.concatenate([[0], np.cumsum(rows[order])])
        sel = epochs == epoch
        pos = np.searchsorted(starts, within[sel], side="right") - 1
        shard[sel] = order[pos]
        row[sel] = within[sel] - starts[pos]
        for index in np.unique(shard[sel]) if shuffle_rows else ():
            at = sel & (shard == index)
            row[at] = np.random.default_rng([seed, int(epoch), int(index)]).permutation(int(rows[index]))[row[at]]
    return shard, row


def read_samples(manifest: Manifest, sample_ids: np.ndarray, seed: int, shuffle_rows: bool = True) -> np.ndarray:
    """The (B, seq_len) int32 blocks of the given global sample ids (`locate` says which)."""
    shard, row = locate(sample_ids, manifest.shard_rows, seed, shuffle_rows)
    out = np.empty((len(sample_ids), manifest.seq_len), dtype=np.int32)
    for s in np.unique(shard):
        sel = shard == s
        out[sel] = _load_blocks(storage.join(manifest.dir, manifest.shard_files[s]), manifest.seq_len)[row[sel]]
    return out


def worker_sample_ids(first_step: int, steps: int, rows_per_step: int, rank: int, world: int,
                      sample_offset: int = 0) -> np.ndarray:
    """Sample ids worker `rank` consumes for steps [first_step, first_step + steps), in order; a continued
    run starts its step 0 at `sample_offset` (the data position of the checkpoint it continues)."""
    per_worker = rows_per_step // world
    step = np.arange(first_step, first_step + steps, dtype=np.int64)[:, None]
    offset = np.arange(per_worker, dtype=np.int64)[None, :]
    return (sample_offset + step * rows_per_step + rank * per_worker + offset).reshape(-1)


CHUNK_COLUMN = "sample_ids"
"""A phase stream's input rows: one chunk of consecutive sample ids each (one masking call)."""


@dataclass(frozen=True)
class PhaseBatches:
    """How to turn sample ids into model inputs for one phase; a pure, picklable function of the batch."""

    manifest: Manifest
    objective: str
    seed: int
    mask: MaskingSpec | None = None
    shuffle_rows: bool = True

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = batch["sample_id"] if "sample_id" in batch else np.concatenate(list(batch[CHUNK_COLUMN]))
        ids = ids.astype(np.int64)
        blocks = read_samples(self.manifest, ids, self.seed, self.shuffle_rows)
        return make_inputs(blocks, ids, self.objective, self.manifest, self.seed, self.mask)


def make_inputs(blocks, sample_ids, objective, manifest: Manifest, seed: int, mask: MaskingSpec | None, stream: int = 0):
    """Model inputs and labels of one batch of blocks: raybiphase.data.masking.mask_batch with the manifest's
    vocabulary and special tokens (never masked)."""
    specials = manifest.special_ids
    out = mask_batch({"input_ids": blocks, "sample_id": sample_ids}, objective=objective, seed=seed, spec=mask,
                     mask_token_id=specials["mask_token"], vocab_size=manifest.vocab_size,
                     special_ids=list(specials.values()), stream=stream)
    return {"input_ids": out["input_ids"].astype(np.int64), "labels": out["labels"].astype(np.int64),
            "sample_id": out["sample_id"]}


def phase_stream(
    manifest: Manifest,
    *,
    objective: str,
    mask: MaskingSpec | None,
    seed: int,
    first_step: int,
    steps: int,
    rows_per_step: int,
    rank: int,
    world: int,
    sample_offset: int = 0,
    shuffle_rows: bool = True,
):
    """A Ray Dataset of this worker's masked rows for `steps` optimizer steps starting at `first_step`."""
    import ray

    quiet_data()
    ids = worker_sample_ids(first_step, steps, rows_per_step, rank, world, sample_offset)
    chunk = max(64, rows_per_step // world)
    # the ids in chunks built here (from_items makes its blocks in this process): from_numpy would ask for a task of
    # a whole CPU first, which a segment starting beside one that streams may never get on a small machine
    ds = ray.data.from_items([{CHUNK_COLUMN: ids[start:start + chunk]} for start in range(0, len(ids), chunk)],
                             override_num_blocks=1)  # one block, one streaming task, as from_numpy made
    # half a CPU per masking task: it is light (tens of M tokens/s), and must fit beside the Train workers
    return ds.map_batches(PhaseBatches(manifest, objective, seed, mask, shuffle_rows), batch_size=1,
                          batch_format="numpy", num_cpus=0.5)


def validation_batches(manifest: Manifest, *, batch_size: int, batches: int, mask_ratio: float,
                       mntp: bool = False) -> dict[str, list[dict]]:
    """Fixed held-out batches for the CLM and the MLM loss, and the MNTP loss for a run with an MNTP phase (MLM's
    masked inputs, its labels one position earlier): the same in every phase and every run."""
    blocks = _load_blocks(storage.join(manifest.dir, manifest.val_file), manifest.seq_len)
    n = min(len(blocks), batch_size * batches)
    spec = MaskingSpec(mask_ratio=mask_ratio)
    out: dict[str, list[dict]] = {"clm": [], "mlm": [], **({"mntp": []} if mntp else {})}
    for start in range(0, n, batch_size):
        ids = np.arange(start, min(n, start + batch_size))
        out["clm"].append(make_inputs(blocks[ids], ids, "clm", manifest, EVAL_SEED, None))
        for objective in [o for o in out if o != "clm"]:
            out[objective].append(make_inputs(blocks[ids], ids, objective, manifest, EVAL_SEED, spec, stream=1))
    return out
