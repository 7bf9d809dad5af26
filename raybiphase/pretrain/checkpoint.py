"""Checkpoints: sharded weights and optimizer (torch.distributed.checkpoint) plus `meta.json`; HF exports.

One loader serves resume, branching, continued pretraining and fine-tuning:
    <ckpt>/meta.json       resolved config, step, tokens seen, phase, data position, code version
    <ckpt>/__*_*.distcp    DCP shards of {"model": ..., "optim": ...}; <ckpt>/.metadata their index
    <ckpt>/hf/             save_pretrained export (safetensors + tokenizer), at the end and at requested steps
DCP stores its index with pickle; `SafeReader` unpickles it with an allow-list, so loading a checkpoint never
runs arbitrary code. Tensors are loaded with `weights_only=True` by DCP itself.
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
from pathlib import Path

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

from raybiphase import __version__
from raybiphase.cli import UserError

META = "meta.json"
HF_DIR = "hf"


class _AllowListUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata classes and torch's plain value types; anything else is refused."""

    def find_class(self, module: str, name: str):
        allowed = (
            module.startswith("torch.distributed.checkpoint.")
            or (module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)))
            or (module == "torch.serialization" and name == "_get_layout")  # maps a name to torch.strided etc.
            or (module == "pathlib" and name in {"Path", "PosixPath", "PurePosixPath", "WindowsPath"})
            or (module == "collections" and name == "OrderedDict")
            or (module == "builtins" and name in {"set", "frozenset", "slice", "tuple", "list", "dict"})
        )
        if not allowed:
            raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which is not allowed")
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


def code_version() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+{sha}" if sha else __version__


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def save(path: Path, model, optimizer, meta: dict) -> None:
    """Every rank writes its shards to `path` (a local directory); rank 0 writes meta.json."""
    path.mkdir(parents=True, exist_ok=True)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path), single_file_per_rank=True))
    if _rank() == 0:
        (path / META).write_text(json.dumps({**meta, "code_version": code_version()}, indent=1))


def read_meta(path: str | Path) -> dict:
    meta = Path(path) / META
    if not meta.is_file():
        raise UserError(f"checkpoint: {path} is not a raybiphase checkpoint (no {META})")
    return json.loads(meta.read_text())


def load(path: str | Path, model, optimizer=None) -> dict:
    """Load weights (and the optimizer when given) in place from a checkpoint; returns its meta."""
    meta = read_meta(path)
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    dcp.load(state, storage_reader=SafeReader(str(path)))
    # separate calls: the combined set_state_dict hung with FSDP2 on CPU (../shared/design.md)
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optim"])
    return meta


def export_hf(path: Path, model, tokenizer_dir: Path) -> None:
    """Gather full weights and write an HF folder loadable by stock AutoModelForMaskedLM (rank 0 writes)."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if _rank() != 0:
        return
    from transformers import AutoTokenizer, EuroBertForMaskedLM

    with torch.device("meta"):
        plain = EuroBertForMaskedLM(model.config)
    plain.load_state_dict(full, assign=True, strict=True)
    plain.save_pretrained(str(path), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(path))
