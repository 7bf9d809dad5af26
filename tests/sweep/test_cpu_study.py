"""sweeps/cpu_study.yaml, shortened (steps / 50, one SC task, one LR, 2 seeds) and run end to end on the local
Ray: every comparison the study plans is trained and fine-tuned (continued runs from the decayed CLM and MLM checkpoints,
early checkpoints, the control), and the report ends with the paper's five findings, each given a verdict."""

from __future__ import annotations

import io
import re

import pytest
import yaml

from tests.conftest import SMALL_DATA

pytestmark = [pytest.mark.ray, pytest.mark.slow]
VERDICTS = {"held", "not held", "mixed", "not resolved"}


def shortened(tmp_path, small_data) -> dict:
    spec = yaml.safe_load(open("sweeps/cpu_study.yaml"))
    spec["sweep"]["storage"] = str(tmp_path)
    spec["sweep"]["grid"]["phases.steps"] = [16, 32]  # was 800, 1,600
    for run in spec["sweep"]["runs"]:
        if "model.init_from" in run:  # continued MLM from the decayed 1.6k (here 32-step) CLM and MLM checkpoints
            run["model.init_from"] = run["model.init_from"].replace("1.6k", "32")
            run["phases.steps"] = 8
        else:
            run["phases.steps"] //= 50
    spec["data"] = {**SMALL_DATA, "dir": small_data[0].dir}
    spec["optim"].update(warmup_steps=2, decay_steps=4)
    spec["train"].update(eval_every=100, eval_batches=1, checkpoint_every=100, export_steps=[4])  # milestones only
    spec["finetune"].update(tasks=["tweets"], lrs=[1e-3], seeds=[0, 1], max_examples=48, max_eval_examples=48,
                           max_steps=3, eval_every=3, max_len=64)  # the small data's blocks: what it trained on
    return spec


def test_the_shortened_cpu_study_runs_every_comparison_and_states_the_five_findings(ray_cluster, small_data,
                                                                                     tmp_path):
    from raybiphase.config import SweepSpec, from_dict
    from raybiphase.results.store import read_rows
    from raybiphase.sweep.driver import run_sweep

    spec = from_dict(SweepSpec, shortened(tmp_path, small_data))
    out = io.StringIO()
    plan = run_sweep(spec, out=out)
    root = tmp_path / "cpu_study"
    assert len(plan.runs) == 10 and len(plan.controls) == 1
    pretrain = read_rows(root / "pretrain.parquet")
    assert set(pretrain["run"]) == set(plan.runs)  # every run trained, continued ones from their sources
    trials = read_rows(root / "finetune.parquet")
    ours = trials[trials["source"] == "raybiphase"]
    sources = {(r, s) for r, s in zip(ours["run"], ours["pretrain_step"])}
    assert len(ours) == 2 * len(sources) and not ours.duplicated(["run", "pretrain_step", "seed"]).any()
    assert {s for _, s in sources} >= {0, 4, 16, 32}  # the control, early and final checkpoints
    assert len(sources) == 1 + 2 * 10  # the control, then every run's early and final checkpoint
    report = (root / "report" / "report.md").read_text()
    findings = report.rsplit("\n## ", 1)[1]
    assert "The paper's findings at this scale" in findings.splitlines()[0]  # the report's last section
    rows = re.findall(r"^\| (\d)\. [^|]+\| ([^|]+) \|", findings, re.M)
    assert [n for n, _ in rows] == ["1", "2", "3", "4", "5"] and {v.strip() for _, v in rows} <= VERDICTS, findings
    assert out.getvalue().splitlines()[-1].startswith("time: ")
