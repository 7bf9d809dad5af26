"""The optimizer at the objective switch: carry AdamW's moments (the paper's one WSD run) or
reset them with an optional re-warmup (Ettin's cross-objective recipe); carry and reset share every step before
the switch."""

from __future__ import annotations

import pytest
import torch

from raybiphase.config import ConfigError, RunConfig, SweepSpec, from_dict, run_hash, weights_settings
from raybiphase.naming import run_name
from raybiphase.optim import adamw, reset_moments
from raybiphase.phases import Schedule
from raybiphase.planning.plan import make_plan, shared_steps

OPTIM = {"lr": 1e-3, "warmup_steps": 2, "decay_steps": 4}


def _run(mlm: dict | None = None, steps: int = 20) -> RunConfig:
    plan = [{"objective": "clm", "steps": steps // 2}, {"objective": "mlm", "steps": steps // 2, **(mlm or {})}]
    return from_dict(RunConfig, {"phases": {"steps": steps, "plan": plan}, "optim": OPTIM})


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))


def _step(model, optimizer, seed: int) -> None:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed))
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()


def test_a_reset_leaves_no_moment_and_steps_like_a_fresh_optimizer():
    model, other = _model(), _model()
    kept = adamw(model, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for seed in range(3):
        _step(model, kept, seed)
    other.load_state_dict(model.state_dict())  # the same weights, a fresh optimizer
    fresh = adamw(other, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    reset_moments(kept)
    assert len(kept.state) == 0  # no moment, no step count
    _step(model, kept, 7)
    _step(other, fresh, 7)
    for a, b in zip(model.parameters(), other.parameters()):
        assert torch.equal(a, b)  # bias correction restarts too: the same update to the bit
    assert all(float(kept.state[p]["exp_avg"].abs().sum()) > 0 for p in model.parameters())


def test_the_learning_rate_warms_up_again_after_a_reset():
    carry, reset = Schedule.from_config(_run()), Schedule.from_config(_run({"optimizer": "reset",
                                                                            "rewarmup_steps": 4}))
    for step in range(10):
        assert reset.lr(step) == carry.lr(step) and not reset.resets_optimizer(step)  # before the switch: the same
    assert reset.resets_optimizer(10) and not reset.resets_optimizer(11) and not carry.resets_optimizer(10)
    for step in range(10, 14):
        assert reset.lr(step) == pytest.approx(carry.lr(step) * (step - 9) / 4)  # the ramp over 4 steps
    assert [reset.lr(s) for s in range(14, 20)] == [carry.lr(s) for s in range(14, 20)]  # then the run's WSD rate


def test_carry_and_reset_share_everything_before_the_switch_and_are_named_apart():
    spec = from_dict(SweepSpec, {"phases": {"steps": 20, "clm_share": 0.5}, "optim": OPTIM,
                                 "sweep": {"runs": [{"phases.plan": [
                                     {"objective": "clm", "steps": 10},
                                     {"objective": "mlm", "steps": 10, "optimizer": "reset", "rewarmup_steps": 2}]}]}})
    plan = make_plan(spec)
    carry, reset = plan.runs.values()
    assert shared_steps(carry, reset) == 10  # the switch: the first step after a reset is another step
    assert set(carry.segments) & set(reset.segments) == {carry.segments[0]}
    assert plan.segments[carry.segments[0]].end == 10
    assert "-mlm40r-20-" in reset.name and "-mlm40-20-" in carry.name
    assert "optimizer" not in str(weights_settings(_run()))  # runs without the knob keep their names
    assert run_hash(_run()) != run_hash(_run({"optimizer": "reset"}))
    assert run_name(_run({"optimizer": "reset"})).endswith(run_hash(_run({"optimizer": "reset"})))


@pytest.mark.parametrize("mlm, first, key", [
    ({"rewarmup_steps": 3}, {}, "phases.plan.1.rewarmup_steps"),
    ({"optimizer": "reset", "rewarmup_steps": 11}, {}, "phases.plan.1.rewarmup_steps"),
    ({"optimizer": "restart"}, {}, "phases.plan.1.optimizer"),
    ({}, {"optimizer": "reset"}, "phases.plan.0.optimizer"),
])
def test_bad_optimizer_settings_are_one_line_errors(mlm, first, key):
    plan = [{"objective": "clm", "steps": 10, **first}, {"objective": "mlm", "steps": 10, **mlm}]
    with pytest.raises(ConfigError) as err:
        from_dict(RunConfig, {"phases": {"steps": 20, "plan": plan}, "optim": OPTIM})
    assert str(err.value).startswith(f"{key}") and "\n" not in str(err.value)
