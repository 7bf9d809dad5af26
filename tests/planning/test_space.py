"""Free space: a sweep whose plan writes more on this machine's disk than it holds free is refused in one line
before anything runs, naming the folder, its free bytes and the need; the need counts what the checkpoint policy
keeps, less what an earlier invocation already wrote. Against the real disk (shutil.disk_usage), with the paper's
own plan as the one that outgrows it."""

from __future__ import annotations

import io
import re
import shutil

import pytest

from raybiphase.errors import UserError
from tests.conftest import TINY_BASE


def test_the_papers_plan_with_its_checkpoints_kept_on_a_local_disk_is_refused_before_anything_runs(tmp_path,
                                                                                                   monkeypatch):
    from raybiphase.config import SweepSpec, load
    from raybiphase.planning import space
    from raybiphase.planning.preflight import plan_sweep
    from raybiphase.sweep.driver import run_sweep
    from raybiphase.telemetry.console import Console

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # the workers would run here: TMPDIR counts too
    spec = load(SweepSpec, "sweeps/paper.yaml", [f"sweep.storage={tmp_path / 'results'}"])
    out = io.StringIO()
    with pytest.raises(UserError) as raised:
        run_sweep(spec, console=Console(out))
    line = str(raised.value)
    resolved, plan = plan_sweep(spec, console=Console(io.StringIO()))
    need = sum(n.bytes for n in space.needs(plan, resolved) if n.setting == "sweep.storage")
    assert need > shutil.disk_usage(tmp_path).free  # 1b checkpoints of 16 GB each: terabytes in all
    assert "\n" not in line and re.match(rf"^sweep.storage \({re.escape(str(tmp_path / 'results'))}\)", line), line
    assert re.search(r": [\d.]+ [kMGT]B free \([\d,]+ bytes\), the plan needs [\d.]+ TB \([\d,]+ bytes\): ", line)
    assert f"{space._size(need)} for 277 checkpoints kept at 12 bytes a parameter" in line
    assert "pretraining:" not in out.getvalue() and not (tmp_path / "results" / "paper").exists()  # nothing ran


def test_the_need_is_what_the_policy_keeps_and_what_is_already_written_counts_against_it(tmp_path, monkeypatch):
    """Steps 2 and 6 are periodic saves, 4 ends CLM, 6 starts the decay, 8 ends the run (exported): with one
    periodic checkpoint kept, 4, 6 and 8 stay for good and 2 until the segment ends."""
    from raybiphase.config import SweepSpec, from_dict
    from raybiphase.planning import space
    from raybiphase.planning.plan import make_plan

    monkeypatch.setenv("RAY_ADDRESS", "auto")  # the workers run elsewhere: only sweep.storage is this machine's
    spec = from_dict(SweepSpec, {**TINY_BASE, "sweep": {"name": "s", "storage": str(tmp_path)}},
                     {"train.checkpoint_every": 2, "train.keep_checkpoints": 1})
    plan = make_plan(spec)
    (segment,) = plan.segments.values()
    checkpoint, export = (space.checkpoint_bytes(segment.config, export=e) for e in (False, True))
    assert export == checkpoint * 16 // 12
    assert space.storage_bytes(plan) == (3 * checkpoint + export, 3)  # 4, 6, 8 (exported) kept; 2 until pruned
    (need,) = space.needs(plan, spec)
    assert need.bytes == 3 * checkpoint + export
    written = tmp_path / "s" / "runs" / segment.id / "step-00000002"
    written.mkdir(parents=True)
    (written / "__0_0.distcp").write_bytes(b"\0" * 1000)  # a rerun: an earlier invocation wrote this much
    (need,) = space.needs(plan, spec)
    assert need.bytes == 3 * checkpoint + export - 1000 and "less 1.0 kB already written" in need.what
    space.check_space(plan, spec)  # a tiny model's checkpoints fit
