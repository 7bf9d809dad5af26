"""The README's two commands are the ones that work: CI runs the test command verbatim; the run command's parts exist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    setup = text.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", setup)


def test_readme_names_exactly_two_setup_commands_and_ci_runs_the_test_one():
    run, test = _commands()
    assert run.startswith("pip install -c constraints.txt -e . && ")
    assert test == "pip install -c constraints.txt -e '.[dev]' && python -m pytest"
    ci = (REPO / ".ci" / "run").read_text()
    assert test in ci.splitlines()


@pytest.mark.slow  # a `raybiphase sweep` process
def test_readme_run_command_plans_the_quickstart():
    run, _ = _commands()
    sweep = run.split("&& ")[-1].split()
    assert sweep[:3] == ["python", "-m", "raybiphase.sweep"] and (REPO / sweep[3]).is_file()
    proc = subprocess.run([sys.executable, *sweep[1:], "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "steps: naive" in proc.stdout and "planned" in proc.stdout
    assert "resources: each pretraining segment holds 1 Train worker(s) x 0.45 CPU, 0 GPU (up to 2 segment(s)" in proc.stdout
    assert "each fine-tuning trial holds 1 CPU, 0 GPU" in proc.stdout
    assert "control: tiny-init-" in proc.stdout and "48 trials (full grid; 48 without de-duplication), at most" in proc.stdout


def test_bad_sweep_key_exits_2_with_one_line_and_writes_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "raybiphase.sweep", "sweeps/quickstart.yaml",
                           "--set", f"sweep.storage={tmp_path / 'out'}", "--set", "phases.mask_ratoi=0.3"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: phases.mask_ratoi: unknown key (did you mean 'phases.mask_ratio' ")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_readme_shows_every_command_of_the_cli():
    from raybiphase.__main__ import COMMANDS, usage

    text = (REPO / "README.md").read_text()
    for command in COMMANDS:  # the sweep in its one spelling, the one cluster jobs run
        assert (f"\nraybiphase {command} " if command != "sweep" else "\npython -m raybiphase.sweep ") in text, command
        assert f"  {command} " in usage()
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    assert [page.name for page in pages if "raybiphase sweep " in page.read_text()] == []


def test_the_quickstart_table_is_the_recorded_run():
    """Every cell of the README's quickstart table is the record of a quickstart run of this code
    (benchmarks/quickstart_record.py wrote it from the sweep's own tables; the latest record is the one the table
    shows), an interval past the metric's range printed clipped, so the table cannot drift from what was measured."""
    import json

    from raybiphase.results.aggregate import clipped
    from raybiphase.results.tables import POINTS

    records = sorted((REPO / "benchmarks" / "results").glob("quickstart-*.json"))
    assert records, "no quickstart record: run benchmarks/quickstart_record.py after the quickstart"
    record = json.loads(records[-1].read_text())
    text = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| (SC|TC|QA|IR) \| `(\w+)` \([^)]*\) \|(.+)\|\s*$", text, re.M)
    assert {task for _, task, _ in rows} == set(record["scores"])
    separated = {family: False for family, _, _ in rows}
    for family, task, cells in rows:
        entry = record["scores"][task]
        assert entry["family"] == family
        shown = [c.strip() for c in cells.split("|")][:4]
        control = clipped(entry["untrained"]["score"], entry["untrained"]["ci"], POINTS)
        for objective, cell in zip(("CLM→MLM", "CLM", "MLM"), shown):  # bold: the interval lies above the control's
            ci = entry[objective]["ci"]
            above = ci is not None and clipped(entry[objective]["score"], ci, POINTS)[0] > control[1]
            assert cell.startswith("**") == above, (task, objective, cell)
            separated[family] |= above
        for objective, cell in zip(("CLM→MLM", "CLM", "MLM", "untrained"), [c.replace("*", "") for c in shown]):
            numbers = [float(x) for x in re.findall(r"\d+\.\d", cell)]
            score, ci = entry[objective]["score"], entry[objective]["ci"]
            expected = [round(score, 1)]
            if ci is not None:  # '± ci', or '[low, high]' where the interval passes the metric's range
                low, high = clipped(score, ci, POINTS)
                inside = (low, high) == (score - ci, score + ci)
                expected += [round(ci, 1)] if inside else [round(low, 1), round(high, 1)]
                assert ("±" in cell) == inside, (task, objective, cell)
            assert numbers == pytest.approx(expected, abs=0.051), (task, objective, cell)
    held_out = {name.split("-", 1)[1].rsplit("-", 1)[0]: losses for name, losses in record["held_out_loss"].items()}
    said = re.search(r"CLM only ([\d.]+) \(CLM loss\), CLM then MLM ([\d.]+) \(MLM loss\), MLM only ([\d.]+) \(MLM loss\)",
                     text)
    assert said and [float(x) for x in said.groups()] == pytest.approx(
        [held_out["clm-800"]["val/clm_loss"], held_out["clm-400-mlm40-800"]["val/mlm_loss"],
         held_out["mlm40-800"]["val/mlm_loss"]], abs=0.0051)
    if record.get("unigram_entropy") is not None:
        entropy = re.search(r"unigram entropy of\s+([\d.]+) nats", text)
        assert entropy and float(entropy[1]) == pytest.approx(record["unigram_entropy"], abs=0.0051)
    # the line under the table names the families that do not separate from the control, and those that do
    apart, rest = ([f for f, s in separated.items() if s == flag] for flag in (True, False))
    line = re.search(r"At this scale (.+?) do not separate from the control .*?; (.+?) do\.", text, re.S)
    assert line and re.findall(r"SC|TC|QA|IR", line[1]) == rest and re.findall(r"SC|TC|QA|IR", line[2]) == apart


def _benchmark_module(name: str):
    """A module of benchmarks/ (a folder of scripts, not a package), imported as its scripts import each other."""
    import importlib

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_the_quickstarts_time_is_the_records():
    """The README's line on the quickstart's time is the one benchmarks/quickstart_record.py prints for the latest
    record: the run's time, its stages and what else ran on the machine, or that the record has none."""
    quickstart_time = _benchmark_module("quickstart_time")
    record = json.loads(sorted((REPO / "benchmarks" / "results").glob("quickstart-*.json"))[-1].read_text())
    assert record["time"] == "not measured" or {"total_s", "line"} <= set(record["time"])
    assert " ".join(quickstart_time.time_line(record).split()) in " ".join((REPO / "README.md").read_text().split())


def test_the_paper_miniatures_time_is_the_records():
    """docs/study.md's line on the whole paper miniature's time is the one benchmarks/sweep_record.py prints for
    the latest paper-mini record: the command, the time, its stages, the machine and what else ran on it, the
    code it ran, how many runs, segments and trials."""
    quickstart_time = _benchmark_module("quickstart_time")
    record = json.loads(sorted((REPO / "benchmarks" / "results").glob("paper-mini-*.json"))[-1].read_text())
    assert record["command"] == "python -m raybiphase.sweep sweeps/paper_mini.yaml" and record["trials"] > 0
    line = " ".join(quickstart_time.sweep_time_line(record).split())
    assert line in " ".join((REPO / "docs" / "study.md").read_text().split())


def test_every_cpu_record_the_readme_quotes_names_its_environment():
    """A CPU figure of the README can be reproduced, or is said not to be: its record names the lock of the
    environment that made it (a path that exists and a sha256), or says the environment is unknown."""
    quoted = sorted(set(re.findall(r"benchmarks/results/([\w.-]+\.json)", (REPO / "README.md").read_text())))
    cpu = [name for name in quoted if not name.startswith("h100")]  # the GPU records name their image's versions
    latest = sorted((REPO / "benchmarks" / "results").glob("quickstart-*.json"))[-1].name
    assert {latest, "suite-2026-11-28.json"} <= set(cpu)
    for name in cpu:
        environment = json.loads((REPO / "benchmarks" / "results" / name).read_text()).get("environment")
        if isinstance(environment, dict):
            assert (REPO / environment["lock"]).is_file() and re.fullmatch(r"[0-9a-f]{64}", environment["sha256"])
        else:
            assert str(environment).startswith("unknown: "), name


def test_the_retrieval_figures_are_the_recorded_benchmarks():
    """The README's ranking figures are those of the IR benchmark record it names."""
    import json

    text = (REPO / "README.md").read_text()
    name = re.search(r"`benchmarks/results/(ir-rank-[\d-]+\.json)`", text)[1]
    record = json.loads((REPO / "benchmarks" / "results" / name).read_text())
    big, ratio = record["paper_scale"], record["same_shape"]["full_over_chunked"]
    assert f"{big['queries']:,} queries against {big['passages']:,} passages in {big['ranking_mib']} MiB" in \
        " ".join(text.split())
    assert f"{ratio['memory']}x less memory and {ratio['time']}x less time" in " ".join(text.split())
    assert record["same_shape"]["same_top10"] is True


def test_the_status_line_quotes_the_papers_dry_run():
    """What the README's status says the paper's grid would cost is what its dry run prints today."""
    from raybiphase.config import SweepSpec, load
    from raybiphase.planning.bill import bill_lines
    from raybiphase.planning.plan import make_plan
    from raybiphase.planning.timeline import timeline_lines

    status = (REPO / "README.md").read_text().split("**Status**", 1)[1].split("\n\n", 1)[0].replace("\n", " ")
    spec = load(SweepSpec, "sweeps/paper.yaml")
    plan = make_plan(spec)
    printed = " ".join([*bill_lines(plan, spec), *timeline_lines(plan, spec)])
    pretraining, on_demand, rate = re.search(
        r"bill: pretraining ([\d,]+) GPU-hours: (\$[\d,]+) on demand \((\$[\d.]+)/GPU-hour\)", printed).groups()
    finetuning, finetuning_usd = re.search(r"bill: fine-tuning at most ([\d,]+) GPU-hours: (\$[\d,]+)",
                                           printed).groups()
    days, total_days, gpus = re.search(r"wall-clock: ([\d.]+) days of pretraining with \d+ segment\(s\) at once "
                                       r"\((\d+) GPUs.*at most ([\d.]+) days", printed).group(1, 3, 2)
    assert (f"plans {pretraining} GPU-hours of pretraining and at most {finetuning} of fine-tuning, {days} days of "
            f"pretraining and at most {total_days} days in all on {gpus} GPUs, {on_demand} + {finetuning_usd} on "
            f"demand at the spec's example price of {rate} a GPU-hour") in status
    # docs/study.md counts the models and runs the same plan has: every run, and those that only repeat another
    # with another train.seed
    study = " ".join((REPO / "docs" / "study.md").read_text().split())
    replicates = sum(1 for run in plan.runs.values() if run.config.train.seed != spec.run.train.seed)
    assert (f"`sweeps/paper.yaml` plans {len(plan.runs) - replicates} of these models under the study's names; its "
            f"dry run lists {len(plan.runs)} runs") in study


@pytest.mark.parametrize("typed, hint", [("sweeep", " (did you mean 'sweep'?)"), ("reprot", " (did you mean 'report'?)"),
                                         ("xyz", "")])
def test_a_misspelt_command_is_one_line_that_names_the_closest(typed, hint, capsys):
    from raybiphase.__main__ import COMMANDS, main

    with pytest.raises(SystemExit) as exit_info:
        main([typed])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: {typed}: unknown command{hint}; allowed: {', '.join(COMMANDS)}\n"


def test_the_suites_time_is_the_recorded_runs():
    """The README's time for the whole suite is every run of the newest suite record, in its order."""
    records = sorted((REPO / "benchmarks" / "results").glob("suite-*.json"))
    record = json.loads(records[-1].read_text())
    times = [f"{round(run['seconds']) // 60}m{round(run['seconds']) % 60:02d}s" for run in record["runs"]]
    said = " ".join(", ".join(times[:-1]).split() + ["and", times[-1]]) if len(times) > 1 else times[0]
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"the whole suite took {said} on clean clones on 2 cores, two-node tests included " \
           f"(`benchmarks/results/{records[-1].name}`" in readme
