"""The reference pages stay true: docs/settings.md, results.md and benchmarks.md are exactly what `raybiphase docs`
renders from the code now, a new field's docstring lands on its page, and every relative link resolves."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raybiphase.commands.pages import (
    MISSING,
    REFERENCE_PAGES,
    REGENERATE,
    benchmark_line,
    described,
    pages,
    row_columns,
    settings_page,
)
from raybiphase.config.load import NOT_WEIGHTS
from raybiphase.errors import UserError
from raybiphase.results.aggregate import BOOTSTRAP_COLUMNS, SUMMARY_COLUMNS, summarize
from raybiphase.results.rows import FinetuneRow, PretrainRow
from raybiphase.results.store import read_rows
from raybiphase.telemetry.history import RESUME_POINT
from raybiphase.telemetry.metrics import PretrainReport, column

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def rendered() -> dict[str, str]:
    """The pages as the code renders them for this checkout, once per test process (every test only reads them)."""
    return pages(REPO)


def committed_pages() -> list[str]:
    """The generated pages this checkout commits (named without rendering any: collecting the tests draws nothing)."""
    from raybiphase.commands.example_report import TARGET, TEXT

    return list(REFERENCE_PAGES) + sorted(str(p.relative_to(REPO)) for p in (REPO / TARGET).iterdir() if p.suffix in TEXT)


def test_the_code_renders_every_committed_page_and_no_other():
    assert sorted(rendered()) == sorted(committed_pages()), f"run `{REGENERATE}` and commit what it writes"


@pytest.mark.parametrize("name", committed_pages())
def test_the_committed_page_is_what_the_code_renders(name):
    said = f"{name} differs from the code; run `{REGENERATE}` and commit it"
    assert (REPO / name).read_text() == rendered()[name], said


@pytest.mark.slow  # the pages rendered again in a copy: about 4 s
def test_check_exits_1_naming_the_first_page_that_differs(tmp_path, monkeypatch, capsys):
    from raybiphase.__main__ import main

    shutil.copytree(REPO / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    shutil.copytree(QUICKSTART_RESULTS, tmp_path / "tests" / "fixtures" / "quickstart_results")  # the example report's
    for name, text in rendered().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "docs" / "results.md").write_text(rendered()["docs/results.md"].replace("`seed`", "`seeds`"))
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() sets sys.argv for the command
    with pytest.raises(SystemExit) as exit_info:
        main(["docs", "--check", "--root", str(tmp_path)])
    assert exit_info.value.code == 1
    assert f"docs/results.md differs from what the code renders; run `{REGENERATE}`" in capsys.readouterr().err
    (tmp_path / "docs" / "results.md").write_text(rendered()["docs/results.md"])
    with pytest.raises(SystemExit) as exit_info:
        main(["docs", "--check", "--root", str(tmp_path)])
    assert exit_info.value.code == 0


@dataclass(frozen=True, kw_only=True)
class _Section:
    knob: int = 3
    """Turns the knob."""
    where: str = field(default="here", metadata=NOT_WEIGHTS)
    """Where it goes."""


@dataclass(frozen=True, kw_only=True)
class _Spec:
    model: _Section = field(default_factory=_Section)
    """A section."""
    sweep: _Section = field(default_factory=_Section)
    """Not a run section."""


def test_a_new_fields_docstring_type_default_and_weights_land_on_the_settings_page():
    page = settings_page(_Spec)
    assert "## model\n\nA section.\n" in page
    assert "| `model.knob` | `int` | `3` | yes | Turns the knob. |" in page
    assert "| `model.where` | `str` | `'here'` | no | Where it goes. |" in page  # NOT_WEIGHTS
    assert f"| `sweep.knob` | `int` | `3` | {MISSING} | Turns the knob. |" in page  # not a run setting


def test_every_row_column_says_what_it_holds():
    undocumented = [(cls.__name__, name) for cls in (PretrainRow, FinetuneRow)
                    for name, _, doc in row_columns(cls) if not doc]
    assert undocumented == []


def test_the_results_page_names_every_metric_and_every_fine_tuning_column_once():
    page = rendered()["docs/results.md"]
    pretrain, rest = page.split("## finetune.parquet")
    finetune = rest.split("## summary.parquet")[0]
    metrics = [column(f) for f in dataclasses.fields(PretrainReport) if column(f) not in ("step", RESUME_POINT)]
    assert {"train/clm_loss", "val/mlm_loss", "mfu", "data_epochs", "workers", "unigram_entropy"} <= set(metrics)
    assert all(pretrain.count(f"| `{name}` |") == 1 for name in metrics)
    assert all(finetune.count(f"| `{f.name}` |") == 1 for f in dataclasses.fields(FinetuneRow) if f.name != "settings")
    assert "one column per key" not in page  # no column hides behind a spread field any more


@dataclass(frozen=True, kw_only=True)
class _NewColumns:
    run: str
    """Documented."""
    fresh: float = 0.0


def test_a_column_added_without_a_description_stops_the_docs_and_their_check(tmp_path, monkeypatch, capsys):
    from raybiphase.__main__ import main
    from raybiphase.commands import pages as pages_module

    with pytest.raises(UserError, match=r"^_NewColumns\.fresh: a results column without a description"):
        described(_NewColumns)
    monkeypatch.setattr(pages_module, "FinetuneRow", _NewColumns)  # as if FinetuneRow gained `fresh`
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    with pytest.raises(SystemExit) as exit_info:
        main(["docs", "--check", "--root", str(REPO)])
    assert exit_info.value.code != 0 and "_NewColumns.fresh: a results column without" in capsys.readouterr().err


def test_a_metric_the_loop_reports_without_a_field_is_refused():
    report = {"step": 1, "tokens_seen": 2048, "phase": 0, "objective": "clm", "train/clm_loss": 7.0, "lr": 1e-3,
              "tokens_per_s": 900.0, "workers": 1, "data_epochs": 0.01}
    assert PretrainReport.from_columns(report).columns() == report  # same names, same order, no None filled in
    with pytest.raises(TypeError, match=r"\['grad_norm'\] are not fields of PretrainReport"):
        PretrainReport.from_columns({**report, "grad_norm": 0.5})


def test_summary_columns_are_summarizes_own_columns_in_order():
    rows = [{"source": "raybiphase", "run": "A", "pretrain_step": 100, "task": "t", "family": "SC", "lr": lr,
             "seed": seed, "val_score": 0.8 - lr, "test_score": 0.7 + seed / 100, "stopped_early": False,
             "test_per_example": [1.0, 0.0, float(seed % 2)]} for lr in (1e-4, 2e-4) for seed in (0, 1)]
    names = [n for n, _ in SUMMARY_COLUMNS]
    plain = list(summarize(pd.DataFrame(rows)).columns)
    assert plain[:len(names)] == names and "family" in plain[len(names):]
    with_boot = list(summarize(pd.DataFrame(rows), bootstrap=True).columns)
    assert with_boot[:len(names) + len(BOOTSTRAP_COLUMNS)] == names + [n for n, _ in BOOTSTRAP_COLUMNS]
    assert all(doc for _, doc in SUMMARY_COLUMNS + BOOTSTRAP_COLUMNS)
    assert not math.isnan(summarize(pd.DataFrame(rows))["best_lr"].iloc[0])


def test_a_benchmark_record_shows_what_it_says_and_a_dash_for_what_it_does_not(tmp_path):
    new = tmp_path / "thing-2026-01-02.json"
    new.write_text(json.dumps({"benchmark": "bench_thing", "date": "2026-01-03", "code": "0.1.0+abc1234",
                               "machine": {"cpu": "x86_64", "cores": 2}, "command": "python benchmarks/b.py",
                               "headline": "2.0x"}))
    line = benchmark_line(new)
    assert (line.date, line.code, line.machine, line.command, line.figure) == (
        "2026-01-03", "0.1.0+abc1234", "cpu x86_64, cores 2", "python benchmarks/b.py", "2.0x")
    old = tmp_path / "old-2026-01-02.json"
    old.write_text(json.dumps({"invocations": [{"command": "python benchmarks/p.py"}], "results": []}))
    line = benchmark_line(old)
    assert (line.date, line.code, line.machine, line.command, line.figure) == (
        "2026-01-02", MISSING, MISSING, "python benchmarks/p.py", MISSING)  # the date its file name ends with


def test_every_committed_record_says_its_figure_and_its_code():
    """docs/benchmarks.md has no row without a figure or a code version: a record states its headline and the code
    that made it, or says that the code was not recorded."""
    lines = [benchmark_line(path) for path in sorted((REPO / "benchmarks" / "results").glob("*.json"))]
    assert [line.file for line in lines if MISSING in (line.code, line.figure)] == []


def test_the_settings_page_states_compiles_speed_up_as_its_record_has_it():
    """train.compile's figure is the range of plain+compile over plain tokens/s in the record it names, every size
    and objective of the record's first two runs."""
    record = json.loads((REPO / "benchmarks" / "results" / "h100-2026-11-23.json").read_text())
    runs = [r for r in record["records"] if r["run"] in (1, 2)]
    eager = {(r["run"], r["size"], r["objective"]): r["tokens_per_s"] for r in runs if r["mode"] == "plain"}
    ratios = [r["tokens_per_s"] / eager[r["run"], r["size"], r["objective"]] for r in runs
              if r["mode"] == "plain+compile"]
    sizes = " and ".join(sorted({r["size"] for r in runs}))
    said = f"{min(ratios):.1f}-{max(ratios):.1f}x the eager step's tokens/s at both sizes, {sizes}, CLM and MLM"
    assert len(ratios) == 4 and said in " ".join(rendered()["docs/settings.md"].split())


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _slugs(markdown: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", _prose(markdown), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def _prose(markdown: str) -> str:
    return re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)  # links and headings in code blocks are text


def _links(page: Path) -> list[str]:
    return [target for target in LINK.findall(_prose(page.read_text()))
            if not re.match(r"[a-z]+:", target)]  # http:, https:, mailto: are not files here


def test_the_link_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Top part\n\n[ok](b.md#the-end) [bad](c.md) [gone](b.md#nowhere) [in](#top-part)")
    (tmp_path / "b.md").write_text("## The end\n")
    assert _broken(tmp_path / "a.md") == ["c.md", "b.md#nowhere"]


def _broken(page: Path) -> list[str]:
    bad = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (anchor and resolved.is_file() and anchor not in _slugs(resolved.read_text())):
            bad.append(target)
    return bad


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(REPO).as_posix()
                                                       for p in (REPO / "docs").glob("*.md"))])
def test_every_relative_link_resolves_to_a_file_and_heading(page):
    assert _broken(REPO / page) == []


def test_the_settings_page_lists_every_field_of_every_section():
    from raybiphase.config import SweepSpec
    from raybiphase.config.docs import sections, setting_list
    from raybiphase.config.run import RUN_SECTIONS

    page = rendered()["docs/settings.md"]
    assert all(f"| `{s.name}` |" in page for s in setting_list(SweepSpec))
    assert list(sections(SweepSpec)) == re.findall(r"^## (\w+)$", page, flags=re.M)
    assert list(sections(SweepSpec)) == [*RUN_SECTIONS, "finetune", "sweep"]


QUICKSTART_RESULTS = REPO / "tests" / "fixtures" / "quickstart_results"
"""A real sweep's tables (`python -m raybiphase.sweep sweeps/quickstart.yaml`'s rows) in today's layout, appended
part by part with the project's writer (tests/fixtures/make_quickstart_results.py). A column the code adds later is
not in them until they are made again; the driver test's sweep (tests/sweep) catches it."""


def test_every_reader_opens_a_real_sweeps_tables_as_they_stand():
    """The first line a user types: pandas on the folder, polars and DuckDB on its parts without options, Parquet's
    own reader; each sees every row and every column `read_rows` does, the parts all in one schema."""
    import duckdb
    import polars as pl

    for table in ("pretrain.parquet", "finetune.parquet"):
        folder = QUICKSTART_RESULTS / table
        parts = sorted(folder.glob("part-*.parquet"))
        assert len(parts) >= 2 and len({pq.read_schema(p).remove_metadata() for p in parts}) == 1
        expected = read_rows(folder)
        frames = {"pandas": pd.read_parquet(folder), "pyarrow": pq.read_table(folder).to_pandas(),
                  "polars": pl.read_parquet(f"{folder}/*.parquet").to_pandas(),
                  "duckdb": duckdb.sql(f"SELECT * FROM read_parquet('{folder}/*.parquet')").df()}
        for reader, frame in frames.items():
            assert list(frame.columns) == list(expected.columns), (table, reader)
            assert len(frame) == len(expected), (table, reader)
        empty = [c for c in expected.columns if expected[c].isna().all()]
        assert empty and all(pq.read_schema(parts[0]).field(c).type != pa.null() for c in empty)


def _reading_blocks() -> list[str]:
    section = (REPO / "docs" / "results.md").read_text().split("## Reading the tables")[1]
    return re.findall(r"^```python\n(.*?)^```", section, flags=re.M | re.S)


def test_the_pages_pandas_and_duckdb_examples_run_on_a_real_sweeps_tables(capsys):
    blocks = _reading_blocks()
    local = [b for b in blocks if "s3://" not in b]  # the bucket's needs a bucket, and httpfs from DuckDB's site
    assert len(blocks) == 3 and len(local) == 2
    namespace: dict = {}
    for block in local:
        code = re.sub(r'^results = ".*"$', f"results = {str(QUICKSTART_RESULTS)!r}", block, flags=re.M)
        exec(compile(code, "docs/results.md", "exec"), namespace)
    printed = capsys.readouterr().out
    pretrain, summary, best = namespace["pretrain"], namespace["summary"], namespace["best"]
    trials = namespace["trials"]  # every part's rows with every part's columns
    assert len(trials) == len(read_rows(QUICKSTART_RESULTS / "finetune.parquet", columns=["run"]))
    assert trials["finetune_settings"].notna().sum() == (trials["source"] == "raybiphase").sum() > 0
    assert all(run in printed for run in pretrain["run"].unique()) and "val/mlm_loss" in printed
    ours = summary[summary["source"] == "raybiphase"]
    assert len(ours) >= 4 and "best_val_mlm_loss" in printed
    recomputed = best.merge(ours, on=["source", "run", "pretrain_step", "task"], suffixes=("", "_summary"))
    assert len(recomputed) == len(ours)  # every checkpoint and task of ours has its best LR's trials
    assert recomputed["test_mean"].tolist() == pytest.approx(recomputed["test_mean_summary"].tolist(), abs=1e-9)
    assert (recomputed["seeds"] == recomputed["n_seeds"]).all()


def undocumented_columns(results: Path) -> dict[str, list[str]]:
    """{table the folder holds: its columns that docs/results.md does not name}; a dotted setting is named on
    docs/settings.md, and `phases.clm_steps` in the page's prose."""
    texts = rendered()
    sections = dict(re.findall(r"^## (\S+\.parquet)\n(.*?)(?=^## |\Z)", texts["docs/results.md"], flags=re.M | re.S))
    named = {name: set(re.findall(r"^\| `([^`]+)`", text, flags=re.M)) for name, text in sections.items()}
    settings = set(re.findall(r"^\| `([^`]+)`", texts["docs/settings.md"], flags=re.M)) | {"phases.clm_steps"}
    allowed = {"pretrain.parquet": named["pretrain.parquet"] | settings,
               "finetune.parquet": named["finetune.parquet"] | settings,  # a summary row also keeps every column
               "summary.parquet": named["summary.parquet"] | named["finetune.parquet"] | settings}  # constant in it
    return {table: [c for c in read_rows(results / table).columns if c not in allowed[table]]
            for table in allowed if (results / table).exists()}


def test_every_column_of_a_real_sweeps_tables_is_on_the_page():
    assert undocumented_columns(QUICKSTART_RESULTS) == {t: [] for t in ("pretrain.parquet", "finetune.parquet",
                                                                        "summary.parquet")}


def test_the_example_report_is_the_recorded_quickstarts_with_every_file_it_links():
    """docs/example-report/ is what `raybiphase report` draws from the recorded quickstart rows: its Markdown and
    tables are pages (compared above); every figure and table file report.md links is committed beside it."""
    folder = REPO / "docs" / "example-report"
    report = (folder / "report.md").read_text()
    assert report.startswith("# Results: quickstart\n") and "The paper's findings at this scale" in report
    linked = set(re.findall(r"\]\(([\w.-]+\.(?:png|svg|pdf|csv|tex|html))\)", report))
    assert {"clm_share.png", "clm_share.svg", "clm_share.pdf", "findings.csv", "findings.tex"} <= linked
    assert all((folder / name).is_file() for name in linked)
