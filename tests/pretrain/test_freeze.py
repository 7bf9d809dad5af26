"""Layer freezing during a phase: a phase's frozen blocks get no update and no moment change,
end the phase bit for bit as they began it, resume exactly from a checkpoint taken while frozen, and enter a run's
identity and the planner's comparison of steps only in the phases that set them."""

from __future__ import annotations

import pytest
import torch

from raybiphase.config import ConfigError, RunConfig, SweepSpec, from_dict, run_hash, weights_settings
from raybiphase.naming import frozen_tag, run_name
from raybiphase.optim import adamw, drop_grads, fill_fresh_state
from raybiphase.planning.plan import make_plan, shared_steps
from raybiphase.pretrain.model import block_parameters, build_model, forward_loss

OPTIM = {"lr": 1e-3, "warmup_steps": 2, "decay_steps": 4}
SPECIALS = {"bos_token": 0, "eos_token": 1, "pad_token": 2, "mask_token": 3}
VOCAB = 97


def _run(mlm: dict | None = None, size: str = "tiny") -> RunConfig:
    plan = [{"objective": "clm", "steps": 10}, {"objective": "mlm", "steps": 10, **(mlm or {})}]
    return from_dict(RunConfig, {"model": {"size": size}, "phases": {"steps": 20, "plan": plan}, "optim": OPTIM})


def _tiny():
    model = build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=0)
    return model, adamw(model, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)


def _step(model, optimizer, seed: int, frozen=()) -> None:
    ids = torch.randint(4, VOCAB, (2, 16), generator=torch.Generator().manual_seed(seed))
    forward_loss(model, {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}, "clm").backward()
    drop_grads(block_parameters(model, frozen))
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _clone(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow  # seconds of model training
def test_frozen_blocks_end_the_phase_bit_for_bit_as_they_began_it_and_the_others_train():
    model, optimizer = _tiny()
    _step(model, optimizer, 0)  # every block has moments before the freeze
    before = _clone(model)
    moments = {id(p): optimizer.state[p]["exp_avg"].clone() for p in block_parameters(model, (0,))}
    for seed in range(1, 4):
        _step(model, optimizer, seed, frozen=(0,))
    after = model.state_dict()
    frozen = [k for k in after if k.startswith("model.layers.0.")]
    assert frozen and all(torch.equal(after[k], before[k]) for k in frozen)
    assert all(torch.equal(optimizer.state[p]["exp_avg"], moments[id(p)]) for p in block_parameters(model, (0,)))
    trained = [k for k in after if k.startswith(("model.layers.1.", "model.embed_tokens", "model.norm"))]
    assert all(not torch.equal(after[k], before[k]) for k in trained)  # weight decay alone would move them


@pytest.mark.slow  # seconds of model training
def test_prefilled_state_steps_exactly_like_adamw_lazy_state():
    """fill_fresh_state writes what AdamW would create at a parameter's first update: the same update, bit for bit."""
    (lazy, lazy_opt), (filled, filled_opt) = _tiny(), _tiny()
    fill_fresh_state(filled_opt)
    assert len(filled_opt.state) == len(list(filled.parameters()))
    for seed in range(3):
        _step(lazy, lazy_opt, seed)
        _step(filled, filled_opt, seed)
    a, b = lazy.state_dict(), filled.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # seconds of model training
@pytest.mark.parametrize("fill", [True, False])
def test_a_checkpoint_taken_while_blocks_are_frozen_resumes_bit_for_bit(tmp_path, fill):
    """Blocks frozen from the first step have no AdamW state of their own; the loop fills it before the phase so
    the checkpoint holds it. Without that (`fill=False`), the checkpoint lacks their state and cannot be resumed
    (torch raises a CheckpointException, a BaseException)."""
    from raybiphase.checkpoint_meta import CheckpointMeta
    from raybiphase.config import to_dict
    from raybiphase.pretrain import checkpoint

    def frozen_phase(model, optimizer):
        if fill:
            fill_fresh_state(optimizer)
        for seed in range(2):
            _step(model, optimizer, seed, frozen=(0,))

    model, optimizer = _tiny()  # uninterrupted: 2 steps with block 0 frozen, then 2 with every block training
    frozen_phase(model, optimizer)
    for seed in range(2, 4):
        _step(model, optimizer, seed)

    resumed, resumed_opt = _tiny()
    frozen_phase(resumed, resumed_opt)
    meta = CheckpointMeta(run=to_dict(_run()), step=2, data_start=0, metrics={"step": 2})
    checkpoint.save(tmp_path, resumed, resumed_opt, meta)
    resumed, resumed_opt = _tiny()
    if not fill:
        with pytest.raises(BaseException, match="Missing key in checkpoint state_dict: optim.state.model.layers.0"):
            checkpoint.load(tmp_path, resumed, resumed_opt)
        return
    checkpoint.load(tmp_path, resumed, resumed_opt)
    for seed in range(2, 4):
        _step(resumed, resumed_opt, seed)
    a, b = model.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_frozen_layers_share_the_prefix_enter_the_name_and_only_runs_that_set_them():
    spec = from_dict(SweepSpec, {"model": {"size": "mini"}, "phases": {"steps": 20, "clm_share": 0.5},
                                 "optim": OPTIM, "sweep": {"runs": [
                                     {"phases.plan": [{"objective": "clm", "steps": 10},
                                                      {"objective": "mlm", "steps": 10, "frozen_layers": frozen}]}
                                     for frozen in ([0, 1], [2])]}})
    plan = make_plan(spec)
    base, low, high = plan.runs.values()
    for other in (low, high):
        assert shared_steps(base, other) == 10 and other.segments[0] == base.segments[0]  # the CLM prefix is shared
    assert len({base.segments[1], low.segments[1], high.segments[1]}) == 3
    assert "-mlm40f2-20-" in low.name and "-mlm40f2to2-20-" in high.name and "-mlm40-20-" in base.name
    assert "frozen_layers" not in str(weights_settings(_run(size="mini")))  # runs without the knob keep their names
    assert run_hash(_run({"frozen_layers": [0]}, "mini")) != run_hash(_run({"frozen_layers": [1]}, "mini"))
    assert run_name(_run({"frozen_layers": [0]}, "mini")).endswith(run_hash(_run({"frozen_layers": [0]}, "mini")))


@pytest.mark.parametrize("layers, tag", [((), ""), ((0, 1, 2), "f3"), ((4, 5, 6, 7), "f4to7"), ((1, 5), "f2x")])
def test_frozen_tags(layers, tag):
    assert frozen_tag(layers) == tag


@pytest.mark.parametrize("frozen, key, words", [
    ([2], "phases.plan.1.frozen_layers", "out of range; tiny has blocks 0 to 1"),
    ([-1], "phases.plan.1.frozen_layers", "integers from 0"),
    ([1, 0], "phases.plan.1.frozen_layers", "increasing order"),
    ([0, 0], "phases.plan.1.frozen_layers", "each block once"),
    ([0, 1], "phases.plan.1.frozen_layers", "leave at least one block training"),
    (["a"], "phases.plan.1.frozen_layers.0", ""),
])
def test_bad_frozen_layers_are_one_line_errors(frozen, key, words):
    with pytest.raises(ConfigError) as err:
        _run({"frozen_layers": frozen})
    assert str(err.value).startswith(key) and words in str(err.value) and "\n" not in str(err.value)


def test_frozen_layers_are_checked_against_the_depth_of_a_decoder_the_run_starts_from(small_shards, tmp_path):
    """A run continued from a decoder trains the decoder's blocks, not model.size's: blocks it has may be frozen
    whatever the size says, one it lacks stops `raybiphase pretrain` and the sweep's plan before anything runs."""
    import json

    from raybiphase.checkpoint_meta import check_blocks
    from raybiphase.config import ConfigError
    from raybiphase.planning.preflight import plan_sweep
    from raybiphase.pretrain.trainer import run_pretrain
    from tests.conftest import SMALL_DATA, TINY_BASE

    decoder = tmp_path / "decoder"
    decoder.mkdir()
    (decoder / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4}))

    def spec(frozen: list[int]) -> SweepSpec:
        plan = [{"objective": "clm", "steps": 4}, {"objective": "mlm", "steps": 4, "frozen_layers": frozen}]
        return from_dict(SweepSpec, {**TINY_BASE, "model": {"size": "tiny", "init_from": str(decoder)},
                                     "data": {**SMALL_DATA, "dir": small_shards[0].dir},
                                     "phases": {"steps": 8, "plan": plan}, "sweep": {"storage": str(tmp_path / "out")}})

    check_blocks(spec([2, 3]).run)  # tiny has 2 blocks, the decoder 4
    for frozen in ([4], [0, 1, 2, 3]):
        for start in (run_pretrain, plan_sweep):
            with pytest.raises(ConfigError) as err:
                start(spec(frozen))
            assert str(err.value).startswith("phases.plan.1.frozen_layers: ") and "\n" not in str(err.value)
            assert ("the decoder in model.init_from" in str(err.value) and "blocks 0 to 3" in str(err.value)
                    if frozen == [4] else "all 4 blocks frozen" in str(err.value))
