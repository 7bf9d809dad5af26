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
A bucket is untrusted input: whoever can write it can write every file of a checkpoint, its meta and digests
included. Loading one therefore never runs code it holds:
- DCP stores its index with pickle; `SafeReader` unpickles it against an exact list of (module, name) pairs
  (INDEX_GLOBALS).
- Every item of the index must point into a shard the meta lists with its size and SHA-256 (checked against the
  local copy before anything is read), within that size, with no transform (`check_index`); a meta without the
  digests of its index and shards is damaged. Only the optimizer's settings (`optim.param_groups.*`) may be byte
  items.
- Tensors are read by DCP itself with `torch.load(weights_only=True)`; byte items, which DCP's own planner
  unpickles whole, are read by `SafeLoadPlanner` with `weights_only=True` (plain numbers, tuples, lists).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import json
import pickle
import re
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
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


BYTE_ITEM = re.compile(r"optim\.param_groups\.\d+\.\w+")
"""The only items a checkpoint stores as bytes: the optimizer's settings per parameter group (lr, betas, ...)."""
SHARD = re.compile(r"__\d+_\d+\.distcp")
"""The only files an index's items may point into: the ranks' shards, beside it in the checkpoint folder."""


class ByteItemRefused(pickle.UnpicklingError):
    """A byte item that holds more than plain values (DCP reports it inside its own exception, as text)."""



class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading byte items with `weights_only=True` (DCP's own unpickles them whole)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError:
            raise ByteItemRefused(f"byte item {read_item.dest_index.fqn!r}") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def check_index(metadata, meta: CheckpointMeta, name: str) -> None:
    """UserError, in one line naming the checkpoint, when an item of the index is not what this code writes: bytes
    anywhere but the optimizer's settings (BYTE_ITEM), or a storage entry that points outside a shard the meta lists
    with its digest (SHARD), past its recorded size, or through a transform. Run before DCP reads any item."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    def refuse(what: str):
        return UserError(f"checkpoint {name}: refused: {what} (this code never writes one; reading it could run "
                         "code or read past its files)")

    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, BytesStorageMetadata):
            if not BYTE_ITEM.fullmatch(str(fqn)):
                raise refuse(f"its index stores {fqn!r} as bytes")
        elif not isinstance(item, TensorStorageMetadata):
            raise refuse(f"its index describes {fqn!r} as {type(item).__name__}")
    for index, info in (metadata.storage_data or {}).items():
        where = getattr(index, "fqn", index)
        if not isinstance(info, _StorageInfo):
            raise refuse(f"its index stores {where!r} as {type(info).__name__}")
        path, offset, length = info.relative_path, info.offset, info.length
        if not (isinstance(path, str) and SHARD.fullmatch(path) and path in meta.files and path in meta.checksums):
            raise refuse(f"its index points {where!r} into {path!r}, not a shard its meta lists with a digest")
        if not (type(offset) is int and type(length) is int and 0 <= offset and 0 <= length
                and offset + length <= meta.files[path]):
            raise refuse(f"its index points {where!r} at bytes {offset}+{length} of {path}, which holds "
                         f"{meta.files[path]}")
        if info.transform_descriptors:
            raise refuse(f"its index reads {where!r} through transforms {list(info.transform_descriptors)}")


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
    unsigned = sorted(n for n in meta.files if (n == ".metadata" or SHARD.fullmatch(n)) and n not in meta.checksums)
    if ".metadata" not in meta.files or unsigned:
        raise Damaged(f"checkpoint: {name or location} is damaged: its meta lists no digest of "
                      f"{', '.join(unsigned[:3]) or '.metadata'}")
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
    first (a meta that cannot be read, a file missing or changed: `Damaged`); returns the meta. An index that names anything but DCP's own classes (INDEX_GLOBALS) is one UserError
    naming the checkpoint (`name`: where it came from, when `path` is a local copy), before anything in it runs."""
    try:
        meta = read_meta(path)
    except UserError as err:  # a meta cut short or emptied: the checkpoint before it stands in (`restore`)
        if storage.exists(storage.meta_path(path)):
            raise Damaged(f"{err}; checkpoint {name or path} is damaged") from None
        raise
    check_files(path, meta, name)
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    try:  # read here first: DCP would wrap the refusal in its own exception
        metadata = SafeReader(str(path)).read_metadata()
    except pickle.UnpicklingError as err:
        raise UserError(f"checkpoint {name or path}: refused: {err} (reading it could run code)") from None
    check_index(metadata, meta, str(name or path))
    try:
        dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafeLoadPlanner())
    except CheckpointException as err:  # each rank's failure, gathered (a BaseException)
        refused = [str(failure) for failure, _ in err.failures.values() if isinstance(failure, ByteItemRefused)]
        if refused:
            raise UserError(f"checkpoint {name or path}: refused: a {refused[0]} (it holds more than plain values; "
                            "reading it could run code)") from None
        raise
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

