"""Specs that would exhaust the machine are refused in one line before anything is built: a YAML alias chain (a
'billion laughs'), a grid larger than sweep.max_runs, counts no run could have. Each through the command a user
types, under a 2 GiB memory cap and a 10 s bound."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CAP = 2 << 30


def _nine_levels(leaf: str) -> str:
    """A flow list whose aliases expand to 9^9 (387 million) leaves: nine anchors, each list nine of the last."""
    text = f"&l0 [{', '.join([leaf] * 9)}]"
    for level in range(1, 9):
        text = f"&l{level} [{text}, {', '.join([f'*l{level - 1}'] * 8)}]"
    return text


def _dry_run(*args: str) -> subprocess.CompletedProcess:
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    return subprocess.run([sys.executable, "-m", "raybiphase.sweep", *args, "--dry-run"], cwd=REPO, text=True,
                          capture_output=True, timeout=10, preexec_fn=cap)


def _refused(result: subprocess.CompletedProcess, pattern: str) -> None:
    import re

    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and re.fullmatch(pattern, lines[0]), result.stderr[-2000:]


@pytest.mark.parametrize("where", ["grid", "tasks"])
def test_an_alias_bomb_in_a_spec_file_is_refused_before_it_is_expanded(tmp_path, where):
    body = (f"sweep:\n  name: bomb\n  grid:\n    phases.clm_share: {_nine_levels('0.5')}\n" if where == "grid"
            else f"finetune:\n  tasks: {_nine_levels('tweets')}\n")
    spec = tmp_path / "bomb.yaml"
    spec.write_text(body)
    _refused(_dry_run(str(spec)), rf"error: {spec}: refused: its aliases expand to more than 100,000 values; write "
                                  "the values out")


def test_an_alias_bomb_in_an_override_and_a_self_referring_alias_are_refused(tmp_path):
    _refused(_dry_run("sweeps/quickstart.yaml", "--set", f"finetune.tasks={_nine_levels('tweets')}"),
             r"error: finetune.tasks: refused: its aliases expand to more than 100,000 values")
    spec = tmp_path / "loop.yaml"
    spec.write_text("sweep:\n  grid: &loop {phases.clm_share: *loop}\n")
    _refused(_dry_run(str(spec)), rf"error: {spec}: refused: an alias refers to a value that contains it; write the "
                                  "values out")


def test_a_grid_past_max_runs_is_counted_not_built():
    grid = {key: list(range(1, 11)) for key in ("train.seed", "phases.steps", "optim.warmup_steps",
                                                "optim.decay_steps", "optim.lr", "optim.weight_decay",
                                                "phases.mask_ratio", "phases.clm_share", "data.seq_len")}
    _refused(_dry_run("sweeps/quickstart.yaml", "--set", f"sweep.grid={grid}"),
             r"error: sweep\.grid: 1,000,000,000 runs \(the grid's cross product plus sweep\.runs\) is more than "
             r"sweep\.max_runs \(10,000\); split the sweep, or raise sweep\.max_runs")


@pytest.mark.parametrize("setting, most", [("phases.steps", "10,000,000"), ("finetune.max_steps", "1,000,000"),
                                           ("train.micro_batch_size", "1,048,576"),
                                           ("finetune.batch_size", "1,048,576")])
def test_a_count_no_run_could_have_is_one_line(setting, most):
    _refused(_dry_run("sweeps/quickstart.yaml", "--set", f"{setting}=1000000000000000"),
             rf"error: {setting}: 1,000,000,000,000,000 is out of range; allowed: 1 to {most}")


def test_the_papers_own_aliases_still_load():
    from raybiphase.config import SweepSpec, load

    spec = load(SweepSpec, REPO / "sweeps" / "paper.yaml")  # `&published` named once, reused throughout
    assert sum(run.get("train.export_steps") == [1000, 2000, 10000] for run in spec.sweep.runs) == 18
