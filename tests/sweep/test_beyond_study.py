"""sweeps/beyond.yaml, shortened (steps / 50, one SC task, one LR, 2 seeds), end to end on the local Ray: the
planner shares exactly the prefixes the runs share (a dry run's naive vs planned steps), every run trains and is
fine-tuned, the report answers each question with a verdict, and the knob branches end with the
weights their runs have when `raybiphase pretrain` trains them alone, bit for bit: an MLM phase that resets AdamW's
moments at the branch point (the step a resumed segment starts from), one with the lower block frozen (which ends
it as the CLM prefix left it), and MNTP continued from the CLM run's checkpoint."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import SMALL_DATA
from tests.inprocess import InProcessTrainer

pytestmark = [pytest.mark.ray, pytest.mark.slow]
VERDICTS = {"held", "not held", "mixed", "not resolved"}
FREEZE = {"phases.plan": [{"objective": "clm", "steps": 8}, {"objective": "mlm", "steps": 8, "frozen_layers": [0]}]}


def shortened(tmp_path, small_data) -> dict:
    spec = yaml.safe_load(open("sweeps/beyond.yaml"))
    spec["sweep"]["storage"] = str(tmp_path)
    for run in spec["sweep"]["runs"]:
        for phase in run.get("phases.plan", []):
            phase["steps"] //= 50
            if "rewarmup_steps" in phase:
                phase["rewarmup_steps"] = 2
        if "model.init_from" in run:
            run["model.init_from"] = run["model.init_from"].replace("800", "16")
            run["phases.steps"] //= 50
    spec["phases"]["steps"] = 16
    spec["sweep"]["unmeasured_sd"] = 3.0  # recorded in the sweep's sweep.json, where its report reads it back
    spec["data"] = {**SMALL_DATA, "dir": small_data[0].dir}
    spec["optim"].update(warmup_steps=2, decay_steps=4)
    spec["train"].update(eval_every=100, eval_batches=1, checkpoint_every=100)  # milestones only
    spec["finetune"].update(tasks=["tweets"], lrs=[1e-3], seeds=[0, 1], max_examples=16, max_eval_examples=16,
                           max_steps=2, eval_every=2, max_len=64)
    return spec


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "hf" / "model.safetensors"))


@pytest.fixture(scope="module")
def study(ray_cluster, small_data, tmp_path_factory):
    from raybiphase.config import SweepSpec, from_dict
    from raybiphase.sweep.driver import run_sweep
    from raybiphase.telemetry.console import Console

    tmp = tmp_path_factory.mktemp("beyond")
    spec = from_dict(SweepSpec, shortened(tmp, small_data))
    dry = io.StringIO()
    run_sweep(spec, dry_run=True, console=Console(dry))
    plan = run_sweep(spec, console=Console(io.StringIO()), make_trainer=InProcessTrainer)
    return {"spec": spec, "plan": plan, "dry": dry.getvalue(), "root": tmp / "beyond"}


def test_the_shortened_beyond_study_shares_its_prefixes_and_answers_every_question(study):
    from raybiphase.results.store import read_rows

    plan, root = study["plan"], study["root"]
    assert len(plan.runs) == 9 and len(plan.controls) == 1
    naive = sum(run.steps for run in plan.runs.values())
    assert plan.planned_steps < naive and f"{plan.planned_steps:,}" in study["dry"] and f"{naive:,}" in study["dry"]
    clm = [s for s in plan.segments.values() if s.start == 0 and s.end == 8 and len(s.runs) == 4]
    assert len(clm) == 1  # CLM-only, CLM->MLM, its reset and its freezing share the first 8 CLM steps
    assert set(read_rows(root / "pretrain.parquet")["run"]) == set(plan.runs)
    trials = read_rows(root / "finetune.parquet")
    ours = trials[trials["source"] == "raybiphase"]
    assert len(ours) == 2 * (len(plan.runs) + 1)  # every run's final checkpoint and the control, 2 seeds each
    from raybiphase.results.html import unmeasured_sd_of

    assert unmeasured_sd_of(str(root)) == 3.0  # the spec's prior, as the report and `raybiphase report` take it
    report = (root / "report" / "report.md").read_text()
    for title in ("reset vs carried", "decayed vs fixed", "per-sequence rates vs one fixed rate",
                  "MNTP vs MLM from the same start", "every block vs frozen blocks"):
        section = re.search(rf"^## \d+\. Beyond the paper: [^\n]*{re.escape(title)}\n\n_Claim: [^\n]*Verdict: \*\*(.+?)\*\*",
                            report, re.M)
        assert section and section[1] in VERDICTS, title


def test_a_damaged_table_is_named_and_both_tables_come_back_from_the_sweeps_records(study, tmp_path):
    """A copy of the finished study whose finetune.parquet part is overwritten: the sweep stops with one line
    naming the part and saying how to rebuild, before Ray starts; with both tables moved away, the same sweep
    trains and fine-tunes nothing and writes back every row the tables held (keys and scores), pretraining's from
    the runs' histories and fine-tuning's from the trials' records. (The CLI turns the UserError into that one line
    and exit code 2.) Tune kept none of its pickled state in the sweep's folder (raybiphase.finetune.tuner)."""
    import shutil

    from raybiphase.config import SweepSpec, from_dict, to_dict
    from raybiphase.errors import UserError
    from raybiphase.results.rows import FINETUNE_KEY, PRETRAIN_KEY
    from raybiphase.results.store import read_rows
    from raybiphase.sweep.driver import run_sweep
    from raybiphase.telemetry.console import Console

    assert not [p.name for p in study["root"].rglob("*") if p.suffix == ".pkl" or "experiment_state" in p.name]
    copy = tmp_path / "beyond"
    shutil.copytree(study["root"], copy)
    spec = to_dict(study["spec"])
    spec = from_dict(SweepSpec, {**spec, "sweep": {**spec["sweep"], "storage": str(tmp_path)}})
    tables = {name: (copy / name, key) for name, key in (("pretrain.parquet", PRETRAIN_KEY),
                                                          ("finetune.parquet", FINETUNE_KEY))}
    held = {name: read_rows(path) for name, (path, _) in tables.items()}
    (part, *_) = sorted((copy / "finetune.parquet").iterdir())
    part.write_bytes(b"overwritten by something else")
    with pytest.raises(UserError) as refused:
        run_sweep(spec, console=Console(io.StringIO()), make_trainer=InProcessTrainer)
    assert len(str(refused.value).splitlines()) == 1 and f"{part}: not a readable Parquet table" in str(refused.value)
    assert "run `raybiphase repair SPEC`" in str(refused.value)
    for name, (path, _) in tables.items():
        shutil.move(path, tmp_path / f"{name}.damaged")
    records = {p.name: p.stat().st_mtime_ns for p in (copy / "finetune" / "records").iterdir()}
    out = io.StringIO()
    run_sweep(spec, console=Console(out), make_trainer=InProcessTrainer)
    segments = len(study["plan"].segments)
    assert f"pretraining: {segments}/{segments} segments already done" in out.getvalue(), out.getvalue()[-3000:]
    assert "pretraining: starting" not in out.getvalue()  # and no trial ran again: each would rewrite its record
    assert {p.name: p.stat().st_mtime_ns for p in (copy / "finetune" / "records").iterdir()} == records
    for name, (path, key) in tables.items():  # every column but those naming a place in the original's folder
        kept = [c for c in held[name].columns if not held[name][c].astype(str).str.contains(str(study["root"])).any()]
        assert {"val_score", "test_score"} <= set(kept) or name == "pretrain.parquet", kept
        again, before = read_rows(path), held[name]
        assert again.sort_values(list(key))[kept].reset_index(drop=True).astype(str).equals(
            before.sort_values(list(key))[kept].reset_index(drop=True).astype(str)), name


def test_repair_moves_damaged_parts_and_records_aside_and_writes_back_what_the_journals_hold(study, tmp_path):
    """`raybiphase repair SPEC` on a copy of the finished study with a part of pretrain.parquet and all of
    finetune.parquet overwritten and one trial record cut short: every damaged file is moved under damaged/ (byte for byte), every row the journals hold
    comes back (the cut record's trial excepted: said as a trial without a record), nothing trains and no record is
    rewritten; a second repair writes nothing and moves nothing."""
    import shutil

    from raybiphase.config import SweepSpec, from_dict, to_dict
    from raybiphase.results.rows import FINETUNE_KEY, PRETRAIN_KEY
    from raybiphase.results.store import read_rows
    from raybiphase.sweep.repair import repair
    from raybiphase.telemetry.console import Console

    copy = tmp_path / "beyond"
    shutil.copytree(study["root"], copy)
    spec = to_dict(study["spec"])
    spec = from_dict(SweepSpec, {**spec, "sweep": {**spec["sweep"], "storage": str(tmp_path)}})
    keys = {"pretrain.parquet": list(PRETRAIN_KEY), "finetune.parquet": list(FINETUNE_KEY)}
    held = {name: read_rows(copy / name)[key] for name, key in keys.items()}
    damaged = {}  # pretrain.parquet's first part, every part of finetune.parquet
    for part in [sorted((copy / "pretrain.parquet").iterdir())[0], *(copy / "finetune.parquet").iterdir()]:
        damaged[part] = b"overwritten by something else"
        part.write_bytes(damaged[part])
    records = sorted((copy / "finetune" / "records").iterdir())
    damaged[records[0]] = records[0].read_bytes()[:20]
    records[0].write_bytes(damaged[records[0]])
    kept = {p: p.stat().st_mtime_ns for p in [*records[1:], *(copy / "runs").rglob("*.distcp")]}
    out = io.StringIO()
    done = repair(spec, console=Console(out))
    assert {Path(k): Path(v) for k, v in done.moved.items()} == {
        p: copy / "damaged" / p.relative_to(copy) for p in damaged}, out.getvalue()
    assert all((copy / "damaged" / p.relative_to(copy)).read_bytes() == data for p, data in damaged.items())
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # nothing trained, no trial ran again
    assert done.unrecorded == 1 and done.untrained == 0
    assert "repair: not rebuilt: 1 trial(s) of trained checkpoints have no record" in out.getvalue()
    back = {name: read_rows(copy / name)[key] for name, key in keys.items()}
    assert not any(table.duplicated().any() for table in back.values())
    lost = {name: held[name].merge(back[name], how="left", indicator=True).query("_merge == 'left_only'")
            for name in keys}
    assert lost["pretrain.parquet"].empty
    run, step, task, lr, seed = records[0].name.split("__")[:5]  # the cut record's trial, and its copies only
    assert len(lost["finetune.parquet"]) >= 1 and (lost["finetune.parquet"]["task"] == task).all()
    assert (lost["finetune.parquet"]["seed"] == int(seed.removeprefix("seed"))).all()
    assert (lost["finetune.parquet"]["pretrain_step"] == int(step)).all()
    again = repair(spec, console=Console(io.StringIO()))
    assert not again.moved and not any(again.written.values())


def _alone(study, tmp_path, name: str, *, worker_group: bool, **overrides) -> Path:
    """`raybiphase pretrain`'s path: the spec's base run with `overrides`, trained alone, by a Ray Train worker
    group of one or (`worker_group` false) in this process as the study's segments are."""
    from raybiphase.config import SweepSpec, from_dict, to_dict
    from raybiphase.pretrain.trainer import run_pretrain

    spec = to_dict(study["spec"])
    spec["sweep"] = {**spec["sweep"], "name": name, "storage": str(tmp_path), "grid": {}, "runs": []}
    result = run_pretrain(from_dict(SweepSpec, spec, overrides),
                          trainer_factory=None if worker_group else InProcessTrainer)
    return Path(result.checkpoint.path)


def _branch(study, tag: str) -> Path:
    from raybiphase.checkpoint_meta import read_meta

    exports = [p for p in (study["root"] / "runs").glob("*/step-*") if (p / "hf").is_dir()]  # the runs' finals
    (branch,) = [p for p in exports if any(tag in run for run in read_meta(p).serves)]
    return branch


KNOBS = {  # knob: (the tag of its run's name, the base run's overrides that make it)
    "reset": ("-clm-8-mlm40r-16-", {"phases.plan": [{"objective": "clm", "steps": 8},
                                                     {"objective": "mlm", "steps": 8, "optimizer": "reset",
                                                      "rewarmup_steps": 2}]}),
    "freeze": ("-clm-8-mlm40f1-16-", FREEZE),
    "mntp": ("-clm-dec16-mntp40-24-", {"phases.steps": 8, "phases.plan": [{"objective": "mntp", "steps": 8}]}),
}


@pytest.fixture(scope="module")
def alone(study, tmp_path_factory) -> dict[str, Path]:
    """Each knob's run trained alone, one after the other (three at once starve their Ray Data readers of CPUs on
    2 cores): the optimizer reset's by a Ray Train worker group of one, as `raybiphase pretrain` trains it (so a
    branch trained in the test's process is held to a real worker group's weights), the others in this process."""
    tmp = tmp_path_factory.mktemp("alone")
    (source,) = (study["root"] / "runs").glob("tiny-clm-8-16-*/step-00000016")  # what the MNTP run continues
    overrides = {knob: dict(extra) for knob, (_, extra) in KNOBS.items()}
    overrides["mntp"]["model.init_from"] = str(source)
    return {knob: _alone(study, tmp, f"alone-{knob}", worker_group=knob == "reset", **extra)
            for knob, extra in overrides.items()}


@pytest.mark.parametrize("knob", KNOBS)
def test_each_branch_ends_with_the_weights_of_its_run_trained_alone(study, alone, knob):
    branch, single = _weights(_branch(study, KNOBS[knob][0])), _weights(alone[knob])
    assert branch.keys() == single.keys() and all(torch.equal(branch[k], single[k]) for k in branch), knob


def test_a_frozen_block_ends_its_phase_as_the_clm_prefix_left_it(study):
    from raybiphase.pretrain import checkpoint
    from raybiphase.pretrain.model import build_model

    (parent,) = (study["root"] / "runs").glob("tiny-clm-0-8-*/step-00000008")
    frozen = _weights(_branch(study, KNOBS["freeze"][0]))
    model = build_model("tiny", vocab_size=frozen["model.embed_tokens.weight"].shape[0],
                        special_ids={"bos_token": 0, "eos_token": 1, "pad_token": 2, "mask_token": 3}, seed=0)
    assert checkpoint.load(parent, model).step == 8  # the weights the CLM prefix hands to its branches
    at_switch = model.state_dict()
    block0 = [k for k in frozen if k.startswith("model.layers.0.")]
    assert block0 and all(torch.equal(frozen[k], at_switch[k]) for k in block0)  # untouched by the MLM phase
    block1 = [k for k in frozen if k.startswith("model.layers.1.")]
    assert all(not torch.equal(frozen[k], at_switch[k]) for k in block1)  # the other block trained
