"""The W&B Report of a sweep, built offline from a real report (no W&B server here: its spec is checked, never
saved), and `raybiphase report --wandb` refusing, in one line and before drawing anything, what cannot work."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from raybiphase.errors import UserError
from raybiphase.results import wandb_report
from raybiphase.results.importer import import_tree
from raybiphase.results.report import write_report

wr = pytest.importorskip("wandb_workspaces.reports.v2")
REPO = Path(__file__).resolve().parents[2]
PAPER_TREE = REPO / "tests" / "fixtures" / "paper_tree"


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    results_dir = tmp_path_factory.mktemp("paper") / "paper"
    import_tree(PAPER_TREE, results_dir)
    return write_report(results_dir)[1]


def _panels(report, kind):
    return [(grid, panel) for grid in report.blocks if isinstance(grid, wr.PanelGrid)
            for panel in grid.panels if isinstance(panel, kind)]


def test_the_report_has_a_heading_per_section_and_each_figure_as_a_panel_over_the_sweeps_runs(drawn) -> None:
    report = wandb_report.build_report(drawn, entity="lab", project="study", sweep="paper", title="Results: paper")
    assert (report.entity, report.project, report.title) == ("lab", "study", "Results: paper")
    headings = [b.text for b in report.blocks if isinstance(b, wr.H2)]
    assert headings[2:] == [s.title for s in drawn]
    media = {panel.media_keys[0]: grid for grid, panel in _panels(report, wr.MediaBrowser)}
    figures = [s.name for s in drawn if s.figure is not None]
    assert figures and set(media) == {f"figures/{name}" for name in figures}  # what log_report uploads
    (runset,) = {id(g.runsets[0]): g.runsets[0] for g in media.values()}.values()
    assert (runset.entity, runset.project) == ("lab", "study")
    assert runset.filters == "Metric('Group') == 'paper' and Metric('JobType') == 'report'"
    curves = _panels(report, wr.LinePlot)
    assert {p.x for _, p in curves} == {"tokens_seen"} and "val/mlm_loss" in curves[0][1].y
    assert curves[0][0].runsets[0].filters == "Metric('Group') == 'paper' and Metric('JobType') == 'pretrain'"
    scatter = _panels(report, wr.ScatterPlot)
    assert {p.y.name for _, p in scatter} == {"test_mean"} and "phases.clm_share" in {p.x.name for _, p in scatter}
    assert scatter[0][0].runsets[0].filters.endswith("Metric('JobType') == 'finetune'")


def test_the_findings_table_is_in_the_report(drawn) -> None:
    report = wandb_report.build_report(drawn, entity="lab", project="study", sweep="paper", title="t")
    (findings,) = [s for s in drawn if s.name == "findings"]
    index = report.blocks.index(wr.H2(findings.title))
    text = report.blocks[index + 1].text
    assert isinstance(report.blocks[index + 1], wr.MarkdownBlock) and findings.table in text
    assert "| finding" in text and "verdict" in text


def test_a_predictions_section_reaches_the_report_as_text() -> None:
    from raybiphase.results.tables import Section

    predicted = Section("next_size", "Predictions for the next size", None, "finding 4 at 2b: 88% held",
                        "| arm | predicted |\n|---|---|\n| mlm | 71.2 |")
    report = wandb_report.build_report([predicted], entity="lab", project="study", sweep="s", title="t")
    assert report.blocks[-1].text == "finding 4 at 2b: 88% held\n\n| arm | predicted |\n|---|---|\n| mlm | 71.2 |"


def test_a_wandb_target_is_entity_slash_project() -> None:
    assert wandb_report.parse_target("lab/study") == ("lab", "study")
    for bad in ("study", "lab/", "/study", "a/b/c"):
        with pytest.raises(UserError, match="is not ENTITY/PROJECT"):
            wandb_report.parse_target(bad)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # `raybiphase report` processes
@pytest.mark.parametrize("case", ["no credentials", "server out of reach"])
def test_report_wandb_without_credentials_or_server_is_one_line_and_draws_nothing(tmp_path, case) -> None:
    results_dir = tmp_path / "paper"
    import_tree(PAPER_TREE, results_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(NETRC=str(tmp_path / "no-netrc"), WANDB_DIR=str(tmp_path))
    if case == "server out of reach":
        env.update(WANDB_API_KEY="local-" + "0" * 40, WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}")
    before = sorted(p.relative_to(results_dir) for p in results_dir.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "raybiphase", "report", str(results_dir), "--wandb", "lab/study"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    expected = "no W&B credentials for entity 'lab'" if case == "no credentials" else "is out of reach"
    assert proc.stderr.startswith("error: --wandb: ") and expected in proc.stderr
    assert sorted(p.relative_to(results_dir) for p in results_dir.rglob("*")) == before  # nothing drawn, nothing lost
