"""Phases as data and one WSD learning rate over the run."""

import numpy as np
import pytest

from raybiphase.config import SweepSpec, from_dict
from raybiphase.phases import Schedule


def _schedule(steps=20, share=0.5, warmup=4, decay=4, **phases):
    cfg = from_dict(SweepSpec, {"phases": {"steps": steps, "clm_share": share, **phases},
                            "optim": {"lr": 1e-3, "warmup_steps": warmup, "decay_steps": decay}})
    return Schedule.from_config(cfg.run)


def test_wsd_warms_up_holds_and_decays_linearly_to_zero():
    s = _schedule()
    lrs = [s.at(t)[1] for t in range(20)]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[4:16] == [1e-3] * 12
    assert lrs[16:] == pytest.approx([8e-4, 6e-4, 4e-4, 2e-4])  # the step after the last would be 0
    assert s.decay_start == 16


def test_phases_switch_at_their_boundary():
    s = _schedule()
    assert [s.at(t)[0].objective for t in range(20)] == ["clm"] * 10 + ["mlm"] * 10
    assert s.at(10)[0].mask_ratio == 0.4 and s.boundaries == (0, 10, 20)


def test_any_number_of_phases():
    plan = [{"objective": "mlm", "steps": 5, "mask_ratio": 0.2}, {"objective": "clm", "steps": 5},
            {"objective": "mlm", "steps": 10}]
    s = _schedule(share=None, plan=plan)
    assert [(p.objective, p.steps, p.mask_ratio) for p in s.phases] == [("mlm", 5, 0.2), ("clm", 5, None), ("mlm", 10, 0.4)]
    assert s.phase_index(12) == 2


def test_until_decay_the_lr_does_not_depend_on_the_run_length():
    short, long = _schedule(steps=20), _schedule(steps=40, share=0.25)
    assert [short.lr(t) for t in range(16)] == [long.lr(t) for t in range(16)]
    assert short.lr(16) != long.lr(16)


def test_steps_outside_the_run_are_refused():
    with pytest.raises(IndexError, match="outside the run's 20 steps"):
        _schedule().at(20)


def test_a_run_is_a_few_pieces_whose_rules_give_every_step_s_rate():
    """Pieces cover the run in order, grow with the phases and not the steps, and their rules, evaluated on a numpy
    range, give bit for bit the rates Schedule.lr gives step by step (a re-warmup and a ratio schedule included)."""
    plan = [{"objective": "clm", "steps": 300}, {"objective": "mlm", "steps": 500, "mask_ratio_end": 0.15},
            {"objective": "mlm", "steps": 200, "optimizer": "reset", "rewarmup_steps": 50}]
    s = _schedule(steps=1000, share=None, warmup=100, decay=100, plan=plan)
    pieces = s.pieces()
    assert [p.start for p in pieces[1:]] == [p.end for p in pieces[:-1]] and pieces[-1].end == 1000
    assert len(pieces) == 7  # warmup, stable CLM, MLM, the reset step, its re-warmup, stable, decay
    rates = np.concatenate([np.broadcast_to(p.lr.at(np.arange(p.start, p.end)), (p.end - p.start,)) for p in pieces])
    assert rates.tolist() == [s.lr(t) for t in range(1000)]
    assert s.piece_at(800).kind.reset and not s.piece_at(801).kind.reset
    assert s.piece_at(300).mask_ratio.at(799) == pytest.approx(0.15)
