"""Issue 30's knobs through the real commands on a local Ray: runs that differ only after a CLM prefix share it
(one segment), and each branch ends with the weights its run has when `raybiphase pretrain` trains it alone, bit
for bit: an MNTP phase, an MLM phase that resets AdamW's moments and warms up again at the branch point (the
step a resumed segment starts from), and an MLM phase with the lower block frozen (which ends it as the CLM
prefix left it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from raybiphase.pretrain.trainer import run_pretrain
from tests.conftest import tiny_base, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PLANS = {
    "mntp": [{"objective": "clm", "steps": 4}, {"objective": "mntp", "steps": 4}],
    "reset": [{"objective": "clm", "steps": 4},
              {"objective": "mlm", "steps": 4, "optimizer": "reset", "rewarmup_steps": 2}],
    "freeze": [{"objective": "clm", "steps": 4}, {"objective": "mlm", "steps": 4, "frozen_layers": [0]}],
}


def _run(*args: str, timeout: int = 600) -> str:
    done = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "hf" / "model.safetensors"))


@pytest.fixture(scope="module")
def trained(small_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("knobs")
    spec = tiny_base(tmp / "results", small_data, name="knobs")
    spec["sweep"]["runs"] = [{"phases.plan": plan} for plan in PLANS.values()]
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(spec))
    sweep = _run("raybiphase.sweep", str(tmp / "sweep.yaml"))
    alone = {}
    for knob, plan in PLANS.items():  # what `raybiphase pretrain` runs, on the session's Ray
        run_pretrain(tiny_config(tmp / "results", small_data, **{"sweep.name": f"alone-{knob}", "phases.plan": plan}))
        (alone[knob],) = (tmp / "results" / f"alone-{knob}" / "runs").glob("*/step-00000008")
    return {"root": tmp / "results" / "knobs", "sweep": sweep, "alone": alone}


def test_the_knobs_share_the_clm_prefix_in_one_segment(trained):
    """The base run (CLM then MLM), the MNTP run and the reset run: one CLM segment, three branches."""
    segments = sorted(p.name.rsplit("-", 1)[0] for p in (trained["root"] / "runs").iterdir())
    assert segments == ["tiny-clm-0-4", "tiny-mlm40-4-8", "tiny-mlm40-4-8", "tiny-mlm40-4-8",
                        "tiny-mntp40-4-8"], segments


def test_a_frozen_block_ends_its_phase_as_the_clm_prefix_left_it(trained):
    from raybiphase.pretrain import checkpoint
    from raybiphase.pretrain.model import build_model

    (parent,) = (trained["root"] / "runs").glob("tiny-clm-0-4-*/step-00000004")
    frozen = _weights(trained["alone"]["freeze"])
    model = build_model("tiny", vocab_size=frozen["model.embed_tokens.weight"].shape[0],
                        special_ids={"bos_token": 0, "eos_token": 1, "pad_token": 2, "mask_token": 3}, seed=0)
    assert checkpoint.load(parent, model).step == 4  # the weights the CLM prefix hands to its branches
    at_switch = model.state_dict()
    block0 = [k for k in frozen if k.startswith("model.layers.0.")]
    assert block0 and all(torch.equal(frozen[k], at_switch[k]) for k in block0)  # untouched by the MLM phase
    block1 = [k for k in frozen if k.startswith("model.layers.1.")]
    assert all(not torch.equal(frozen[k], at_switch[k]) for k in block1)  # the other block trained


@pytest.mark.parametrize("knob,tag", [("mntp", "-clm-4-mntp40-8-"), ("reset", "-clm-4-mlm40r-8-"),
                                      ("freeze", "-clm-4-mlm40f1-8-")])
def test_each_branch_ends_with_the_weights_of_its_run_trained_alone(trained, knob, tag):
    from raybiphase.pretrain.checkpoint import read_meta

    serving = {p: read_meta(p).serves for p in (trained["root"] / "runs").glob("*-4-8-*/step-00000008")}
    (branch,) = [p for p, runs in serving.items() if any(tag in run for run in runs)] or [serving]
    alone = trained["alone"][knob]
    assert tag in alone.parent.name
    a, b = _weights(branch), _weights(alone)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), knob
