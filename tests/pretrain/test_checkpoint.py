"""Checkpoints: a save -> load round trip in process resumes bit for bit; loading never unpickles arbitrary objects."""

import enum
import hashlib
import io
import json
import os
import pickle

import pytest

from raybiphase.pretrain.checkpoint import SafeReader

SPECIALS = {"bos_token": 0, "eos_token": 1, "pad_token": 2, "mask_token": 3}
VOCAB = 97


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _global_call(module: str, name: str, argument: str, protocol: int) -> bytes:
    """A pickle that looks up module.name and calls it with one string, written opcode by opcode: GLOBAL (protocols
    0-3, names on one line) or STACK_GLOBAL (4 and 5, names from the stack, dotted names resolved by pickle)."""
    def text(value: str) -> bytes:
        data = value.encode()
        return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE

    if protocol >= 4:
        head = b"\x80" + bytes([protocol]) + text(module) + text(name) + b"\x93"  # STACK_GLOBAL
    else:
        head = (b"\x80" + bytes([protocol]) if protocol >= 2 else b"") + b"c" + f"{module}\n{name}\n".encode()
    argument_op = text(argument) if protocol >= 4 else b"X" + len(argument).to_bytes(4, "little") + argument.encode()
    return head + b"(" + argument_op + b"tR."  # MARK, the argument, TUPLE, REDUCE, STOP


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("module, name", [
    ("os", "system"),
    ("posix", "system"),
    ("torch.distributed.checkpoint.filesystem", "os.system"),  # a dotted name through a module that imports os
    ("torch.distributed.checkpoint.metadata", "torch.load"),  # a prefix the old allow-list matched
    ("torch.distributed.checkpoint.planner", "WriteItemType"),  # an existing class, but not an index's
    ("builtins", "eval"),
    ("torch", "load"),
])
def test_an_index_naming_anything_but_dcps_classes_is_refused_before_it_runs(tmp_path, protocol, module, name):
    if "." in name and protocol < 4:
        pytest.skip("GLOBAL (protocols 0-3) does not resolve dotted names")
    marker = tmp_path / "ran"
    (tmp_path / ".metadata").write_bytes(_global_call(module, name, f"touch {marker}", protocol))
    with pytest.raises(pickle.UnpicklingError, match=f"names {module}.{name}, which a checkpoint index never holds"):
        SafeReader(str(tmp_path)).read_metadata()
    assert not marker.exists()


def test_an_exploit_object_is_refused_in_every_protocol(tmp_path):
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        (tmp_path / ".metadata").write_bytes(pickle.dumps(_Exploit(), protocol=protocol))
        with pytest.raises(pickle.UnpicklingError, match="which a checkpoint index never holds"):
            SafeReader(str(tmp_path)).read_metadata()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_real_index_reads_back_in_every_protocol(tmp_path, protocol):
    """A model's and AdamW's index (tensors of several dtypes, bytes entries, the storage map) re-pickled in each
    protocol that names globals by (module, name) reads back equal."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer),
             "half": torch.ones(3, dtype=torch.bfloat16), "count": torch.tensor([7], dtype=torch.int64)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path), single_file_per_rank=True))
    metadata = pickle.loads((tmp_path / ".metadata").read_bytes())
    (tmp_path / ".metadata").write_bytes(pickle.dumps(metadata, protocol=protocol))
    read = SafeReader(str(tmp_path)).read_metadata()
    assert read.state_dict_metadata == metadata.state_dict_metadata and read.storage_data == metadata.storage_data


def test_a_crafted_index_in_a_committed_checkpoint_is_one_line_naming_it(tmp_path):
    """Through `load`, as a resume or a model.init_from start takes it: a UserError naming the checkpoint (not
    the local copy it was read from), the command never run. The crafted index is padded to the size the meta
    records: its SHA-256 gives it away; and with the meta's digest rewritten too (whoever can write a bucket can),
    the index's allow-list still refuses it."""
    from raybiphase.checkpoint_meta import CheckpointMeta
    from raybiphase.config import RunConfig, from_dict, to_dict
    from raybiphase.errors import UserError
    from raybiphase.pretrain import checkpoint

    run = from_dict(RunConfig, {"phases": {"steps": 10}, "data": {"seq_len": 16}, "resources": {"num_workers": 1},
                                "train": {"global_batch_tokens": 256, "micro_batch_size": 8},
                                "optim": {"warmup_steps": 2, "decay_steps": 2}})
    model, optimizer = _tiny(seed=0)
    checkpoint.save(tmp_path, model, optimizer, CheckpointMeta(run=to_dict(run), step=1, data_start=0, metrics={}))
    index, marker = tmp_path / ".metadata", tmp_path / "ran"
    crafted = _global_call("torch.distributed.checkpoint.filesystem", "os.system", f"touch {marker}", 4)
    index.write_bytes(crafted.ljust(index.stat().st_size, b"\0"))
    with pytest.raises(checkpoint.Damaged, match=r"^checkpoint: s3://bucket/run/step-1 is damaged: \.metadata"):
        checkpoint.load(tmp_path, _tiny(seed=1)[0], name="s3://bucket/run/step-1")  # the digest gives it away
    meta = json.loads((tmp_path / "meta.json").read_text())  # whoever can write the index can write the meta
    meta["checksums"][".metadata"] = hashlib.sha256(index.read_bytes()).hexdigest()
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"^checkpoint s3://bucket/run/step-1: refused: its index names "
                                        r"torch\.distributed\.checkpoint\.filesystem\.os\.system"):
        checkpoint.load(tmp_path, _tiny(seed=1)[0], name="s3://bucket/run/step-1")
    assert not marker.exists()


class _AsPython3112Pickles(pickle.Pickler):
    """Pickles an Enum member as Python 3.11.0-3.11.4 do: getattr(its class, its name)."""

    def reducer_override(self, obj):
        return (getattr, (type(obj), obj.name)) if isinstance(obj, enum.Enum) else NotImplemented


def _pickled_as_3112(obj) -> bytes:
    buffer = io.BytesIO()
    _AsPython3112Pickles(buffer).dump(obj)
    return buffer.getvalue()


def test_metadata_pickled_by_python_3_11_2_loads_its_enum_members_and_nothing_else(tmp_path):
    """Debian's Python 3.11.2 pickles DCP's metadata enums through getattr; the reader takes those (a real
    checkpoint's metadata, pickled that way, reads back equal) and refuses any other getattr."""
    import torch
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.arange(6.0).reshape(2, 3)}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "ckpt")))
    metadata = pickle.loads((tmp_path / "ckpt" / ".metadata").read_bytes())
    assert b"getattr" in _pickled_as_3112(metadata)  # its tensor properties hold an Enum member
    (tmp_path / "ckpt" / ".metadata").write_bytes(_pickled_as_3112(metadata))
    read = SafeReader(str(tmp_path / "ckpt")).read_metadata()
    assert read.state_dict_metadata == metadata.state_dict_metadata

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    class _Sneaky:  # an allowed Enum class, asked for something that is not one of its members
        def __reduce__(self):
            return (getattr, (_MEM_FORMAT_ENCODING, "__class__"))

    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Sneaky()))
    with pytest.raises(pickle.UnpicklingError, match="not a member of an allowed Enum"):
        SafeReader(str(tmp_path)).read_metadata()


def _train_step(model, optimizer, seed: int) -> None:
    import torch

    from raybiphase.pretrain.model import forward_loss

    ids = torch.randint(4, VOCAB, (2, 16), generator=torch.Generator().manual_seed(seed))
    forward_loss(model, {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}, "clm").backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _tiny(seed: int):
    from raybiphase.optim import adamw
    from raybiphase.pretrain.model import build_model

    model = build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=seed)
    return model, adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def test_save_then_load_in_process_resumes_bit_for_bit(tmp_path):
    """Weights, optimizer state and the typed meta come back; the next step is the same as without a restart."""
    import torch

    from raybiphase.checkpoint_meta import CheckpointMeta
    from raybiphase.config import RunConfig, from_dict, to_dict
    from raybiphase.pretrain import checkpoint

    run = from_dict(RunConfig, {"phases": {"steps": 10, "clm_share": 0.5}, "data": {"seq_len": 16},
                                "train": {"global_batch_tokens": 256, "micro_batch_size": 8},
                                "resources": {"num_workers": 1}, "optim": {"warmup_steps": 2, "decay_steps": 2}})
    model, optimizer = _tiny(seed=0)
    for step in range(3):
        _train_step(model, optimizer, step)
    meta = CheckpointMeta(run=to_dict(run), step=3, data_start=100, metrics={"step": 3, "val/clm_loss": 4.5})
    checkpoint.save(tmp_path, model, optimizer, meta)

    restored, restored_optimizer = _tiny(seed=1)  # other weights, no optimizer state: both come from the checkpoint
    loaded = checkpoint.load(tmp_path, restored, restored_optimizer)
    assert (loaded.run, loaded.step, loaded.data_start, loaded.metrics) == (meta.run, 3, 100, meta.metrics)
    assert loaded.code_version and loaded.config == run
    assert loaded.tokens_seen == 3 * 256 and loaded.data_end == 100 + 3 * 16  # 16 blocks of 16 tokens per step
    assert loaded.objective == "clm" and not loaded.decayed
    for name, tensor in model.state_dict().items():
        assert torch.equal(restored.state_dict()[name], tensor), name

    _train_step(model, optimizer, 3)
    _train_step(restored, restored_optimizer, 3)
    for name, tensor in model.state_dict().items():
        assert torch.equal(restored.state_dict()[name], tensor), name


def test_a_folder_without_meta_is_not_a_checkpoint(tmp_path):
    from raybiphase.errors import UserError
    from raybiphase.pretrain import checkpoint

    with pytest.raises(UserError, match="not a raybiphase checkpoint"):
        checkpoint.read_meta(tmp_path)
