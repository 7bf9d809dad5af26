"""The report: every figure drawn from a plausible sweep, titled and labelled, paper rows beside ours; clear errors."""

from __future__ import annotations

import html
import json
import math
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from raybiphase.commands import report as report_command
from raybiphase.commands import run_main
from raybiphase.results import report
from raybiphase.results.importer import import_tree
from raybiphase.results.rows import FINETUNE_KEY, PRETRAIN_KEY
from raybiphase.results.stats.control import UNTRAINED, family_verdicts, versus_control
from raybiphase.results.store import append_rows
from raybiphase.results.tables import mean_ci
from raybiphase.storage import FINETUNE_FILE, PRETRAIN_FILE

PAPER_TREE = Path(__file__).resolve().parents[1] / "fixtures" / "paper_tree"
TASKS = {"tweet_sentiment": ("SC", "accuracy"), "squad_bio": ("TC", "f1")}
FIGURES = ("clm_share", "mask_ratio", "data_efficiency", "lr_sensitivity", "continued", "pretrain_curves")


def _run(share: float, budget: int, ratio: float = 0.4, source: str | None = None) -> dict:
    clm = round(share * budget)
    parts = ["tiny"] + ([f"{source}-dec400"] if source else [])
    parts += ([f"clm-{clm}"] if clm else []) + ([f"mlm{round(ratio * 100)}-{budget}"] if clm < budget else [])
    return {"run": "-".join(parts) + "-abc123", "phases.clm_share": share, "phases.steps": budget, "phases.clm_steps": clm,
            "phases.mask_ratio": ratio, "model.size": "tiny", "train.seed": 0,
            "model.init_from": f"/ckpt/tiny-{source}-400-abc123/step_400" if source else None}


def _runs() -> list[dict]:
    runs = [_run(share, budget) for share in (0, 0.25, 0.5, 0.75, 1) for budget in (200, 400)]
    runs += [_run(0, 400, ratio) for ratio in (0.2, 0.3)]
    runs += [_run(0, 200, source=source) for source in ("clm", "mlm40")]
    control = {"run": "tiny-init-abc123", "phases.clm_share": math.nan, "phases.steps": 0, "phases.clm_steps": 0,
               "phases.mask_ratio": None, "model.size": "tiny", "train.seed": 0, "model.init_from": None}
    return [*runs, control]


def _pretrain_rows(config: dict) -> list[dict]:
    rows, clm_steps = [], config["phases.clm_steps"]
    for step in range(50, config["phases.steps"] + 1, 50):
        objective = "clm" if step <= clm_steps else "mlm"
        seen = step / 400
        rows.append({**config, "sweep": "synthetic", "step": step, "tokens_seen": step * 4096,
                     "phase": int(objective == "mlm" and clm_steps > 0), "objective": objective,
                     "train/clm_loss": 7 - 2 * seen if objective == "clm" else math.nan,
                     "train/mlm_loss": 7.5 - 2 * seen if objective == "mlm" else math.nan,
                     "val/clm_loss": 7.1 - 2 * seen + (0.3 if objective == "mlm" else 0),
                     "val/mlm_loss": 7.6 - 2 * seen + (0.4 if objective == "clm" else 0),
                     "lr": 5e-4, "tokens_per_s": 9000.0, "checkpoint": ""})
    return rows


def _finetune_rows(config: dict, rng: np.random.Generator) -> list[dict]:
    rows, budget = [], config["phases.steps"]
    steps = (100, 200, 400) if budget == 400 and config["phases.mask_ratio"] == 0.4 else (budget,)
    untrained = budget == 0  # the control: far below every pretrained model
    for pretrain_step in steps:
        for task, (family, metric) in TASKS.items():
            for lr in (1e-4, 5e-4):
                for seed in (0, 1):
                    share = 0.0 if untrained else config["phases.clm_share"]
                    base = -0.2 * untrained + 0.70 + 0.08 * share * (1 - share) + 0.03 * pretrain_step / 400 - (0.02 if lr == 5e-4 else 0)
                    val, test = base + rng.normal(0, 0.005, 2)
                    rows.append({**config, "sweep": "synthetic", "checkpoint": f"/ckpt/{config['run']}/{pretrain_step}",
                                 "pretrain_step": pretrain_step, "task": task, "family": family, "dataset": task,
                                 "metric": metric, "lr": lr, "seed": seed, "val_score": val, "test_score": test,
                                 "steps": 100, "stopped_early": False, "seconds": 3.0,
                                 "test_per_example": [float(test > 0.7)] * 4, "source": "raybiphase"})
    return rows


def _write_sweep(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    runs = _runs()
    append_rows(folder / PRETRAIN_FILE, [r for c in runs for r in _pretrain_rows(c)], key=PRETRAIN_KEY)
    append_rows(folder / FINETUNE_FILE, [r for c in runs for r in _finetune_rows(c, rng)], key=FINETUNE_KEY)
    import_tree(PAPER_TREE, folder)
    return folder


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, Path, dict]:
    """A plausible sweep (5 CLM shares x 2 budgets, 3 masking ratios, intermediate checkpoints, continued runs,
    2 tasks x 2 LRs x 2 seeds) plus the authors' SST-2 rows, reported once for every test here."""
    results_dir = _write_sweep(tmp_path_factory.mktemp("sweep"))
    path, sections = report.write_report(results_dir)
    return results_dir, path, {s.name: s for s in sections}


@pytest.mark.slow  # a whole report drawn (matplotlib), seconds
def test_report_draws_every_figure_with_titles_labels_and_paper_rows(written) -> None:
    by_name = dict(written[2])  # a copy: the sections are popped as they are checked
    assert set(by_name) == {*FIGURES, "summary", "control", "findings", "compute"}
    assert "| 5. Continued MLM from a CLM checkpoint" in by_name.pop("findings").table
    assert "training FLOPs" in by_name.pop("compute").table  # a table, no figure
    assert "| paper | 610m-mlm40-42k | 610m | MLM | 0 | sst2 | 1e-04 | 91.74 ± 0.35 | 5 |" in by_name.pop("summary").table
    control = by_name.pop("control")  # a table: two seeds give no intervals, so nothing is decided
    assert "tiny-init-abc123" not in control.table and "| not resolved |" in control.table
    assert "**SC**: not resolved: fewer than 3 seeds" in control.note
    for section in by_name.values():
        assert section.figure is not None, f"{section.name}: {section.note}"
        assert section.title in section.figure._suptitle.get_text()
        for ax in (a for a in section.figure.axes if a.get_visible()):
            assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert _legend_texts(section.figure), section.name
    assert {"200 steps", "400 steps", "paper 42k steps"} <= _legend_texts(by_name["clm_share"].figure)
    assert "paper" in by_name["clm_share"].table and "tweet_sentiment" in by_name["clm_share"].table
    assert "MLM phases at masking ratio 0.4 only" in by_name["clm_share"].note
    assert [t.get_text() for t in by_name["continued"].figure.axes[0].get_xticklabels()] == ["from CLM", "from MLM"]
    assert {"held-out CLM loss, 200 steps budget", "held-out MLM loss, 400 steps budget"} <= {
        ax.get_title() for ax in by_name["pretrain_curves"].figure.axes}


def _legend_texts(figure) -> set[str]:
    legends = [*figure.legends, *(ax.get_legend() for ax in figure.axes if ax.get_legend())]
    return {text.get_text() for legend in legends for text in legend.get_texts()}


@pytest.mark.slow  # a whole report drawn (matplotlib), seconds
def test_report_writes_markdown_and_valid_pngs(written) -> None:
    results_dir, path, _ = written
    text = Path(path).read_text()
    assert Path(path) == results_dir / "report" / "report.md"
    for name in FIGURES:
        assert f"({name}.png)" in text
        image = matplotlib.image.imread(results_dir / "report" / f"{name}.png")
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 400
    assert "± " in text and "Not drawn" not in text
    assert (results_dir / "summary.parquet").exists()


@pytest.mark.slow  # a whole report drawn (matplotlib), seconds
def test_a_paper_takes_each_table_as_csv_and_latex_and_each_figure_as_svg_and_pdf(written) -> None:
    """Beside the Markdown: every table as CSV (its cells as the report shows them) and as a LaTeX table, every
    figure as SVG and PDF, each linked from its section; a baseline's row has no LR and no objective."""
    import csv

    results_dir, path, by_name = written
    out, text = results_dir / "report", Path(path).read_text()
    for name, section in by_name.items():
        if section.table:
            assert getattr(section.table, "frame", None) is not None, name
            with open(out / f"{name}.csv") as source:
                rows = list(csv.reader(source))
            assert rows[0] == list(section.table.frame.columns) and len(rows) == len(section.table.frame) + 1
            tex = (out / f"{name}.tex").read_text()
            assert tex.startswith("\\begin{table}") and tex.count("\\\\") == len(rows), name
            assert f"[CSV]({name}.csv) · [LaTeX]({name}.tex)" in text
        if section.figure is not None:
            assert (out / f"{name}.svg").read_text().lstrip().startswith("<?xml")
            assert (out / f"{name}.pdf").read_bytes().startswith(b"%PDF")
    summary = by_name["summary"].table.frame
    assert "\\%" in (out / "summary.tex").read_text() and "\\_" in (out / "summary.tex").read_text()
    baselines = summary[summary["source"] == "baseline"]
    assert (baselines["best LR"] == "").all() and (baselines["objective"] == "").all()


@pytest.mark.slow  # a whole report drawn (matplotlib), seconds
def test_the_html_report_travels_alone_with_vector_figures_and_a_header(written) -> None:
    results_dir, _, by_name = written
    page = (results_dir / "report" / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == len(FIGURES)  # every figure inline, vector
    assert "<img" not in page and ".png" not in page  # nothing beside it to lose
    markdown = (results_dir / "report" / "report.md").read_text()
    assert page.count("<h2") == markdown.count("\n## ")  # every section, in the same numbering
    for section in by_name.values():
        assert html.escape(section.title) in page
    assert page.count("<table>") >= sum(bool(s.table) for s in by_name.values())
    assert "91.74 ± 0.35" in page  # the paper's rows beside ours
    for key in ("spec", "code", "report drawn", "hardware"):
        assert f"<dt>{key}</dt>" in page


def test_the_header_names_the_sweep_that_made_the_rows(tmp_path) -> None:
    from raybiphase.results.html import run_info
    from raybiphase.storage import RUN_INFO

    folder = _small_sweep(tmp_path / "quickstart")
    info = run_info("sweeps/quickstart.yaml --set phases.steps=400")
    (folder / RUN_INFO).write_text(json.dumps(info))
    markdown, _ = report.write_report(folder)
    page = (folder / "report" / "report.html").read_text()
    assert "<dt>spec</dt><dd>sweeps/quickstart.yaml --set phases.steps=400</dd>" in page
    assert f"<dt>code</dt><dd>{info['code']}</dd>" in page and "CPUs" in info["hardware"]
    assert f"spec: sweeps/quickstart.yaml --set phases.steps=400 · code: {info['code']}" in Path(markdown).read_text()


@pytest.mark.parametrize("tc_labels, said", [("all_subtokens", "majority vote"), ("first_subtoken", "first sub-token")])
def test_the_header_says_how_token_classification_was_labelled(tmp_path, tc_labels, said) -> None:
    """The report says which token-classification protocol its scores come from."""
    from raybiphase.config import FinetuneConfig
    from raybiphase.results.html import run_info
    from raybiphase.storage import RUN_INFO

    folder = _small_sweep(tmp_path / "quickstart")
    info = run_info("sweeps/quickstart.yaml", FinetuneConfig(tasks=["squad_commas"], tc_labels=tc_labels))
    (folder / RUN_INFO).write_text(json.dumps(info))
    markdown, _ = report.write_report(folder)
    header = Path(markdown).read_text().splitlines()[2]
    assert "protocol: token classification: " in header and said in header and f"tc_labels={tc_labels}" in header


def _small_sweep(folder: Path) -> Path:
    """One run, one LR: most figures have nothing to vary along."""
    rows = [r for r in _finetune_rows(_run(0.5, 200), np.random.default_rng(1)) if r["lr"] == 1e-4]
    append_rows(folder / FINETUNE_FILE, rows, key=FINETUNE_KEY)
    return folder


def test_report_says_why_a_figure_is_absent(tmp_path: Path) -> None:
    path, sections = report.write_report(_small_sweep(tmp_path))
    text = Path(path).read_text()
    assert "Not drawn: the runs do not differ in CLM share." in text
    assert "Not drawn: a single fine-tuning learning rate." in text
    assert "Not drawn: needs continued runs started from both CLM and MLM." in text
    assert "Not drawn: no pretraining rows (pretrain.parquet is empty)." in text
    assert all(s.figure is None for s in sections)
    assert "## 9. All results at the final checkpoint" in text and "| tiny-clm-100-mlm40-200-abc123 |" in text
    assert not list((tmp_path / "report").glob("*.png"))


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_report_cli_without_results_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, make) -> None:
    target = tmp_path / "nowhere"
    if make == "empty":
        target.mkdir()
        append_rows(target / FINETUNE_FILE, pd.DataFrame(columns=list(FINETUNE_KEY)), key=FINETUNE_KEY)
    monkeypatch.setattr(sys, "argv", ["report", str(target)])
    with pytest.raises(SystemExit) as exit_info:
        run_main(report_command.main)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no results" in err and "\n" not in err


def test_report_cli_says_an_unreachable_bucket_in_one_line_at_once(monkeypatch, capsys) -> None:
    """Not a chain of reads each retried for minutes: the bucket is looked up once, within the short budget."""
    from raybiphase import storage

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(storage, "RETRY_SECONDS", 0.2)
    monkeypatch.setattr(sys, "argv", ["report", "s3://raybiphase-test/results"])
    with pytest.raises(SystemExit) as exit_info:
        run_main(report_command.main)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: results_dir: cannot reach s3://raybiphase-test/results") and err.count("\n") == 1


def test_report_cli_prints_the_report_path(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["report", str(_small_sweep(tmp_path))])
    with pytest.raises(SystemExit) as exit_info:
        run_main(report_command.main)
    assert exit_info.value.code == 0
    assert "report.md" in capsys.readouterr().out


def test_report_from_a_bucket_is_written_beside_its_rows(s3_bucket, tmp_path) -> None:
    """Results in a bucket (a cluster sweep's storage): the report reads the rows there and writes its folder there."""
    import uuid

    import pyarrow.fs as pafs

    from raybiphase import storage

    local = _small_sweep(tmp_path / "quickstart")
    uri = f"{s3_bucket}/{uuid.uuid4().hex}/quickstart"
    fs, path = storage.filesystem(uri)
    pafs.copy_files(str(local), path, destination_filesystem=fs)
    markdown, _ = report.write_report(uri)
    assert markdown == f"{uri}/report/report.md"
    fs, inner = storage.filesystem(markdown)
    with fs.open_input_stream(inner) as handle:
        text = handle.read().decode()
    local_markdown, _ = report.write_report(local)  # the same report as from a folder, figures included
    assert text == Path(local_markdown).read_text() and text.startswith("# Results: quickstart")
    for png in (local / "report").glob("*.png"):
        assert storage.is_file(f"{uri}/report/{png.name}")
    assert storage.is_file(f"{uri}/{storage.SUMMARY_FILE}")


@pytest.mark.slow  # a whole report drawn (matplotlib), seconds
def test_an_interval_needs_three_seeds(written) -> None:
    """With 2 seeds Student's t at 1 degree of freedom is 12.7: such rows print their mean and seed count only."""
    import pandas as pd

    _, path, by_name = written
    assert "(2 seeds, no interval)" in by_name["clm_share"].table  # the sweep's rows: 2 seeds
    assert "91.74 ± 0.35" in Path(path).read_text()  # the paper's: 5 seeds
    ci = report._interval(pd.Series([0.01, 0.01, 0.01]), pd.Series([1, 2, 3]))
    assert ci.isna().tolist() == [True, True, False] and ci.iloc[2] == 1.0
    assert mean_ci(50.0, float("nan"), 1) == "50.00 (1 seed, no interval)"


def test_verdicts_against_the_untrained_control_come_from_the_intervals() -> None:
    def row(run, task, family, score, ci, objective):
        return {"source": "raybiphase", "run": run, "task": task, "family": family, "final": True, "score": score,
                "ci": ci, "n_seeds": 3, "objective": objective}

    s = pd.DataFrame([
        row("init", "tweets", "SC", 50.0, 1.0, UNTRAINED), row("mlm", "tweets", "SC", 60.0, 2.0, "MLM"),
        row("clm", "tweets", "SC", 52.5, 2.0, "CLM"),  # 50.5 < 51: intervals overlap
        row("init", "squad", "QA", 10.0, 1.0, UNTRAINED), row("mlm", "squad", "QA", 30.0, 2.0, "MLM"),
        row("init", "conll", "TC", 40.0, 1.0, UNTRAINED), row("mlm", "conll", "TC", 30.0, 2.0, "MLM"),
        row("init", "nq", "IR", 5.0, math.nan, UNTRAINED), row("mlm", "nq", "IR", 30.0, 2.0, "MLM"),
    ])
    versus = versus_control(s).set_index(["task", "run"])["verdict"]
    assert versus.to_dict() == {("conll", "mlm"): "below", ("nq", "mlm"): "not resolved", ("squad", "mlm"): "above",
                                ("tweets", "clm"): "overlap", ("tweets", "mlm"): "above"}
    verdicts = family_verdicts(versus_control(s))
    assert verdicts["QA"].startswith("yes") and verdicts["SC"].startswith("partly: 1 of 2")
    assert verdicts["TC"].startswith("no: 0 of 1") and verdicts["IR"].startswith("not resolved")


def test_the_papers_five_findings_are_judged_from_the_intervals() -> None:
    """Every arm pretrained twice (train.seed 0 and 1, one point apart): the intervals count the spread between
    pretraining runs, and each finding is decided on them. The same rows from one run per arm decide nothing."""
    from raybiphase.results.stats.findings import NO_REPLICATES, findings

    def row(run, objective, task, family, score, *, budget=400, ratio=0.4, step=400, final=True, init=None):
        return {"source": "raybiphase", "run": run, "objective": objective, "task": task, "family": family,
                "score": score, "ci": 1.0, "n_seeds": 3, "budget": budget, "mask_ratio": ratio, "pretrain_step": step,
                "final": final, "init_from": init}

    rows = []
    for task, family in (("tweets", "SC"), ("squad", "QA")):
        rows += [row("mlm", "MLM", task, family, 70), row("clm", "CLM", task, family, 60),  # 1 held
                 row("clm", "CLM", task, family, 50, step=100, final=False),  # 2: CLM early below MLM early
                 row("mlm", "MLM", task, family, 55, step=100, final=False),
                 row("bi", "CLM→MLM", task, family, 70.5),  # 4: overlaps MLM
                 row("mlm20", "MLM", task, family, 80 if task == "tweets" else 60, ratio=0.2),  # 3: each ratio wins once
                 row("t-clm-dec400-mlm40-600", "continued", task, family, 75, budget=200, init="/c/clm"),  # 5 held
                 row("t-mlm40-dec400-mlm40-600", "continued", task, family, 65, budget=200, init="/c/mlm")]
    replicated = [{**r, "run": f"{r['run']}-s{seed}", "train.seed": seed, "score": r["score"] + offset}
                  for r in rows for seed, offset in ((0, 0.5), (1, -0.5))]
    verdicts = {claim[:2]: (verdict, evidence) for claim, verdict, evidence in findings(pd.DataFrame(replicated))}
    # every MLM ratio is matched with the CLM run (its masking ratio is not a CLM setting): 4 pairs in 2 tasks
    assert verdicts["1."][0] == "held" and "over 2 task(s), 4 pairs (replicates): held" in verdicts["1."][1]
    assert verdicts["2."][0] == "not held"  # CLM 5 points below MLM early: the claim's first part fails
    assert "[this part: not held]" in verdicts["2."][1] and "not tested in this sweep: LR spread" in verdicts["2."][1]
    # each ratio wins one family by 10 points: "no ratio is best everywhere" holds; one size and no retrieval task:
    # the paper's two trends cannot be tested, so the finding is partly held
    assert verdicts["3."][0] == "partly held"
    assert verdicts["3."][1].startswith("best ratio by size and family (mean over its tasks): QA 40%, SC 20% · no "
                                        "ratio is best everywhere")
    assert ("each ratio's clearest loss: 40% over 20% in QA +10.00 pts [+7.05, +12.95]; 20% over 40% in SC +10.00 "
            "pts [+7.05, +12.95] over 2 task(s), 2 ratios in 2 places (size and family) (replicates): held [this part: "
            "held] · not tested in this sweep: larger models prefer higher ratios, retrieval prefers higher ratios"
            ) in verdicts["3."][1]
    assert "not tested: the paper's \"CLM is competitive on token classification\"" in verdicts["1."][1]
    assert "not tested: the paper's \"the 25% and 50% splits do best\"" in verdicts["4."][1]
    assert verdicts["4."][0] == "not resolved" and "+0.50 pts" in verdicts["4."][1]  # half a point, 2 tasks
    assert verdicts["5."][0] == "held"
    assert findings(pd.DataFrame(rows[:2]))[4][1] == "not resolved"  # no continued runs: nothing to compare
    once = {claim[:2]: (verdict, evidence) for claim, verdict, evidence in findings(pd.DataFrame(rows))}
    assert all(verdict == "not resolved" for verdict, _ in once.values())  # seeds only: shown, never decided
    assert "over 2 task(s), 4 pairs (fine-tuning seeds): " + NO_REPLICATES in once["1."][1]


def test_a_baseline_row_is_not_a_second_learning_rate() -> None:
    """One fine-tuning LR beside a BM25 or majority-class row (recorded with lr 0): no LR figure to draw."""
    from raybiphase.results.aggregate import summarize

    ours = [{"source": "raybiphase", "run": "tiny-mlm40-800-abc123", "pretrain_step": 800, "task": "squad_retrieval",
             "family": "IR", "metric": "ndcg@10", "lr": 2e-3, "seed": seed, "val_score": 0.1, "test_score": 0.1}
            for seed in range(3)]
    baseline = {**ours[0], "source": "baseline", "run": "bm25", "pretrain_step": 0, "lr": 0.0, "val_score": math.nan,
                "test_score": 0.86}
    trials = pd.DataFrame([*ours, baseline])
    section = report.lr_section(report._enrich(summarize(trials)), trials)
    assert section.figure is None and section.note == "Not drawn: a single fine-tuning learning rate."


@pytest.mark.slow  # the report's sections drawn (matplotlib), seconds
def test_a_public_encoder_is_a_labelled_reference_line_on_the_per_task_figures_and_never_in_the_findings() -> None:
    rng = np.random.default_rng(0)
    ours = [r for config in (_run(share, 200) for share in (0, 0.5, 1)) for r in _finetune_rows(config, rng)]
    hub = [{"source": "hub", "run": "tiny-org/bert", "checkpoint": "tiny-org/bert@" + "1" * 40, "pretrain_step": 0,
            "task": task, "family": family, "dataset": task, "metric": metric, "lr": lr, "seed": seed,
            "val_score": 0.6, "test_score": 0.65, "test_per_example": [1.0] * 4}
           for task, (family, metric) in TASKS.items() for lr in (1e-4, 5e-4) for seed in (0, 1)]
    sections = {s.name: s for s in report.build_sections(pd.DataFrame(), pd.DataFrame(ours + hub))}
    figure = sections["clm_share"].figure
    assert "hub tiny-org/bert" in _legend_texts(figure) and "dotted: public encoders" in figure._suptitle.get_text()
    panels = [ax for ax in figure.axes if ax.get_visible()]
    assert len(panels) == len(TASKS)
    for ax in panels:  # on every task's panel, at its score, beside our arms' lines
        (line,) = [line for line in ax.get_lines() if line.get_label() == "hub tiny-org/bert"]
        assert list(line.get_ydata()) == pytest.approx([65.0, 65.0]) and line.get_linestyle() == ":"
    assert "| hub | tiny-org/bert |" in sections["summary"].table
    assert "bert" not in sections["findings"].table and "bert" not in sections["findings"].note  # never paired
