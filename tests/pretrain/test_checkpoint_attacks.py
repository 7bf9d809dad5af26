"""A checkpoint written by whoever can write the bucket: its index may name only allowed classes and still point an
item anywhere, and its meta's sizes and digests can be recomputed to match. Each crafted checkpoint below is refused
by `checkpoint.load` (what resume, model.init_from and `raybiphase export` all call) in one line naming the
checkpoint, before any byte item is read: the payload it carries never runs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
from pathlib import Path

import pytest

from tests.pretrain.test_checkpoint import _tiny, _train_step

NAME = "s3://bucket/sweep/runs/seg/step-00000001"
PACKAGE = Path(__file__).resolve().parents[2] / "raybiphase"


class _Payload:
    """What an attacker hides in a checkpoint: unpickled with weights_only=False, it creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _saved(tmp_path: Path) -> Path:
    from raybiphase.checkpoint_meta import CheckpointMeta
    from raybiphase.config import RunConfig, from_dict, to_dict
    from raybiphase.pretrain import checkpoint

    run = from_dict(RunConfig, {"phases": {"steps": 10}, "data": {"seq_len": 16}, "resources": {"num_workers": 1},
                                "train": {"global_batch_tokens": 256, "micro_batch_size": 8},
                                "optim": {"warmup_steps": 2, "decay_steps": 2}})
    model, optimizer = _tiny(seed=0)
    _train_step(model, optimizer, 0)
    folder = tmp_path / "ckpt"
    checkpoint.save(folder, model, optimizer, CheckpointMeta(run=to_dict(run), step=1, data_start=0, metrics={}))
    return folder


def _index(folder: Path):
    with open(folder / ".metadata", "rb") as source:
        return pickle.load(source)  # the test's own checkpoint: plain pickle is fine here


def _rewrite(folder: Path, metadata, *, meta_edit=None) -> None:
    """Write `metadata` as the index and make the meta agree with every file, as an attacker with the bucket can."""
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    meta = json.loads((folder / "meta.json").read_text())
    for name in list(meta["files"]):
        meta["files"][name] = (folder / name).stat().st_size
        if name in meta["checksums"]:
            meta["checksums"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    if meta_edit:
        meta_edit(meta)
    (folder / "meta.json").write_text(json.dumps(meta))


def _append_payload(folder: Path, marker: Path) -> tuple[int, int]:
    """A torch.save'd payload appended to rank 0's shard: its offset and length."""
    import torch

    buffer = io.BytesIO()
    torch.save(_Payload(marker), buffer)
    shard = folder / "__0_0.distcp"
    offset = shard.stat().st_size
    with open(shard, "ab") as out:
        out.write(buffer.getvalue())
    return offset, len(buffer.getvalue())


def _refused(folder: Path, marker: Path, pattern: str) -> str:
    from raybiphase.errors import UserError
    from raybiphase.pretrain import checkpoint

    model, optimizer = _tiny(seed=1)
    with pytest.raises(UserError) as raised:
        checkpoint.load(folder, model, optimizer, name=NAME)
    line = str(raised.value)
    assert "\n" not in line and re.match(pattern, line), line
    assert not marker.exists()  # the payload never ran
    return line


def test_an_optimizer_setting_pointed_at_an_appended_payload_is_refused(tmp_path):
    """The index names only allowed classes, the digests match; the item is a byte item DCP would unpickle
    whole. The allowed byte item, pointed at the payload, is read with weights_only=True: refused."""
    folder, marker = _saved(tmp_path), tmp_path / "ran"
    offset, length = _append_payload(folder, marker)
    metadata = _index(folder)
    key = next(k for k in metadata.storage_data if k.fqn == "optim.param_groups.0.lr")
    metadata.storage_data[key].offset, metadata.storage_data[key].length = offset, length
    _rewrite(folder, metadata)
    _refused(folder, marker, rf"^checkpoint {NAME}: refused: a byte item 'optim.param_groups.0.lr' \(it holds more "
                             r"than plain values; reading it could run code\)$")


def test_a_model_weight_redeclared_as_bytes_is_refused(tmp_path):
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    folder, marker = _saved(tmp_path), tmp_path / "ran"
    offset, length = _append_payload(folder, marker)
    metadata = _index(folder)
    fqn = next(k for k in metadata.state_dict_metadata if k.startswith("model."))
    metadata.state_dict_metadata[fqn] = BytesStorageMetadata()
    for key in [k for k in metadata.storage_data if k.fqn == fqn]:
        del metadata.storage_data[key]
    from torch.distributed.checkpoint.metadata import MetadataIndex

    metadata.storage_data[MetadataIndex(fqn)] = type(next(iter(metadata.storage_data.values())))(
        relative_path="__0_0.distcp", offset=offset, length=length)
    _rewrite(folder, metadata)
    _refused(folder, marker, rf"^checkpoint {NAME}: refused: its index stores '{re.escape(fqn)}' as bytes")


def test_an_item_in_a_file_outside_the_checkpoint_with_no_digests_is_refused(tmp_path):
    """`relative_path` pointing out of the folder, and a meta that lists no files nor digests (so no size check
    could catch it): the meta is damaged, before the index is even read."""
    from raybiphase.pretrain import checkpoint

    folder, marker = _saved(tmp_path), tmp_path / "ran"
    import torch

    torch.save(_Payload(marker), tmp_path / "outside.pt")
    metadata = _index(folder)
    key = next(k for k in metadata.storage_data if k.fqn == "optim.param_groups.0.lr")
    metadata.storage_data[key].relative_path = "../outside.pt"
    metadata.storage_data[key].offset, metadata.storage_data[key].length = 0, (tmp_path / "outside.pt").stat().st_size

    def no_lists(meta):
        meta["files"], meta["checksums"] = {}, {}

    original = (folder / "meta.json").read_text()
    _rewrite(folder, metadata, meta_edit=no_lists)
    with pytest.raises(checkpoint.Damaged, match=rf"^checkpoint: {NAME} is damaged: its meta lists no digest of "
                                                  r"\.metadata$"):
        checkpoint.load(folder, *_tiny(seed=1), name=NAME)
    (folder / "meta.json").write_text(original)
    _rewrite(folder, metadata)  # the meta's lists restored: the index still points out of the folder
    _refused(folder, marker, rf"^checkpoint {NAME}: refused: its index points 'optim.param_groups.0.lr' into "
                             r"'\.\./outside\.pt', not a shard its meta lists with a digest")


def test_an_item_longer_than_its_shard_is_refused_before_anything_is_read(tmp_path):
    folder, marker = _saved(tmp_path), tmp_path / "ran"
    metadata = _index(folder)
    key = next(k for k in metadata.storage_data if k.fqn == "optim.param_groups.0.lr")
    metadata.storage_data[key].length = 1_500_000_000
    _rewrite(folder, metadata)
    _refused(folder, marker, rf"^checkpoint {NAME}: refused: its index points 'optim.param_groups.0.lr' at bytes "
                             r"\d+\+1500000000 of __0_0\.distcp, which holds \d+")


def test_a_real_checkpoint_loads_with_every_torch_load_weights_only(tmp_path, monkeypatch):
    """Held at run time: loading our own checkpoint calls torch.load only with weights_only=True."""
    import torch

    from raybiphase.pretrain import checkpoint

    folder, seen = _saved(tmp_path), []
    load = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    checkpoint.load(folder, *_tiny(seed=1), name=NAME)
    assert seen and set(seen) == {True}


def test_no_code_path_unpickles_what_it_reads_whole():
    """Held in the source: no `weights_only=False`, no plain `pickle.load(s)` and no `dcp.load` but the one in
    raybiphase/pretrain/checkpoint.py (behind its checks)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if "weights_only=False" in text or re.search(r"\bpickle\.loads?\(", text):
            offenders.append(str(path.relative_to(PACKAGE)))
        if "dcp.load(" in text and path.name != "checkpoint.py":
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def test_a_newest_checkpoint_whose_meta_was_cut_short_is_passed_over_for_the_one_before(tmp_path, capsys):
    """A resume reads the newest committed checkpoint; one whose meta.json is half written or empty is damaged
    like one whose shard is, and the sound checkpoint before it is resumed from, said in a line."""
    from raybiphase import storage
    from raybiphase.checkpoint_meta import CheckpointMeta
    from raybiphase.config import RunConfig, from_dict, to_dict
    from raybiphase.pretrain import checkpoint, loop

    run = from_dict(RunConfig, {"phases": {"steps": 10}, "data": {"seq_len": 16}, "resources": {"num_workers": 1},
                                "train": {"global_batch_tokens": 256, "micro_batch_size": 8},
                                "optim": {"warmup_steps": 2, "decay_steps": 2}})
    run_dir = tmp_path / "seg"
    model, optimizer = _tiny(seed=0)
    for step in (1, 2):
        _train_step(model, optimizer, step)
        checkpoint.save(run_dir / storage.checkpoint_name(step), model, optimizer,
                        CheckpointMeta(run=to_dict(run), step=step, data_start=0, metrics={}))
    newest = run_dir / storage.checkpoint_name(2) / storage.META
    for damage in (newest.read_text()[: len(newest.read_text()) // 2], ""):
        newest.write_text(damage)
        assert loop.restore(run, *_tiny(seed=1), None, str(run_dir))[0] == 1
        said = capsys.readouterr().out
        assert re.search(rf"is corrupt \(not JSON\); checkpoint {re.escape(str(newest.parent))} is damaged; resuming "
                         "from the committed checkpoint before it", said), said
