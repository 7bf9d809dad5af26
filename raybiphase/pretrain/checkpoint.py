"""Checkpoints: sharded weights and optimizer (torch.distributed.checkpoint) plus a typed meta; HF exports.

One loader serves resume, branching, continued pretraining and fine-tuning (names: raybiphase.storage):
    <ckpt>/meta.json       CheckpointMeta (raybiphase.checkpoint_meta, read without torch): the run config, step,
                           data position, the step's report, code version,
                           every other file's size and the shards' and index's SHA-256; written last
                           (`commit`), so a checkpoint whose upload was cut short has none and is never resumed
                           or branched from
    <ckpt>/__*_0.sha256.json  each rank's digests of the files it wrote, merged into the meta at commit
    <ckpt>/__*_*.distcp    DCP shards of {"model": ..., "optim": ...}; <ckpt>/.metadata their index
    <ckpt>/hf/             save_pretrained export (safetensors + tokenizer), at the end and at requested steps
DCP stores its index with pickle; `SafeReader` unpickles it against an exact list of (module, name) pairs
(INDEX_GLOBALS), so loading a checkpoint never runs arbitrary code. Tensors are loaded with `weights_only=True` by DCP itself.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import json
import pickle
import time
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from raybiphase import storage
from raybiphase.checkpoint_meta import CheckpointMeta, read_meta
from raybiphase.data.framing import frame_like_pretraining
from raybiphase.errors import UserError
from raybiphase.telemetry.provenance import code_version


def _enum_member(cls, name: str):
    """The one use of `getattr` a metadata pickle may make: Python 3.11.0-3.11.4 pickle an Enum member as
    getattr(its class, its name) (DCP's WriteItemType, LoadItemType...); seen failing under Debian's 3.11.2."""
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum) and name in cls.__members__):
        raise pickle.UnpicklingError(f"its index asks for {getattr(cls, '__name__', cls)!r}.{name}, which is not a "
                                     "member of an allowed Enum")
    return cls[name]


INDEX_GLOBALS = frozenset({
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    *(("torch", name) for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)),
    ("torch.serialization", "_get_layout"),  # maps a layout's name to torch.strided and the like
    *(("pathlib", name) for name in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")),
    ("collections", "OrderedDict"),
    *(("builtins", name) for name in ("set", "frozenset", "slice", "tuple", "list", "dict")),
})
"""Every global a DCP index (`.metadata`) may name, as exact (module, name) pairs: its metadata classes, torch's
value types and a few containers. No prefix matches and no dotted names, so a crafted index cannot reach
`os.system` through a module that imports it (`torch.distributed.checkpoint.filesystem` + "os.system")."""


class _AllowListUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata classes and torch's plain value types (INDEX_GLOBALS); anything else is refused
    before it is looked up."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("builtins", "getattr"):  # only for an allowed class's Enum members
            return _enum_member
        if (module, name) not in INDEX_GLOBALS:
            raise pickle.UnpicklingError(f"its index names {module}.{name}, which a checkpoint index never holds")
        return super().find_class(module, name)


class SafeReader(dcp.FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        with open(Path(self.path) / ".metadata", "rb") as handle:
            metadata = _AllowListUnpickler(io.BytesIO(handle.read())).load()
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class Damaged(UserError):
    """A committed checkpoint whose files are missing, cut short or changed since its commit: `restore` passes
    over it to the one before."""


def _shard(rank: int) -> str:
    return f"__{rank}_0.distcp"


def _digests_file(rank: int) -> str:
    return f"__{rank}_0.sha256.json"


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def save_shards(path: Path, model, optimizer) -> None:
    """Every rank writes its shards to `path` (a local directory) and the SHA-256 of what it wrote beside them
    (hashed here, before any upload, so a copy damaged on its way is caught at load); no meta yet (`commit`)."""
    path.mkdir(parents=True, exist_ok=True)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path), single_file_per_rank=True))
    rank = _rank()
    written = [_shard(rank)] + ([".metadata"] if rank == 0 else [])
    (path / _digests_file(rank)).write_text(json.dumps({name: _sha256(path / name) for name in written}))


def save(path: Path, model, optimizer, meta: CheckpointMeta) -> None:
    """A whole checkpoint in a local directory: the shards, then (rank 0) the meta."""
    save_shards(path, model, optimizer)
    if _rank() == 0:
        commit(path, meta, ranks=dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1)


def _files(location: storage.Location) -> dict[str, int]:
    """Every file under a checkpoint folder but the meta, relative path -> bytes."""
    return {name: size for name, size in storage.list_tree(location).items() if name != storage.META}


def commit(location: storage.Location, meta: CheckpointMeta, *, ranks: int, wait_s: float = 120.0) -> None:
    """Write the meta of the checkpoint at `location` (a folder or a bucket) once every rank's shards and DCP's
    index are there, listing every file's size: the last write of a checkpoint. A RuntimeError when the shards
    do not all arrive within `wait_s` (the checkpoint then stays uncommitted)."""
    expected = {".metadata", *(name for rank in range(ranks) for name in (_shard(rank), _digests_file(rank)))}
    deadline = time.monotonic() + wait_s
    while not expected <= set(files := _files(location)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"checkpoint {location}: {sorted(expected - set(files))} never arrived; not committed")
        time.sleep(0.5)
    checksums = {name: digest for rank in range(ranks)
                 for name, digest in storage.read_json(storage.join(location, _digests_file(rank))).items()}
    meta = dataclasses.replace(meta, code_version=code_version(), files=files, checksums=checksums)
    storage.write_json(storage.meta_path(location), dataclasses.asdict(meta))


def check_files(location: storage.Location, meta: CheckpointMeta, name: str | None = None) -> None:
    """`Damaged` when a file the meta lists is missing or has another size (a copy cut short, a truncated
    object), or, in a local folder, when a shard's or the index's SHA-256 is not the one recorded at commit.
    `name`: where the checkpoint came from, when `location` is a local copy."""
    found = _files(location)
    bad = sorted(name for name, size in meta.files.items() if found.get(name) != size)
    if bad:
        raise Damaged(f"checkpoint: {name or location} is incomplete: {', '.join(bad[:3])} missing or of another size")
    if storage.is_uri(location):
        return  # digests are checked where the files are read: the local copy every load works on
    changed = sorted(name for name, digest in meta.checksums.items() if _sha256(Path(location, name)) != digest)
    if changed:
        raise Damaged(f"checkpoint: {name or location} is damaged: {', '.join(changed[:3])} changed since it was committed "
                      "(SHA-256)")


def committed(run_dir: storage.Location) -> Iterator[str]:
    """The checkpoints under a run's folder that have their meta (committed), newest first, each looked up only
    when the one before it is passed over."""
    for step in reversed(storage.checkpoint_steps(run_dir)):
        if storage.is_checkpoint(location := storage.join(run_dir, storage.checkpoint_name(step))):
            yield location


def latest_committed(run_dir: storage.Location) -> str | None:
    """The newest checkpoint under a run's folder that has its meta (committed), or None."""
    return next(committed(run_dir), None)


def load(path: str | Path, model, optimizer=None, *, name: str | None = None) -> CheckpointMeta:
    """Load weights (and the optimizer when given) in place from a checkpoint, its files checked against its meta
    first; returns the meta. An index that names anything but DCP's own classes (INDEX_GLOBALS) is one UserError
    naming the checkpoint (`name`: where it came from, when `path` is a local copy), before anything in it runs."""
    meta = read_meta(path)
    check_files(path, meta, name)
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    try:  # read here first: DCP would wrap the refusal in its own exception
        SafeReader(str(path)).read_metadata()
    except pickle.UnpicklingError as err:
        raise UserError(f"checkpoint {name or path}: refused: {err} (reading it could run code)") from None
    dcp.load(state, storage_reader=SafeReader(str(path)))
    # separate calls: the combined set_state_dict hung with FSDP2 on CPU (torch 2.13)
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optim"])
    return meta


def export_hf(path: Path, model, tokenizer_dir: Path, *, seq_len: int | None = None) -> None:
    """Gather full weights and write an HF folder loadable by stock AutoModelForMaskedLM (rank 0 writes), its tokenizer
    framing a text as pretraining did (`frame_like_pretraining`); with `seq_len`, its config says that length as
    max_position_embeddings (`record_trained_length`)."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if _rank() != 0:
        return
    from transformers import EuroBertForMaskedLM

    with torch.device("meta"):
        plain = EuroBertForMaskedLM(model.config)
    plain.load_state_dict(full, assign=True, strict=True)
    plain.save_pretrained(str(path), safe_serialization=True)
    save_tokenizer(tokenizer_dir, path)
    if seq_len is not None:
        record_trained_length(Path(path), seq_len)


def save_tokenizer(tokenizer_dir: Path, path: Path) -> None:
    """The tokenizer in `tokenizer_dir` written into the HF folder `path` (the same folder is fine), set to frame a
    text as pretraining did (`frame_like_pretraining`: `<bos> text <eos>` from a stock AutoTokenizer call)."""
    from transformers import AutoTokenizer

    frame_like_pretraining(AutoTokenizer.from_pretrained(str(tokenizer_dir))).save_pretrained(str(path))


LENGTH_FREE_ROPE = ("default", "linear", "llama3")
"""RoPE types whose frequencies do not read max_position_embeddings (transformers.modeling_rope_utils)."""


def record_trained_length(hf_folder: Path, seq_len: int) -> None:
    """Set the HF config's max_position_embeddings to `seq_len`, the length the run trained on. Our
    encoders' default RoPE does not read it, so the model's outputs stay the same; a decoder-initialised model
    whose RoPE scaling reads it (dynamic, yarn, longrope) keeps its value, as changing it would move its
    frequencies."""
    path = hf_folder / "config.json"
    config = json.loads(path.read_text())
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) in LENGTH_FREE_ROPE:
        config["max_position_embeddings"] = seq_len
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

