"""Bad data stops a sweep in one line before Ray starts (the unit layer refuses `ray.init`), and leaves nothing
behind: a missing or corrupt shard, a corrupt manifest, a source or tokenizer that does not exist."""

from __future__ import annotations

import io
import shutil

import pytest

from raybiphase.data.prepare import shard_name
from raybiphase.errors import UserError
from tests.conftest import SMALL_DATA, TINY_BASE


def _sweep(tmp_path, data_dir, **data):
    from raybiphase.config import SweepSpec, from_dict
    from raybiphase.sweep.driver import run_sweep
    from raybiphase.telemetry.console import Console

    spec = {**TINY_BASE, "sweep": {"name": "bad-data", "storage": str(tmp_path / "results")},
            "data": {**SMALL_DATA, "dir": str(data_dir), **data}}
    out = io.StringIO()
    with pytest.raises(UserError) as err:
        run_sweep(from_dict(SweepSpec, spec), console=Console(out))
    assert "\n" not in str(err.value) and "pretraining:" not in out.getvalue()
    assert not (tmp_path / "results" / "bad-data").exists()  # no sweep folder (nor report header) of a sweep never run
    return str(err.value)


@pytest.fixture
def shards(small_shards, tmp_path):
    target = tmp_path / "shards"
    shutil.copytree(small_shards[1].dir, target)
    return target


def test_a_corrupt_shard_stops_the_sweep_before_ray(shards, tmp_path):
    path = shards / shard_name(0, 1)
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    path.write_bytes(bytes(damaged))
    assert _sweep(tmp_path, shards).endswith(f"{shard_name(0, 1)} is corrupt (its sha256 differs from the manifest)")


def test_a_missing_shard_or_a_corrupt_manifest_stops_the_sweep_before_ray(shards, tmp_path):
    (shards / shard_name(0, 2)).unlink()
    assert f"shard {shard_name(0, 2)} listed in the manifest is missing" in _sweep(tmp_path, shards)
    (shards / "manifest.json").write_text("{not json")
    assert _sweep(tmp_path, shards).endswith("manifest.json is corrupt (not JSON)")


def test_an_unknown_source_or_tokenizer_stops_the_sweep_before_ray(tmp_path):
    assert _sweep(tmp_path, tmp_path / "new", source="no-such-source").startswith("data.source: 'no-such-source'")
    message = _sweep(tmp_path, tmp_path / "new", tokenizer="no-such-tokenizer")
    assert message.startswith("data.tokenizer: 'no-such-tokenizer' is neither 'train-bpe' nor an existing folder")
    assert not (tmp_path / "new").exists()  # no half-made dataset


def test_a_bad_number_in_the_environment_is_one_line_before_ray(tmp_path, monkeypatch, capsys):
    import sys

    from raybiphase.commands import run_main, sweep

    for name, storage in (("RAYBIPHASE_STORAGE_RETRY_S", "s3://some-bucket/results"),  # read by the bucket check
                          ("RAYBIPHASE_PROGRESS_S", str(tmp_path / "results"))):  # read as the sweep starts
        monkeypatch.setenv(name, "ten")
        monkeypatch.setattr(sys, "argv", ["raybiphase sweep", "sweeps/quickstart.yaml", "--set",
                                          f"sweep.storage={storage}"])
        with pytest.raises(SystemExit) as exit_info:
            run_main(sweep.main)
        assert exit_info.value.code == 2
        assert capsys.readouterr().err == f"error: {name}: 'ten' is not a number >= 0\n"
        monkeypatch.delenv(name)


def test_pretrain_checks_its_starting_points_before_ray(small_shards, tmp_path):
    from raybiphase.config import SweepSpec, from_dict
    from raybiphase.pretrain.trainer import run_pretrain

    spec = {**TINY_BASE, "sweep": {"name": "alone", "storage": str(tmp_path)},
            "data": {**SMALL_DATA, "dir": small_shards[1].dir}}
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="^model.init_from: .*/empty is neither a raybiphase checkpoint"):
        run_pretrain(from_dict(SweepSpec, spec, {"model.init_from": str(tmp_path / "empty")}))
    with pytest.raises(UserError, match="^--resume-from: .*/empty is not a raybiphase checkpoint"):
        run_pretrain(from_dict(SweepSpec, spec), resume_from=str(tmp_path / "empty"))
    (tmp_path / "empty" / "meta.json").write_text("{")
    with pytest.raises(UserError, match="^checkpoint: .*/empty/meta.json is corrupt \\(not JSON\\)$"):
        run_pretrain(from_dict(SweepSpec, spec, {"model.init_from": str(tmp_path / "empty")}))
    (tmp_path / "empty" / "meta.json").write_text("{}")
    with pytest.raises(UserError, match="^checkpoint: .*/empty/meta.json is incomplete \\(no "):
        run_pretrain(from_dict(SweepSpec, spec, {"model.init_from": str(tmp_path / "empty")}))


def test_validate_refuses_what_the_sweep_would_refuse_in_its_grid_and_runs(tmp_path, monkeypatch, capsys):
    import sys

    import yaml

    from raybiphase.commands import run_main, validate

    for sweep in ({"grid": {"phases.mask_ratio": [0.3, 1.5]}}, {"runs": [{"model.init_from": "@no-such-run"}]}):
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump({"sweep": {"name": "v", "storage": str(tmp_path), **sweep}}))
        monkeypatch.setattr(sys, "argv", ["raybiphase validate", str(spec)])
        with pytest.raises(SystemExit) as exit_info:
            run_main(validate.main)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err


def test_fine_tuning_longer_than_pretraining_is_refused_before_anything_runs():
    from raybiphase.config import ConfigError, SweepSpec, load
    from raybiphase.planning.preflight import plan_sweep
    from raybiphase.telemetry.console import Console

    spec = load(SweepSpec, "sweeps/quickstart.yaml", ["finetune.max_len=4096"])
    with pytest.raises(ConfigError, match="^finetune.max_len: 4096 exceeds the 128-token blocks run tiny-"):
        plan_sweep(spec, dry_run=True, console=Console(io.StringIO()))


def test_a_stale_record_of_a_ray_start_cluster_is_said_before_ray_starts(tmp_path, monkeypatch, capsys):
    """Ray reads this machine's record of the last `ray start` cluster (under RAY_TMPDIR): a plain ray.init() then
    hangs on it, and a local cluster's Train fits wait on it; the driver says so, with the fix."""
    from raybiphase.raycluster import say_other_clusters

    stale = "Ray: this machine's record of a `ray start` cluster names one that no longer runs (10.0.0.9:6379); " \
            "`ray stop` clears it\n"
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    say_other_clusters()
    assert "no longer runs" not in capsys.readouterr().out  # no record: nothing stale to say
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.9:6379")
    say_other_clusters()
    assert capsys.readouterr().out.endswith(stale)  # after a line on this session's own Ray, when it runs


def test_a_grid_over_a_setting_that_never_changes_the_weights_is_refused():
    """Its values would all make one run (the name is the weights' settings): the grid would silently shrink."""
    from raybiphase.config import ConfigError, SweepSpec, load

    with pytest.raises(ConfigError, match="^sweep.grid.train.eval_every: never changes a run's weights"):
        load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.grid={train.eval_every: [10, 20]}"])
    with pytest.raises(ConfigError, match="^sweep.grid.resources.num_workers: never changes"):
        load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.grid={resources.num_workers: [1, 2]}"])
    load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.grid={train.seed: [0, 1], train.eval_every: [10]}"])


def test_a_sweep_on_its_own_ray_that_asks_for_more_than_the_machine_has_is_refused_naming_the_setting():
    """A local Ray has no autoscaler: a worker group or trial asking for more than it has would wait forever."""
    from raybiphase.config import ConfigError, SweepSpec, from_dict
    from raybiphase.planning.plan import make_plan
    from raybiphase.planning.preflight import check_room

    def refusal(machine: dict, flash_attn: bool = True, **settings) -> str:
        spec = from_dict(SweepSpec, {**TINY_BASE, "finetune": {"tasks": ["tweets"]}}, settings)
        try:
            check_room(make_plan(spec), spec, machine, flash_attn=flash_attn)
        except ConfigError as err:
            return str(err)
        return ""

    laptop = {"CPU": 2.0}
    assert refusal(laptop) == ""  # the quickstart's shape: 2 workers x 0.45 CPU, a trial of 1 CPU
    assert refusal(laptop, **{"resources.gpus_per_worker": 1}).startswith(
        "resources.gpus_per_worker: a segment of run tiny-clm-4-mlm40-8-")
    assert "asks for 2 worker(s) x 1 GPU, but this machine's Ray has 0 GPU" in refusal(
        laptop, **{"resources.gpus_per_worker": 1})
    assert refusal(laptop, **{"resources.cpus_per_worker": 1.5}).startswith("resources.cpus_per_worker:")
    assert refusal(laptop, **{"resources.num_workers": [1, 2], "resources.cpus_per_worker": 1.5}) == ""  # 1 fits
    assert refusal(laptop, **{"finetune.gpus_per_trial": 0.25}).startswith(
        "finetune.gpus_per_trial: a trial asks for 0.25 GPU, but this machine's Ray has 0")
    assert refusal(laptop, **{"finetune.gpus_per_trial": 0.25, "finetune.tasks": []}) == ""  # no trials
    assert refusal({"CPU": 2.0, "GPU": 1.0}, **{"resources.gpus_per_worker": 0.5}) == ""
    assert refusal(laptop, flash_attn=False, **{"model.attn_implementation": "flash_attention_2"}).startswith(
        "model.attn_implementation: flash_attention_2 needs the flash-attn package")
