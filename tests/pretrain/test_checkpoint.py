"""Checkpoints: a save -> load round trip in process resumes bit for bit; loading never unpickles arbitrary objects."""

import enum
import io
import os
import pickle

import pytest

from raybiphase.pretrain.checkpoint import SafeReader

SPECIALS = {"bos_token": 0, "eos_token": 1, "pad_token": 2, "mask_token": 3}
VOCAB = 97


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_metadata_with_a_foreign_global_is_refused(tmp_path):
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        SafeReader(str(tmp_path)).read_metadata()


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
    from torch.distributed.checkpoint.planner import WriteItemType

    dcp.save({"w": torch.arange(6.0).reshape(2, 3)}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "ckpt")))
    metadata = pickle.loads((tmp_path / "ckpt" / ".metadata").read_bytes())
    assert b"getattr" in _pickled_as_3112(metadata)  # its tensor properties hold an Enum member
    (tmp_path / "ckpt" / ".metadata").write_bytes(_pickled_as_3112(metadata))
    read = SafeReader(str(tmp_path / "ckpt")).read_metadata()
    assert read.state_dict_metadata == metadata.state_dict_metadata

    class _Sneaky:
        def __reduce__(self):
            return (getattr, (WriteItemType, "__class__"))

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

    from raybiphase.config import RunConfig, from_dict, to_dict
    from raybiphase.pretrain import checkpoint
    from raybiphase.checkpoint_meta import CheckpointMeta

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
