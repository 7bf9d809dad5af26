"""The data budget: no run trains past the end of its data unless the spec allows it."""

from __future__ import annotations

import math

import pytest

from raybiphase.config import ConfigError, RunConfig, SweepSpec, from_dict, load, run_hash, weights_settings
from raybiphase.planning.plan import make_plan
from raybiphase.pretrain.budget import budget_lines, check_budget, data_budget
from tests.conftest import SMALL_DATA

PAPER_ROWS = 2_359_296 // 2048  # sequences per step of the paper's batch


def test_papers_longest_chain_reads_151B_tokens_and_its_source_holds_them_once():
    spec = load(SweepSpec, "sweeps/paper.yaml")
    budgets = {b.run: b for b in data_budget(make_plan(spec), spec)}
    longest = max(budgets.values(), key=lambda b: b.tokens)
    assert "-dec42k-mlm40-64k-" in longest.run
    assert longest.data_start == 42_000 * PAPER_ROWS  # the continued run starts after its source's last block
    assert longest.tokens == (42_000 + 22_000) * 2_359_296  # 151.0B
    assert longest.source == "HuggingFaceFW/fineweb-edu sample-350BT" and longest.epochs < 1
    check_budget(list(budgets.values()))
    lines = budget_lines(list(budgets.values()))
    assert any(longest.run in line and "needs 151.0B tokens, 0.43 epochs" in line for line in lines)
    assert not any("REPEATS DATA" in line for line in lines)


def test_papers_continued_runs_on_sample_100BT_stop_the_sweep_with_one_line():
    spec = load(SweepSpec, "sweeps/paper.yaml", ["data.hf_config=sample-100BT"])
    with pytest.raises(ConfigError) as err:
        check_budget(data_budget(make_plan(spec), spec))
    message = str(err.value)
    assert "\n" not in message and message.startswith("data.max_epochs: run 610m-")
    assert "dec42k-mlm40-64k" in message and "needs 151.0B tokens" in message and "holds 100.0B" in message
    assert "set data.max_epochs: 1.51" in message


def _small_spec(small_shards, **overrides) -> SweepSpec:
    """A 100-step CLM run on the small prepared dataset (32 blocks a step) and 150 steps of MLM continuing it."""
    data, _ = small_shards
    base = {"model": {"size": "tiny"}, "data": {**SMALL_DATA, "dir": data.dir},
            "phases": {"steps": 100, "clm_share": 1.0}, "optim": {"warmup_steps": 2, "decay_steps": 2},
            "train": {"global_batch_tokens": 2048, "micro_batch_size": 8}, "resources": {"num_workers": 1},
            "sweep": {"runs": [{"model.init_from": "@tiny-clm-100", "phases.steps": 150, "phases.clm_share": 0.0}]}}
    return from_dict(SweepSpec, base, overrides)


def test_a_run_needing_more_blocks_than_the_prepared_source_holds_stops_naming_it(small_shards):
    _, manifest = small_shards
    spec = _small_spec(small_shards)
    budgets = data_budget(make_plan(spec), spec)
    (source,), (continued,) = [b for b in budgets if "dec" not in b.run], [b for b in budgets if "dec" in b.run]
    assert source.blocks == continued.blocks == manifest.train_rows and source.prepared  # read from the manifest
    assert (source.data_start, source.data_end) == (0, 100 * 32)
    assert (continued.data_start, continued.data_end) == (100 * 32, 250 * 32)
    assert source.data_end < manifest.train_rows < continued.data_end
    with pytest.raises(ConfigError) as err:
        check_budget(budgets)
    message = str(err.value)
    assert "\n" not in message and f"run {continued.run} needs 512.0k tokens (8,000 blocks of 64)" in message
    assert f"({manifest.train_rows:,} blocks)" in message and source.run not in message


def test_the_repetition_setting_lets_it_run_and_its_epochs_are_counted(small_shards):
    _, manifest = small_shards
    spec = _small_spec(small_shards, **{"data.max_epochs": 1.5})
    budgets = data_budget(make_plan(spec), spec)
    check_budget(budgets)
    continued = next(b for b in budgets if "dec" in b.run)
    assert continued.epochs == 250 * 32 / manifest.train_rows > 1
    lines = budget_lines(budgets)
    assert lines[0].startswith(f"data: offline: holds {manifest.train_rows * 64 / 1e3:.1f}k tokens") and "prepared" in lines[0]
    assert any(continued.run in line and f"{continued.epochs:.2f} epochs" in line for line in lines)
    assert not any("REPEATS DATA" in line for line in lines)


def test_a_source_of_unknown_size_is_said_and_does_not_stop_the_sweep(tmp_path):
    spec = from_dict(SweepSpec, {"data": {"dir": str(tmp_path / "not-prepared")}, "phases": {"steps": 100}})
    budgets = data_budget(make_plan(spec), spec)
    assert budgets[0].blocks is None and budgets[0].epochs is None
    check_budget(budgets)
    assert budget_lines(budgets)[0] == "data: offline: size unknown until prepared"
    assert "needs" in budget_lines(budgets)[1]
    sized = data_budget(make_plan(spec), spec, train_blocks={budgets[0].location: 1000})  # the driver's, once prepared
    with pytest.raises(ConfigError, match="3.2 passes|3.20 passes"):
        check_budget(sized)


@pytest.mark.parametrize("path, longest", [("sweeps/quickstart.yaml", 800 * 16), ("sweeps/cpu_study.yaml", 2000 * 16)])
def test_quickstart_and_cpu_study_read_these_many_blocks_of_the_offline_corpus(path, longest):
    """Their reads (blocks a step = 2,048 tokens / data.seq_len; cpu_study's continued runs start where their 1.6k
    sources ended); over a corpus of 10,457 training blocks both would repeat it unless data.max_epochs allows it."""
    spec = load(SweepSpec, path)
    budgets = data_budget(make_plan(spec), spec)
    assert max(b.data_end for b in budgets) == longest
    with pytest.raises(ConfigError, match="data.max_epochs"):
        check_budget(data_budget(make_plan(spec), spec, train_blocks={budgets[0].location: 10_457}))
    allowed = load(SweepSpec, path, [f"data.max_epochs={math.ceil(longest / 10_457 * 100) / 100}"])  # 2.45, 6.13
    plan = make_plan(allowed)
    check_budget(data_budget(plan, allowed, train_blocks={data_budget(plan, allowed)[0].location: 10_457}))


def test_the_setting_changes_no_run_name_or_identity():
    default, allowed = RunConfig(), from_dict(RunConfig, {}, {"data.max_epochs": 3})
    assert run_hash(default) == run_hash(allowed) and weights_settings(default) == weights_settings(allowed)
    with pytest.raises(ConfigError, match=r"^data.max_epochs: 0.0 is out of range"):
        from_dict(RunConfig, {}, {"data.max_epochs": 0})


def test_pretrain_stops_a_run_that_would_repeat_data_as_the_sweep_does(small_shards, tmp_path):
    """`raybiphase pretrain` makes the sweep's check, with the sweep's line, before Ray starts (the unit layer
    refuses to start it)."""
    from raybiphase.pretrain.trainer import run_pretrain

    data, manifest = small_shards
    spec = from_dict(SweepSpec, {"model": {"size": "tiny"}, "data": {**SMALL_DATA, "dir": data.dir},
                                 "phases": {"steps": 250, "clm_share": 1.0},
                                 "optim": {"warmup_steps": 2, "decay_steps": 2},
                                 "train": {"global_batch_tokens": 2048, "micro_batch_size": 8},
                                 "resources": {"num_workers": 1}, "sweep": {"storage": str(tmp_path)}})
    assert 250 * 32 > manifest.train_rows
    with pytest.raises(ConfigError) as swept:
        check_budget(data_budget(make_plan(spec), spec))
    with pytest.raises(ConfigError) as alone:
        run_pretrain(spec)
    assert str(alone.value) == str(swept.value) and str(alone.value).startswith("data.max_epochs: run tiny-clm-250")
