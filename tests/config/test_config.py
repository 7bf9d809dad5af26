"""Strict config loading: bad input names its dotted key; the same names serve overrides, Tune and Parquet."""

import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from raybiphase.config import ConfigError, SweepSpec, flatten, from_dict, load, replace, to_dict
from raybiphase.config.load import field_type, parse_override

REPO = Path(__file__).resolve().parents[2]


def test_defaults_are_valid_and_round_trip():
    cfg = SweepSpec()
    assert from_dict(SweepSpec, to_dict(cfg)) == cfg


def test_a_spec_is_a_base_run_its_fine_tuning_and_its_sweep_written_as_one_flat_file():
    """The spec is composed (run, finetune, sweep), its base run a RunConfig built once; the file, the dotted
    names and the saved form keep the run's sections at the top level."""
    import dataclasses

    from raybiphase.config import RunConfig
    from raybiphase.config.run import RUN_SECTIONS

    spec = load(SweepSpec, REPO / "sweeps/quickstart.yaml", ["train.eval_every=40"])
    assert [f.name for f in dataclasses.fields(SweepSpec)] == ["run", "finetune", "sweep"]
    assert type(spec.run) is RunConfig and spec.run is spec.run and spec.run.train.eval_every == 40
    assert not hasattr(spec, "train")  # one owner per setting: the base run's resources are spec.run.resources
    plain = to_dict(spec)
    assert list(plain) == [*RUN_SECTIONS, "finetune", "sweep"] and from_dict(SweepSpec, plain) == spec
    assert "train.eval_every" in flatten(spec) and not any(k.startswith("run.") for k in flatten(spec))
    with pytest.raises(ConfigError, match=r"^run: unknown key"):
        from_dict(SweepSpec, {"run": {"train": {"eval_every": 5}}})
    with pytest.raises(ConfigError, match=r"^trian: unknown key \(did you mean 'train'\?\)"):
        from_dict(SweepSpec, {"trian": {}})


def test_two_phase_shorthand_expands_to_phases():
    cfg = from_dict(SweepSpec, {"phases": {"steps": 22000, "clm_share": 0.25, "mask_ratio": 0.4}}, {"optim.warmup_steps": 2000, "optim.decay_steps": 2000, "train.global_batch_tokens": 2048})
    clm, mlm = cfg.run.phases.resolved()
    assert (clm.objective, clm.steps) == ("clm", 5500)  # the paper's 25% of 22k
    assert (mlm.objective, mlm.steps, mlm.mask_ratio) == ("mlm", 16500, 0.4)


def test_pure_objectives_have_one_phase():
    assert [p.objective for p in from_dict(SweepSpec, {"phases": {"clm_share": 1.0}}).run.phases.resolved()] == ["clm"]
    assert [p.objective for p in from_dict(SweepSpec, {"phases": {"clm_share": 0.0}}).run.phases.resolved()] == ["mlm"]


def test_overrides_use_the_dotted_names_that_flatten_reports():
    cfg = from_dict(SweepSpec, {}, {"phases.mask_ratio": 0.3, "model.size": "mini"})
    flat = flatten(cfg)
    assert flat["phases.mask_ratio"] == 0.3 and flat["model.size"] == "mini"
    assert replace(cfg, {"phases.mask_ratio": 0.2}).run.phases.mask_ratio == 0.2


@pytest.mark.parametrize(
    ("data", "overrides", "expected"),
    [
        ({"phases": {"mask_ratoi": 0.3}}, {}, "phases.mask_ratoi: unknown key (did you mean 'phases.mask_ratio' or "
         "'phases.mask_ratio_end' or 'phases.mask_prob'?)"),
        ({"modle": {}}, {}, "modle: unknown key (did you mean 'model'?)"),
        ({}, {"optim.lrr": 1e-3}, "optim.lrr: unknown key (did you mean 'optim.lr'?)"),
        ({"phases": {"steps": "many"}}, {}, "phases.steps: expected an integer"),
        ({"optim": {"lr": "fast"}}, {}, "optim.lr: expected a number"),
        ({"finetune": {"asha": "yes"}}, {}, "finetune.asha: expected true or false"),
        ({"phases": {"mask_ratio": 1.5}}, {}, "phases.mask_ratio: 1.5 is out of range; allowed: a ratio in (0, 1)"),
        ({"phases": {"mask_ratio": 0.0}}, {}, "phases.mask_ratio: 0.0 is out of range"),
        ({"phases": {"clm_share": 1.2}}, {}, "phases.clm_share: 1.2 is out of range; allowed: a share in [0, 1]"),
        ({"phases": {"steps": 0}}, {}, "phases.steps: 0 is out of range; allowed: 1 to 10,000,000"),
        ({"phases": {"mask_prob": 0.8, "random_prob": 0.3}}, {}, "phases.random_prob: mask_prob + random_prob"),
        (
            {"phases": {"steps": 100, "plan": [{"objective": "clm", "steps": 30}, {"objective": "mlm", "steps": 60}]}},
            {},
            "phases.plan: phase steps add up to 90, but the budget phases.steps is 100",
        ),
        ({"phases": {"plan": [{"objective": "xlm", "steps": 100}]}}, {}, "phases.plan.0.objective: 'xlm' is not allowed"),
        ({"optim": {"decay_steps": 500}}, {}, "optim.decay_steps: decay of 500 steps is longer than the run"),
        ({"optim": {"warmup_steps": 60, "decay_steps": 60}}, {}, "optim.warmup_steps: warmup + decay = 120 steps"),
        ({"model": {"size": "7b"}}, {}, "model.size: unknown size '7b'; allowed: micro, tiny, mini, 210m, 610m, 1b"),
        ({"sweep": {"grid": {"phases.clm_shar": [0.5]}}}, {}, "sweep.grid: phases.clm_shar: unknown key"),
        ({"sweep": {"runs": [{}, {"phases.clm_shar": 0.5}]}}, {}, "sweep.runs.1: phases.clm_shar: unknown key"),
        ({"sweep": {"grid": {"phases.clm_share": [0.5, 0.5]}}}, {}, "sweep.grid.phases.clm_share: 0.5 is listed twice"),
        ({}, {"finetune.seeds": [0, 0, 0]}, "finetune.seeds: 0 is listed twice; give each value once"),
        ({}, {"finetune.lrs": [2e-3, 2e-3]}, "finetune.lrs: 0.002 is listed twice"),
        ({}, {"finetune.tasks": ["tweets", "tweets"]}, "finetune.tasks: 'tweets' is listed twice"),
        ({}, {"optim.lr": float("inf")}, "optim.lr: inf is out of range; allowed: a positive number"),
        ({"data": {"vocab_size": 10}}, {}, "data.vocab_size: 10 is too small for the byte-level BPE; allowed: 260 or more"),
        ({"train": {"global_batch_tokens": 1000}}, {}, "train.global_batch_tokens: 1000 is not a multiple"),
        ({"phases": {"clm_share": 0.5, "clm_steps": 10}}, {}, "phases.clm_steps: give clm_steps or clm_share, not both"),
        ({"finetune": {"gpus_per_trial": 1.5}}, {}, "finetune.gpus_per_trial: 1.5 is out of range; allowed: a fraction"),
        ({"finetune": {"max_len": 8}}, {}, "finetune.max_len: 8 is out of range; allowed: 16 or more"),
        ({"finetune": {"cpus_per_trial": 0}}, {}, "finetune.cpus_per_trial: 0.0 is out of range"),
        ({}, {"sweep.storage": "ftp://host/results"}, "sweep.storage: unknown URI scheme 'ftp' in 'ftp://host/results'"),
        ({}, {"data.dir": "hdfs://x/shards"}, "data.dir: unknown URI scheme 'hdfs'"),
        ({}, {"model.init_from": "http://x/ckpt"}, "model.init_from: unknown URI scheme 'http'"),
        ({}, {"sweep.storage": "file:///data/results"}, "sweep.storage: 'file:///data/results': write a local folder as a "
         "plain path (/data/results), not a file:// URI"),
        ({"data": {"piece_documents": 0}}, {}, "data.piece_documents: 0 is out of range"),
        ({"finetune": {"tasks": ["sst2", "squad"], "exports": [{"steps": [100], "tasks": ["squad", "mnli"]}]}}, {},
         "finetune.exports.0.tasks.1: 'mnli' is not one of finetune.tasks ('sst2', 'squad')"),
        ({"finetune": {"tasks": ["sst2"], "exports": [{"steps": [100], "tasks": ["no_such_task"]}]}}, {},
         "finetune.exports.0.tasks.0: 'no_such_task' is not one of finetune.tasks"),
        ({"finetune": {"lrs": [1e-4, 2e-3], "exports": [{"steps": [100], "lrs": [3e-4]}]}}, {},
         "finetune.exports.0.lrs.0: 0.0003 is not one of finetune.lrs (0.0001, 0.002)"),
        ({"finetune": {"seeds": [0, 1], "exports": [{"steps": [100], "seeds": [2]}]}}, {},
         "finetune.exports.0.seeds.0: 2 is not one of finetune.seeds (0, 1)"),
        ({"finetune": {"exports": [{"steps": [100, 200]}, {"steps": [300, 100]}]}}, {},
         "finetune.exports.1.steps.1: step 100 is named by an earlier entry; name each step once"),
        ({"finetune": {"exports": [{"steps": []}]}}, {}, "finetune.exports.0.steps: at least one export step is needed"),
    ],
)
def test_bad_input_names_the_key(data, overrides, expected):
    with pytest.raises(ConfigError) as err:
        from_dict(SweepSpec, data, overrides)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message


def test_bad_yaml_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("phases: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load(SweepSpec, path)
    with pytest.raises(ConfigError, match="no such config file"):
        load(SweepSpec, tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    with pytest.raises(ConfigError, match="the file is empty"):
        load(SweepSpec, empty)
    empty.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected settings .* got a list"):
        load(SweepSpec, empty)


def test_a_key_given_twice_in_a_file_is_an_error(tmp_path):
    path = tmp_path / "twice.yaml"  # PyYAML alone keeps the last value silently
    path.write_text("phases:\n  steps: 100\n  clm_share: 0.5\n  steps: 200\n")
    with pytest.raises(ConfigError, match=r"twice.yaml: line 4: duplicate key 'steps' \(first on line 2\)"):
        load(SweepSpec, path)
    path.write_text("sweep:\n  name: a\nphases:\n  steps: 100\nsweep:\n  name: b\n")
    with pytest.raises(ConfigError, match="line 5: duplicate key 'sweep' \\(first on line 1\\)"):
        load(SweepSpec, path)


def test_a_set_value_that_is_not_yaml_is_one_line_but_an_at_reference_is_text():
    with pytest.raises(ConfigError) as err:
        load(SweepSpec, "sweeps/quickstart.yaml", ["finetune.lrs=[1e-3,"])
    assert str(err.value).startswith("finetune.lrs: '[1e-3,' is not valid YAML (") and "\n" not in str(err.value)
    assert parse_override("model.init_from=@610m-clm-42k") == ("model.init_from", "@610m-clm-42k")  # the README's form


def test_every_float_setting_rejects_inf_and_nan():
    floats = [key for key in flatten(SweepSpec()) if float in (field_type(SweepSpec, key), *get_args(field_type(SweepSpec, key)))]
    assert {"optim.lr", "optim.weight_decay", "phases.clm_share", "data.max_epochs", "sweep.mfu", "finetune.lrs"} <= set(floats)
    for key in floats:
        for bad in (float("inf"), float("nan")):
            value = [bad, 0.9] if key == "optim.betas" else [bad] if key == "finetune.lrs" else bad
            with pytest.raises(ConfigError, match=f"^{key}"):
                from_dict(SweepSpec, {}, {key: value})


@pytest.mark.parametrize("name", ["../esc", "a/b", "a\\b", "..", ".hidden", "", "a b", "run:1"])
def test_the_sweep_name_is_one_plain_folder(name):
    with pytest.raises(ConfigError, match=f"^sweep.name: {re.escape(repr(name))} is not a plain folder name"):
        from_dict(SweepSpec, {"sweep": {"name": name}})
    assert from_dict(SweepSpec, {"sweep": {"name": "split_grid-v2.1"}}).sweep.name == "split_grid-v2.1"


def test_the_bpe_minimum_is_every_byte_plus_the_special_tokens():
    from raybiphase.config.run import BPE_MIN_VOCAB
    from raybiphase.data.prepare import SPECIAL_TOKENS

    assert BPE_MIN_VOCAB == 256 + len(SPECIAL_TOKENS)
    from_dict(SweepSpec, {"data": {"vocab_size": BPE_MIN_VOCAB}})
    from_dict(SweepSpec, {"data": {"tokenizer": "meta-llama/Meta-Llama-3-8B", "vocab_size": 10}})  # not trained: unused


@pytest.mark.slow  # a `raybiphase sweep` process
def test_an_unknown_task_stops_the_dry_run_with_one_line(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"sweep:\n  name: bad\n  storage: {tmp_path / 'out'}\nfinetune:\n  tasks: [tweets, sst-2]\n")
    for command in (["raybiphase.sweep", str(spec), "--dry-run"], ["raybiphase", "validate", str(spec)]):
        proc = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.startswith("error: finetune.tasks: unknown task 'sst-2'; known: tweets,")
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_cli_rejects_bad_config_with_one_line_and_writes_nothing(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"sweep:\n  name: bad\n  storage: {tmp_path / 'out'}\nphases:\n  mask_ratio: 1.4\n")
    proc = subprocess.run(
        [sys.executable, "-m", "raybiphase", "validate", str(spec), "--set", "optim.lr=0.001"],
        capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: phases.mask_ratio: 1.4 is out of range; allowed: a ratio in (0, 1)"
    assert not (tmp_path / "out").exists()


def test_exponent_notation_without_a_dot_is_a_number():
    # YAML 1.1 (PyYAML) reads 3e-3 as the string "3e-3"; every researcher writes learning rates that way
    spec = load(SweepSpec, "sweeps/quickstart.yaml", ["optim.lr=3e-3", "finetune.lrs=[1e-3, 5E-4]"])
    assert spec.run.optim.lr == 3e-3 and spec.finetune.lrs == (1e-3, 5e-4)


def test_help_lists_every_setting_with_its_default_and_docstring(capsys, monkeypatch):
    import sys

    from raybiphase.__main__ import main
    from raybiphase.config.docs import settings

    listed = settings(SweepSpec)
    assert len(listed) > 60 and all(doc for _, _, doc in listed), [n for n, _, d in listed if not d]
    names = [name for name, _, _ in listed]
    assert {"phases.mask_ratio", "finetune.control", "sweep.grid", "train.export_steps",
            "phases.plan.N.frozen_layers", "phases.plan.N.optimizer"} <= set(names)  # a phase entry's knobs too
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() sets sys.argv for the command
    with pytest.raises(SystemExit) as exit_info:  # in-process: `raybiphase sweep --help` as the console runs it
        main(["sweep", "--help"])
    assert exit_info.value.code == 0
    stdout = capsys.readouterr().out
    assert "  phases.mask_ratio = 0.4\n      Share of tokens masked in MLM phases" in stdout
    assert all(f"  {name} = " in stdout for name in names)


def test_the_row_order_shapes_the_weights_but_not_the_shards():
    from raybiphase.config import RunConfig, run_hash
    from raybiphase.data.prepare import fingerprint

    shuffled = from_dict(RunConfig, {})
    stored = from_dict(RunConfig, {"data": {"row_order": "stored"}})
    assert shuffled.data.row_order == "shuffled"  # the default
    assert run_hash(shuffled) != run_hash(stored)  # another order trains other weights: another run
    assert fingerprint(shuffled.data) == fingerprint(stored.data)  # read from the same shards
    with pytest.raises(ConfigError, match="data.row_order"):
        from_dict(RunConfig, {"data": {"row_order": "random"}})


def test_an_unknown_key_with_no_close_match_is_one_short_line():
    """No list of every key of a section on one line: the count, and where the keys are listed."""
    with pytest.raises(ConfigError) as err:
        from_dict(SweepSpec, {}, {"train.zzzzq": 1})
    assert str(err.value) == ("train.zzzzq: unknown key; 15 keys are allowed in train, listed with their meaning by "
                              "`raybiphase validate --help`")


def test_the_front_door_says_its_version():
    import subprocess
    import sys

    from raybiphase import __version__

    out = subprocess.run([sys.executable, "-m", "raybiphase", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == f"raybiphase {__version__}\n"


def test_validate_json_is_one_object_scripts_read():
    """`raybiphase validate SPEC --json`: the dotted settings and the runs the grid makes, as JSON."""
    import json

    proc = subprocess.run([sys.executable, "-m", "raybiphase", "validate", "sweeps/quickstart.yaml", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    document = json.loads(proc.stdout)
    assert proc.returncode == 0 and document["settings"]["sweep.grid"] == {"phases.clm_share": [0.0, 0.5, 1.0]}
    assert len(document["runs"]) == 3 and all(run.startswith("tiny-") for run in document["runs"])
