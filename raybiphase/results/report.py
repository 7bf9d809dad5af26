"""The sweep report: the paper's figures and tables of mean ± 95% CI, from Parquet only.

    python -m raybiphase report RESULTS_DIR [--wandb-project PROJECT]

Reads RESULTS_DIR/pretrain.parquet and finetune.parquet (our rows and the authors', imported with
raybiphase.results.importer), rewrites summary.parquet (raybiphase.results.aggregate) and writes RESULTS_DIR/report/report.md with
one PNG per figure, and report.html: the same report in one self-contained file with vector figures and a header
(spec, code version, date, hardware: raybiphase.results.html). Scores are the test metric x 100: the mean over seeds at the LR with the best mean validation
score, error bars the 95% CI. Paper rows are drawn dashed beside ours; a public encoder (finetune.baselines)
is a dotted line on each of its tasks' panels, labelled with its id. A figure is drawn only when the data varies
along its axis; otherwise the report says in one line why it is absent. RESULTS_DIR is a local folder.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import get_args

import pandas as pd
from matplotlib.figure import Figure  # figures without pyplot: no global state, PNGs through Agg

from raybiphase import storage, transfer
from raybiphase.config.run import Objective
from raybiphase.config.sweep import UNMEASURED_SD
from raybiphase.errors import UserError
from raybiphase.naming import source_objective, steps_label
from raybiphase.results import html
from raybiphase.results.aggregate import lr_table, summarize
from raybiphase.results.compute import compute_section
from raybiphase.results.grid import col as _col
from raybiphase.results.grid import hub_references, palette, task_grid
from raybiphase.results.next_size import next_size_section
from raybiphase.results.questions import beyond_sections, knobs
from raybiphase.results.replicate_spread import replicates_section
from raybiphase.results.rows import BASELINE, HUB, OURS
from raybiphase.results.stats.control import UNTRAINED, family_verdicts, versus_control
from raybiphase.results.stats.findings import Study, judge
from raybiphase.results.stats.matching import MIN_SEEDS
from raybiphase.results.stats.staging import staged_section
from raybiphase.results.store import read_rows, write_summary
from raybiphase.results.tables import Section, markdown, mean_ci, paper_files
from raybiphase.storage import FINETUNE_FILE, PRETRAIN_FILE


def _objective(share: float, init_from: object) -> str:
    if isinstance(init_from, str) and init_from:
        return "continued"
    if pd.isna(share):
        return "?"
    return "CLM" if share >= 1 else "MLM" if share <= 0 else "CLM→MLM"


def _prefix(source: str) -> str:
    return "paper " if source == "paper" else ""


def _enrich(summary: pd.DataFrame) -> pd.DataFrame:
    """Columns the figures group by: objective, budget, final checkpoint, score and CI in points."""
    s = summary.copy()
    s["clm_share"] = pd.to_numeric(_col(s, "phases.clm_share"), errors="coerce")
    s["init_from"] = _col(s, "model.init_from").replace("", None)
    s["budget"] = pd.to_numeric(_col(s, "phases.steps"), errors="coerce")
    s["objective"] = [UNTRAINED if budget == 0 else _objective(a, b)
                      for a, b, budget in zip(s["clm_share"], s["init_from"], s["budget"])]
    s["mask_ratio"] = pd.to_numeric(_col(s, "phases.mask_ratio"), errors="coerce")
    s["size"] = _col(s, "model.size").map(lambda v: "" if pd.isna(v) else str(v))
    s["family"] = _col(s, "family").fillna("?")
    s["metric"] = _col(s, "metric").fillna("score")
    s["final"] = s["pretrain_step"] == s.groupby(["source", "run"])["pretrain_step"].transform("max")
    s["knobs"] = s["run"].map(knobs)  # beyond the paper's settings (raybiphase.results.questions.QUESTIONS)
    s["score"], s["ci"] = s["test_mean"] * 100, _interval(s["test_ci95"], s["n_seeds"])
    return s


def enriched_summary(results_dir: storage.Location) -> pd.DataFrame:
    """`_enrich(summarize(...))` of a results folder's finetune.parquet: what the report draws from."""
    return _enrich(summarize(read_rows(storage.join(str(results_dir), FINETUNE_FILE))))


def _interval(ci95: pd.Series, n_seeds: pd.Series) -> pd.Series:
    """The 95% half-width in points where at least MIN_SEEDS seeds stand behind it, else NaN."""
    n = pd.to_numeric(n_seeds, errors="coerce").fillna(0)
    return (ci95 * 100).where(n >= MIN_SEEDS)


def _budget(value: float) -> str:
    return "? steps" if pd.isna(value) else f"{steps_label(int(value))} steps"


def _score_table(points: pd.DataFrame, index: list[str]) -> str:
    """Markdown table: one row per `index` value, one column per task (per task and model size when the points
    hold several sizes), cells 'mean ± CI (LR)'. Rows that share a cell are all shown in it, never one of them."""
    size = _col(points, "size").fillna("")
    column = points["task"] + (" · " + size if size.nunique() > 1 else "")
    cells = points.assign(column=column, cell=[f"{mean_ci(m, c, n)} (lr {lr:.0e})" if pd.notna(m) else "n/a"
                                               for m, c, n, lr in zip(points["score"], points["ci"],
                                                                      points["n_seeds"], points["best_lr"])])
    table = cells.pivot_table(index=index, columns="column", values="cell", aggfunc="; ".join).reset_index()
    return markdown(table.rename_axis(columns=None))


def clm_share_section(s: pd.DataFrame) -> Section:
    title = "Downstream score vs CLM share, per budget and task family"
    pts = s[s["final"] & s["init_from"].isna() & s["clm_share"].notna()]
    mixed = pts[pts["clm_share"] < 1]
    note = "Final checkpoints of runs trained from scratch; x = share of the steps spent on CLM before MLM."
    if mixed["mask_ratio"].nunique() > 1:  # hold the masking ratio fixed (the paper's two-phase default)
        ratio = mixed["mask_ratio"].mode().iloc[0]
        pts = pts[(pts["clm_share"] >= 1) | (pts["mask_ratio"] == ratio)]
        note += f" MLM phases at masking ratio {ratio:g} only."
    if pts["clm_share"].nunique() < 2:
        return Section("clm_share", title, None, "Not drawn: the runs do not differ in CLM share.")
    pts = pts.assign(share_pct=pts["clm_share"] * 100,
                     line=[_prefix(a) + _budget(b) for a, b in zip(pts["source"], pts["budget"])])
    fig = task_grid(pts, "share_pct", "line", title, "CLM share of pretraining steps (%)", references=hub_references(s))
    pts = pts.assign(**{"CLM share (%)": pts["share_pct"].round(1), "budget": pts["budget"].map(_budget)})
    return Section("clm_share", title, fig, note, _score_table(pts, ["source", "budget", "CLM share (%)"]))


def mask_ratio_section(s: pd.DataFrame) -> Section:
    title = "Downstream score vs masking ratio (MLM-only runs)"
    pts = s[s["final"] & s["init_from"].isna() & (s["clm_share"] == 0) & s["mask_ratio"].notna()]
    if pts["mask_ratio"].nunique() < 2:
        return Section("mask_ratio", title, None, "Not drawn: no two MLM-only runs differ in masking ratio.")
    size = _col(pts, "model.size").fillna("")
    pts = pts.assign(ratio_pct=pts["mask_ratio"] * 100,
                     model=[f"{_prefix(a)}{z} {_budget(b)}".strip()
                            for a, z, b in zip(pts["source"], size, pts["budget"])])
    fig = task_grid(pts, "ratio_pct", "model", title, "masking ratio (% of tokens)", references=hub_references(s))
    pts = pts.assign(**{"mask ratio (%)": pts["ratio_pct"].round(1)})
    return Section("mask_ratio", title, fig, "Final checkpoints of MLM-only runs.",
                   _score_table(pts, ["source", "model", "mask ratio (%)"]))


def data_efficiency_section(s: pd.DataFrame) -> Section:
    title = "Data efficiency: downstream score vs pretraining step"
    counts = s.groupby(["source", "run"])["pretrain_step"].transform("nunique")
    pts = s[counts > 1]
    if pts.empty:
        return Section("data_efficiency", title, None,
                       "Not drawn: no run was fine-tuned from intermediate checkpoints.")
    pts = pts.assign(line=[f"{_prefix(a)}{r} ({o})" for a, r, o in zip(pts["source"], pts["run"], pts["objective"])])
    fig = task_grid(pts, "pretrain_step", "line", title, "pretraining step (optimizer steps)",
                    references=hub_references(s))
    return Section("data_efficiency", title, fig,
                   "Intermediate checkpoints of each run, every intermediate step fine-tuned on one grid (a part "
                   "of the final checkpoint's where finetune.exports names fewer tasks, LRs or seeds).",
                   _score_table(pts, ["source", "run", "pretrain_step"]))


def lr_section(s: pd.DataFrame, trials: pd.DataFrame) -> Section:
    title = "Learning-rate sensitivity per objective"
    trials = trials[_col(trials, "source").fillna(OURS) != BASELINE]  # a baseline row has no LR (0) to compare
    if trials.empty or trials["lr"].nunique() < 2:
        return Section("lr_sensitivity", title, None, "Not drawn: a single fine-tuning learning rate.")
    final = s[s["final"]][["source", "run", "pretrain_step", "task", "objective", "family", "metric"]]
    per_lr = lr_table(trials)
    n_incomplete = int((~per_lr["complete"]).sum())
    pts = per_lr[per_lr["complete"]].merge(final, on=["source", "run", "pretrain_step", "task"])
    pts = pts.assign(score=pts["test_mean"] * 100, ci=_interval(pts["test_ci95"], pts["n_seeds"]),
                     line=[f"{_prefix(a)}{r}" for a, r in zip(pts["source"], pts["run"])])
    fig = task_grid(pts, "lr", "line", title + " (colour: objective)", "fine-tuning learning rate (log scale)",
                     logx=True, color_by="objective")
    final_rows = s[s["final"]]
    spread = final_rows.groupby(["source", "objective"], as_index=False).agg(
        runs=("run", "nunique"), **{"mean LR spread (max-min, pts)": ("lr_spread", lambda v: 100 * v.mean()),
                                    "mean LR std (pts)": ("lr_std", lambda v: 100 * v.mean()),
                                    "complete LRs": ("n_lrs_complete", "sum"), "LRs": ("n_lrs", "sum")})
    note = ("Mean test score over seeds at each LR, one line per model (final checkpoints). A flatter line is a less "
            "LR-sensitive model; the table averages the spread across tasks. The figure and the spread use only "
            "complete LR x seed cells (every seed has a score; a diverged seed counts at the metric's floor): an LR "
            "that ASHA cut short keeps only its best seeds, which would understate it. "
            + (f"{n_incomplete} incomplete cell(s) left out; `finetune.complete_lrs: true` finishes every cell."
               if n_incomplete else "Every cell is complete."))
    return Section("lr_sensitivity", title, fig, note, markdown(spread.round(2)))


def _init_objective(run: str, init_from: str) -> str:
    if source_objective(run):
        return source_objective(run).upper()
    base = Path(str(init_from).rstrip("/")).name.lower()
    return "CLM" if "clm" in base and "mlm" not in base else "MLM" if "mlm" in base and "clm" not in base else "?"


def continued_section(s: pd.DataFrame) -> Section:
    title = "Continued MLM pretraining: from a CLM vs from an MLM checkpoint"
    pts = s[s["final"] & s["init_from"].notna()]
    pts = pts.assign(start=[_init_objective(r, i) for r, i in zip(pts["run"], pts["init_from"])])
    if not {"CLM", "MLM"} <= set(pts["start"]):
        return Section("continued", title, None, "Not drawn: needs continued runs started from both CLM and MLM.")
    if pts["budget"].nunique() > 1:  # several continuation lengths: score vs length, a line per start
        pts = pts.assign(line=[f"{_prefix(a)}from {o}" for a, o in zip(pts["source"], pts["start"])])
        fig = task_grid(pts, "budget", "line", title, "continued MLM steps", references=hub_references(s))
    else:
        pts = pts.assign(line=[f"{_prefix(a)}{_budget(b)}" for a, b in zip(pts["source"], pts["budget"])],
                         x=[f"from {o}" for o in pts["start"]])
        fig = task_grid(pts, "x", "line", title, "checkpoint the MLM phase continues from",
                        references=hub_references(s))
    return Section("continued", title, fig, "Runs whose model.init_from is set, by the objective of the start.",
                   _score_table(pts.assign(steps=pts["budget"].map(_budget)), ["source", "start", "steps"]))


def control_section(s: pd.DataFrame) -> Section:
    title = "Pretrained vs untrained control, with baselines"
    versus = versus_control(s)
    if versus.empty:
        return Section("control", title, None, "Not drawn: no untrained control (finetune.control is off, or its "
                       "trials have not run).")
    baselines = s[s["source"] == "baseline"].set_index("task")
    table = pd.DataFrame({
        "family": versus["family"], "task": versus["task"], "run": versus["run"], "objective": versus["objective"],
        "test (%)": [mean_ci(m, c, n) for m, c, n in zip(versus["score"], versus["ci"], versus["n_seeds"])],
        "control (%)": [mean_ci(m, c, n) for m, c, n in
                        zip(versus["control"], versus["control_ci"], versus["control_seeds"])],
        "baseline (%)": [", ".join(f"{b['run']} {b['score']:.2f}" for _, b in baselines.loc[[t]].iterrows())
                         if t in baselines.index else "" for t in versus["task"]],
        "vs control": versus["verdict"]})
    verdicts = family_verdicts(versus)
    note = ("Each pretrained model's final checkpoint against the same architecture fine-tuned from its untrained "
            "step-0 weights (the control), per task; baselines: the majority class (classification) and BM25 "
            "(retrieval). Per family, do the pretrained models beat the control? "
            + "; ".join(f"**{family}**: {text}" for family, text in verdicts.items()) + ".")
    return Section("control", title, None, note, markdown(table))


def summary_section(s: pd.DataFrame) -> Section:
    """Every (run, task) at its final checkpoint: the table behind all the figures."""
    final = s[s["final"]].sort_values(["source", "task", "run"])
    trained = final["source"] != "baseline"  # a baseline (BM25, the majority class) has no LR and no objective
    table = pd.DataFrame({
        "source": final["source"], "run": final["run"], "size": final["size"],
        "objective": final["objective"].where(trained & (final["source"] != HUB), ""),  # a public encoder: not ours
        "CLM share (%)": (final["clm_share"] * 100).round(1), "task": final["task"],
        "best LR": [f"{v:.0e}" if t and pd.notna(v) else "" for v, t in zip(final["best_lr"], trained)],
        "test (%)": [mean_ci(m, c, n) for m, c, n in zip(final["score"], final["ci"], final["n_seeds"])],
        "seeds": final["n_seeds"], "diverged (best LR / all)": [f"{int(b)} / {int(a)}" for b, a in zip(
            _col(final, "n_diverged_best").fillna(0), _col(final, "n_diverged").fillna(0))],
        "LR spread (pts)": (final["lr_spread"] * 100).round(2)})
    diverged = int(_col(final, "n_diverged").fillna(0).sum())
    return Section("summary", "All results at the final checkpoint", None,
                   "Best LR by mean validation score over all its seeds (only LRs whose every seed has a score); "
                   "test mean ± 95% CI over those seeds; a diverged seed scores what a model that learned nothing "
                   "scores (the majority class for accuracy, no entity for entity F1, no answer for QA F1, a random "
                   f"ranking for NDCG@10) and counts: {diverged} trial(s) diverged here. LR spread "
                   "= max - min of the mean test score across the complete LRs.", markdown(table))


def _switch_steps(rows: pd.DataFrame) -> list[float]:
    """Where a run's objective changes: phases.clm_steps when recorded, else clm_share x phases.steps, else the
    last row of the old objective (a row reports the phase of the step it ends)."""
    clm_steps = pd.to_numeric(_col(rows, "phases.clm_steps"), errors="coerce").dropna()
    if len(clm_steps) and 0 < clm_steps.iloc[0] < rows["step"].max():
        return [float(clm_steps.iloc[0])]
    share = pd.to_numeric(_col(rows, "phases.clm_share"), errors="coerce").dropna()
    budget = pd.to_numeric(_col(rows, "phases.steps"), errors="coerce").dropna()
    if len(share) and len(budget) and 0 < share.iloc[0] < 1:
        return [float(round(share.iloc[0] * budget.iloc[0]))]
    objective = _col(rows, "objective")
    return list(rows["step"].shift()[objective.ne(objective.shift()) & objective.shift().notna()])


def curves_section(pretrain: pd.DataFrame) -> Section:
    title = "Pretraining curves: held-out CLM and MLM loss"
    losses = [c for c in (f"val/{o}_loss" for o in get_args(Objective)) if c in pretrain and pretrain[c].notna().any()]
    if not losses or pretrain.groupby("run")["step"].nunique().max() < 2:
        return Section("pretrain_curves", title, None, "Not drawn: no run reported held-out losses at two steps.")
    pretrain = pretrain.assign(budget=pd.to_numeric(_col(pretrain, "phases.steps"), errors="coerce"),
                               size=_col(pretrain, "model.size").map(lambda v: "" if pd.isna(v) else str(v)))
    rows = sorted(set(zip(pretrain["size"], pretrain["budget"])), key=lambda r: (r[0], pd.isna(r[1]), r[1]))
    fig = Figure(figsize=(5.5 * len(losses) + 3.2, 3.8 * len(rows) + 0.5), layout="constrained")
    axes = fig.subplots(len(rows), len(losses), squeeze=False)
    several = pretrain["size"].nunique() > 1  # a row of panels per model size and budget: no line spans two sizes
    for row, (size, budget) in zip(axes, rows):
        same_budget = (pretrain["budget"] == budget) | (pretrain["budget"].isna() & pd.isna(budget))
        runs = pretrain[same_budget & (pretrain["size"] == size)]
        for ax, loss in zip(row, losses):
            colors = palette(runs["run"].nunique())
            for run, rows in runs.sort_values("step").groupby("run", sort=True):
                line, color = rows[rows[loss].notna()], next(colors)
                ax.plot(line["step"], line[loss], marker=".", color=color, label=run)
                for step in _switch_steps(rows):
                    ax.axvline(step, color=color, linestyle=":", alpha=0.8)
            entropy = pd.to_numeric(_col(runs, "unigram_entropy"), errors="coerce").dropna()
            if len(entropy):  # what knowing only token frequencies achieves: learning means falling well below
                ax.axhline(entropy.iloc[0], color="black", linestyle="--", alpha=0.6,
                           label=f"unigram entropy {entropy.iloc[0]:.2f}")
            ax.set_title(f"held-out {loss.split('/')[1].split('_')[0].upper()} loss, "
                         + (f"{size}, " if several else "") + f"{_budget(budget)} budget")
            ax.set_xlabel("pretraining step (optimizer steps)")
            ax.set_ylabel("cross-entropy (nats/token)")
            ax.grid(alpha=0.3)
        row[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    fig.suptitle(f"{title} (dotted: CLM→MLM switch)")
    last = pretrain.sort_values("step").groupby("run", sort=True).last()
    table = pd.DataFrame({"run": last.index, "step": last["step"].astype(int),
                          **{f"final {loss}": last[loss].round(3) for loss in losses},
                          "unigram entropy": pd.to_numeric(_col(last, "unigram_entropy"), errors="coerce").round(3)})
    return Section("pretrain_curves", title, fig, "Held-out loss of every run, one row per model size and step "
                   "budget; the objective changes at the dotted lines; dashed: the corpus' unigram entropy (a model that knows only token "
                   "frequencies), which a learning model falls well below.", markdown(table))


FINETUNE_SECTIONS = {"control": "Pretrained vs untrained control, with baselines", "clm_share": "Downstream score vs CLM share", "mask_ratio": "Downstream score vs masking ratio",
                     "data_efficiency": "Data efficiency", "lr_sensitivity": "Learning-rate sensitivity",
                     "continued": "Continued MLM pretraining"}


def build_sections(pretrain: pd.DataFrame, trials: pd.DataFrame, unmeasured_sd: float = UNMEASURED_SD) -> list[Section]:
    """Every section of the report from the raw rows (pure: no files); absent ones say why. `unmeasured_sd`:
    sweep.unmeasured_sd, for the findings."""
    empty = "Not drawn: no {} rows ({}.parquet is empty)."
    if len(trials):
        s = _enrich(summarize(trials))
        paper = s[s["knobs"] == ""]  # the paper's figures draw the paper's settings only
        sections = [control_section(s), clm_share_section(paper), mask_ratio_section(paper),
                    data_efficiency_section(paper), lr_section(paper, trials), continued_section(paper),
                    compute_section(paper),
                    *filter(None, [replicates_section(paper), next_size_section(s)]), *beyond_sections(s)]
    else:
        sections = [Section(name, title, None, empty.format("fine-tuning", "finetune"))
                    for name, title in FINETUNE_SECTIONS.items()]
    sections.append(curves_section(pretrain) if len(pretrain) else
                    Section("pretrain_curves", "Pretraining curves", None, empty.format("pretraining", "pretrain")))
    return [*sections, summary_section(s), findings_section(s, unmeasured_sd)] if len(trials) else sections


def findings_section(s: pd.DataFrame, unmeasured_sd: float = UNMEASURED_SD) -> Section:
    """The paper's five findings, each held, not held, mixed or not resolved at this sweep's scale, from effects
    with 95% intervals and a calibrated rule (raybiphase.results.stats.findings; docs/statistics.md)."""
    paper = s[s["knobs"] == ""]  # the paper's settings
    study = Study(paper, unmeasured_sd)
    table = pd.DataFrame(judge(study), columns=["finding", "verdict", "evidence"])
    return Section("findings", "The paper's findings at this scale", None,
                   "Each finding is an effect per model size (matched arms, the mean over tasks of the mean matched "
                   "difference, in test points) with its interval at the level its decision uses: 95% for a "
                   "finding's only test, Holm's adjusted level where it has several (an interval excludes zero "
                   "exactly when its test claims an effect). Held: the test in the paper's direction clears 5%, the "
                   "finding's tests adjusted together (Holm), so a finding claims an effect that is not there in at "
                   "most 5% of studies; not held: the same the other way; mixed: both; not resolved: neither. "
                   "Findings 2 and 3 state several things at once: each part gets its own verdict, and the finding "
                   "is held only when every part is (\"partly held\" when some are and the rest not resolved). "
                   "Over the five findings together, some finding claims an absent effect in at most 25% of "
                   "studies (five families at 5% each). Clauses the rule does not test are listed as such. "
                   f"{study.regime()} The method and its simulation: docs/statistics.md.",
                   markdown(table))


def write_report(results_dir: storage.Location, unmeasured_sd: float | None = None) -> tuple[str, list[Section]]:
    """Write RESULTS_DIR/report/report.md and its figures (PNG, SVG and PDF) and tables (CSV, LaTeX), and
    report.html (a folder or a bucket); return the Markdown's location and the sections. `unmeasured_sd`: the
    findings' sweep.unmeasured_sd, else the one the folder's sweep.json records (`html.unmeasured_sd_of`).

    The sections' figures stay inspectable: titles, axes, legends.
    """
    results_dir = str(results_dir).rstrip("/")
    pretrain = read_rows(storage.join(results_dir, PRETRAIN_FILE))
    trials = read_rows(storage.join(results_dir, FINETUNE_FILE))
    if pretrain.empty and trials.empty:
        raise UserError(f"{results_dir}: no results (expected {PRETRAIN_FILE} or {FINETUNE_FILE} with rows)")
    if len(trials):
        write_summary(results_dir)
    sources = trials["source"].value_counts().to_dict() if "source" in trials else {}
    lines = [f"# Results: {results_dir.rsplit('/', 1)[-1]}", "",
             f"{len(pretrain)} pretraining rows from {pretrain['run'].nunique() if len(pretrain) else 0} runs; "
             f"{len(trials)} fine-tuning trials ({', '.join(f'{n} {k}' for k, n in sources.items()) or 'none'}).",
             "Scores: test metric x 100, mean over seeds at the LR with the best mean validation score, "
             "± 95% CI (t, n-1 degrees of freedom; from 3 seeds up, fewer print the mean and their count; one that "
             "passes 0 or 100 is clipped there, printed [low, high] and drawn so). Paper rows are dashed in figures.",
             ""]
    header = html.header_of(results_dir)
    lines[1:1] = ["", " · ".join(f"{k}: {v}" for k, v in header.items() if v and k != "report drawn")]
    title, intro = lines[0][2:], lines[3:]
    sections = build_sections(pretrain, trials, html.unmeasured_sd_of(results_dir) if unmeasured_sd is None else unmeasured_sd)
    sections += filter(None, [staged_section(read_rows(storage.join(results_dir, storage.STAGES_FILE)))])
    target = storage.join(results_dir, storage.REPORT_DIR)
    with tempfile.TemporaryDirectory() as staging:
        out = Path(staging) if storage.is_uri(results_dir) else Path(target)
        out.mkdir(parents=True, exist_ok=True)
        svgs: dict[str, str] = {}
        for number, section in enumerate(sections, 1):
            lines += [f"## {number}. {section.title}", ""]
            if section.figure is None:
                files = paper_files(section, out)
                lines += [f"_{section.note}_", "", *([section.table, ""] if section.table else []),
                          *([files, ""] if files else [])]
                continue
            section.figure.savefig(out / f"{section.name}.png", dpi=110)
            # laid out once: the SVG, PDF and HTML renderings keep the PNG's layout (the constrained layout's
            # solve is most of a figure's drawing time), and the SVG is drawn once for its file and the page
            section.figure.set_layout_engine("none")
            svgs[section.name] = html.svg(section.figure)
            files = paper_files(section, out, svg=svgs[section.name])
            lines += [f"![{section.title}]({section.name}.png)", "", section.note, "",
                      *([section.table, ""] if section.table else []), files, ""]
        (out / storage.REPORT_MD).write_text("\n".join(lines).rstrip() + "\n")
        (out / storage.REPORT_HTML).write_text(html.render(title, header=header, intro=intro, sections=sections,
                                                           svgs=svgs))
        if storage.is_uri(results_dir):  # a bucket: the drawn folder goes up as a whole
            transfer.upload(out, target)
    return storage.join(target, storage.REPORT_MD), sections
