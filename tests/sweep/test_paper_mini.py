"""sweeps/paper_mini.yaml, shortened, run end to end on the local Ray, and its report checked against its own rows.

The shortened miniature keeps what only a spec of several sizes reaches: the CLM-only and MLM runs at 20% and 40%
of two sizes, the MLM 40% run and the 25% CLM split of two sizes (each with a pretraining replicate at the middle
size), the three sizes' controls; and what every study has: the middle size's early (undecayed) checkpoint of its
CLM and MLM runs, and continued MLM from its decayed CLM and MLM checkpoints (steps / 15; an SC task and MS MARCO
from a hub-layout snapshot; two LRs at the final checkpoints and one at the early one, 3 seeds so that intervals
exist, a few fine-tuning steps). Every run must train, every checkpoint (the controls, the early and the final ones) be fine-tuned once per LR and seed.
The report must then draw a panel per size, give the masking-ratio table a column per size, give each finding's
effect per size, and judge every model against the control of its own size; and every finding's effect per size
must equal what a plain merge of summary.parquet's rows (replicates pooled) on size, budget (or step), ratio and
task implies, its verdict one that its intervals allow. An effect that compared a 210m-like model with a 1b-like
one, or merged two CLM/MLM splits as replicates, is not that merge's, and fails.
"""

from __future__ import annotations

import io
import re

import pandas as pd
import pytest
import yaml

from tests.conftest import SMALL_DATA
from tests.finetune.test_production_loaders import squad_as_msmarco
from tests.inprocess import InProcessTrainer

pytestmark = [pytest.mark.ray, pytest.mark.slow]
SIZES = ("micro", "tiny", "mini")
TASKS = {"tweets": "SC", "msmarco": "IR"}  # msmarco: the hub path (real SQuAD text in an mteb/msmarco snapshot)
SCALE = 15  # 420 steps -> 28, the 25% split's 100 CLM steps -> 6, the continued runs' 120 -> 8
LRS = (1e-3, 3e-3)  # final checkpoints: the best chosen on validation, the spread is finding 2's LR half
EARLY = 6  # the early checkpoint of the tiny CLM-only and MLM 40% runs: undecayed (the decay is the last 4 steps)


def kept(run: dict) -> bool:
    """The runs at the longest budget from scratch: MLM at 20% and 40% and CLM only at the two smaller sizes, MLM
    at 40% and the 25% CLM split at the two larger ones; one replicate (train.seed 1) of the middle size's MLM 40%
    and 25% split; and the shorter continued runs."""
    if "model.init_from" in run:
        return run["phases.steps"] == 120
    if run.get("train.seed", 1) != 1:
        return False
    if run.get("model.size") == "mini" and "phases.clm_steps" not in run and run.get("phases.mask_ratio") != 0.4:
        return False
    return ("phases.steps" not in run and run.get("phases.mask_ratio", 0.4) in (0.2, 0.4)
            and run.get("phases.clm_steps", 100) == 100)


def scaled(run: dict) -> dict:
    """A run of the miniature, its steps / SCALE; the early checkpoint only where the miniature exports one at
    the middle size."""
    run = {**run, **{k: run[k] // SCALE for k in ("phases.clm_steps", "phases.steps") if k in run}}
    if "model.init_from" in run:
        run["model.init_from"] = run["model.init_from"].replace("-420", f"-{420 // SCALE}")
    early = "model.size" not in run and "train.export_steps" not in run and "model.init_from" not in run
    return {**run, "train.export_steps": [EARLY] if early else []}


def shortened(tmp_path, small_data) -> dict:
    spec = yaml.safe_load(open("sweeps/paper_mini.yaml"))
    spec["sweep"]["storage"] = str(tmp_path)
    spec["sweep"]["runs"] = [scaled(run) for run in spec["sweep"]["runs"] if kept(run)]
    spec["phases"]["steps"] //= SCALE
    spec["data"] = {**SMALL_DATA, "dir": small_data[0].dir, "decontaminate": False}  # the shared shards hold none out
    spec["optim"].update(warmup_steps=2, decay_steps=4)
    spec["train"].update(eval_every=100, eval_batches=1, checkpoint_every=100, export_steps=[EARLY])  # the base run
    spec["finetune"].update(tasks=list(TASKS), lrs=list(LRS), seeds=[0, 1, 2], max_examples=16, max_eval_examples=16,
                           max_steps=2, eval_every=2, max_len=64,  # the small data's blocks: what it trained on
                           exports=[{"steps": [EARLY], "tasks": list(TASKS), "lrs": [LRS[0]]}])  # one LR, early
    return spec


# ------------------------------------------------------------------------------------------------ the oracle


def pooled(s: pd.DataFrame) -> pd.DataFrame:
    """Replicates (names that differ only by -s1, -s2 before the hash) as one arm: the mean of their scores."""
    arm = s["run"].str.replace(r"-[0-9a-f]{6}$", "", regex=True).str.replace(r"-s\d+$", "", regex=True)
    keys = ["arm", "task", "pretrain_step"]
    means = s.assign(arm=arm).groupby(keys)[["score", "spread"]].mean()
    return s.assign(arm=arm).drop_duplicates(keys).drop(columns=["score", "spread"]).merge(means.reset_index(),
                                                                                           on=keys)


def summary_rows(root, *, final: bool = True) -> pd.DataFrame:
    """Our final checkpoints (else the earlier ones) from summary.parquet, in points, with the interval only from
    3 seeds up."""
    s = pd.read_parquet(root / "summary.parquet")
    s = s[s["source"] == "raybiphase"]
    s = s[(s["pretrain_step"] == s.groupby("run")["pretrain_step"].transform("max")) == final]
    return s.assign(score=s["test_mean"] * 100, ci=(s["test_ci95"] * 100).where(s["n_seeds"] >= 3),
                    spread=s["lr_spread"] * 100, seed=s["train.seed"],
                    size=s["model.size"], budget=s["phases.steps"], ratio=s["phases.mask_ratio"],
                    share=s["phases.clm_share"], init_from=s.get("model.init_from"))


def side(a_score, a_ci, b_score, b_ci) -> str:
    if pd.isna(a_ci) or pd.isna(b_ci):
        return "undecided"
    return "a" if a_score - a_ci > b_score + b_ci else "b" if b_score - b_ci > a_score + a_ci else "undecided"


def merged(a: pd.DataFrame, b: pd.DataFrame, on: list[str]) -> pd.DataFrame:
    return a.merge(b, on=on, suffixes=("_a", "_b"))


EFFECT = re.compile(r"(\w+)(?: at \w+)?: ([+-]\d+\.\d\d) pts \[([+-]\d+\.\d\d), ([+-]\d+\.\d\d)\]")


def effects(evidence: str) -> dict[str, tuple[float, float, float]]:
    """The per-size effects a finding's evidence prints: size -> (estimate, low, high)."""
    return {size: (float(e), float(lo), float(hi)) for size, e, lo, hi in EFFECT.findall(evidence)}


def check_effects(found: tuple[str, str], pairs: pd.DataFrame) -> None:
    """The finding's printed effect per size is the mean matched difference a - b of a plain merge (one task), and
    its verdict is one its intervals allow: held needs an interval above zero, not held one below, and with every
    interval across zero the finding is not resolved."""
    verdict, evidence = found
    printed = effects(evidence)
    expected = (pairs["score_a"] - pairs["score_b"]).groupby(pairs["size"]).mean()
    assert set(printed) == set(expected.index), evidence
    for size, (estimate, _, _) in printed.items():
        assert estimate == pytest.approx(expected[size], abs=0.006), (size, evidence)
    above = any(low > 0 for _, low, _ in printed.values())
    below = any(high < 0 for _, _, high in printed.values())
    assert verdict in {"not resolved", *(["held"] if above else []), *(["not held"] if below else []),
                       *(["mixed"] if above and below else [])}, evidence


def findings_table(report: str) -> dict[str, tuple[str, str]]:
    findings = report.rsplit("\n## ", 1)[1]
    rows = re.findall(r"^\| (\d)\. [^|]+\| ([^|]+) \| ([^|]+) \|$", findings, re.M)
    return {number: (verdict.strip(), evidence.strip()) for number, verdict, evidence in rows}


def section_table(report: str, title: str) -> list[str]:
    section = report.split(f". {title}\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


# ------------------------------------------------------------------------------------------------ the test


def test_the_shortened_miniature_reports_per_size_what_its_rows_imply(ray_cluster, small_data, hub_snapshots,
                                                                       tmp_path, monkeypatch):
    """Two tasks: an offline SC task, and paper.yaml's MS MARCO through the production loader (`datasets` on a
    hub-layout snapshot, dev and TREC-DL-like test qrels over one corpus, binary relevance: the path a cluster
    sweep's retrieval takes), so that finding 1 keeps to SC and finding 3 compares retrieval's slope."""
    from raybiphase.config import SweepSpec, from_dict
    from raybiphase.finetune import hub
    from raybiphase.finetune.tasks import _load_splits
    from raybiphase.results.store import read_rows
    from raybiphase.sweep.driver import run_sweep
    from raybiphase.telemetry.console import Console

    squad_as_msmarco(hub_snapshots)  # Ray's workers read the session's snapshots; this process, from here on
    monkeypatch.setenv(hub.DATASETS_DIR_ENV, str(hub_snapshots))
    _load_splits.cache_clear()
    out = io.StringIO()
    plan = run_sweep(from_dict(SweepSpec, shortened(tmp_path, small_data)), console=Console(out),
                     make_trainer=InProcessTrainer)  # segments in this process: no worker group per short segment
    root = tmp_path / "paper_mini"
    assert len(plan.runs) == 13 and sorted(c.config.model.size for c in plan.controls.values()) == sorted(
        [*SIZES, "tiny"])  # the replicates' seed has its own step-0 control
    assert set(read_rows(root / "pretrain.parquet")["run"]) == set(plan.runs)  # continued ones from their sources
    trials = read_rows(root / "finetune.parquet")
    ours = trials[trials["source"] == "raybiphase"]
    assert not ours.duplicated(["run", "pretrain_step", "task", "lr", "seed"]).any()
    steps = ours.groupby("run")["pretrain_step"].agg(lambda s: tuple(sorted(set(s))))
    early = {name for name in plan.runs if name.rsplit("-", 1)[0] in ("tiny-clm-28", "tiny-mlm40-28")}
    assert len(early) == 2 and steps.to_dict() == {  # the controls, the early and every final checkpoint
        **{name: (EARLY, run.steps) if name in early else (run.steps,) for name, run in plan.runs.items()},
        **{control: (0,) for control in plan.controls}}
    per_checkpoint = ours.groupby(["run", "pretrain_step"]).size()  # every seed of each LR: one LR early
    assert per_checkpoint.to_dict() == {(run, step): len(TASKS) * 3 * (1 if step == EARLY else len(LRS))
                                        for run, step in per_checkpoint.index}
    assert out.getvalue().splitlines()[-1].startswith("time: ")  # where the time went
    check_report(root)


def check_report(root) -> None:
    """The report in root/report against root's rows: panels and columns per size, own-size controls, findings."""
    from raybiphase.results import html
    from raybiphase.results.report import build_sections
    from raybiphase.results.store import read_rows
    from raybiphase.results.tables import mean_ci

    report = (root / "report" / "report.md").read_text()
    # the sections built again from the Parquet rows alone (no files drawn): the figures' panels, inspectable, and
    # every section's title, note and table as the sweep's report printed them
    sections = build_sections(read_rows(root / "pretrain.parquet"), read_rows(root / "finetune.parquet"),
                              html.unmeasured_sd_of(str(root)))
    for section in sections:
        assert f". {section.title}\n" in report and section.note in report and (section.table or "") in report
    s = summary_rows(root)
    assert set(s["size"]) == set(SIZES) and set(s["task"]) == set(TASKS)

    # the figures along an axis other than the size: one panel per (task, size), its size in the title
    drawn = {x.name: x for x in sections if x.figure is not None}
    for name in ("clm_share", "mask_ratio"):
        titles = sorted(ax.get_title() for ax in drawn[name].figure.axes if ax.get_visible())
        assert titles == sorted(f"{family} · {task} · {size}" for task, family in TASKS.items() for size in SIZES), name

    # the masking-ratio table: a column per size, a row per MLM-only run of every size and ratio
    table = section_table(report, "Downstream score vs masking ratio (MLM-only runs)")
    assert all(f"{task} · {size}" in table[0] for task in TASKS for size in SIZES)
    scratch = s[(s["budget"] > 0) & s["init_from"].isna()]
    only = scratch[scratch["share"] == 0]
    printed = {(row.split(" | ")[1].split()[0], float(row.split(" | ")[2])) for row in table[2:]}
    assert printed == {(z, round(r * 100, 1)) for z, r in zip(only["size"], only["ratio"])}

    # every pretrained model against the control of its own size, one row each, the verdict from the intervals
    control = s[s["budget"] == 0].set_index(["size", "seed", "task"])  # each pretraining seed has its own control
    models = s[s["budget"] > 0].set_index(["run", "task"])
    rows = section_table(report, "Pretrained vs untrained control, with baselines")[2:]
    assert sorted(tuple(r.strip("| ").split(" | ")[2:0:-1]) for r in rows) == sorted(models.index)
    for row in rows:
        task, run, against, verdict = (row.strip("| ").split(" | ")[i] for i in (1, 2, 5, 7))
        model = models.loc[(run, task)]
        own = control.loc[(model["size"], model["seed"], task)]
        assert against == mean_ci(own["score"], own["ci"], own["n_seeds"]), run
        apart = side(model["score"], model["ci"], own["score"], own["ci"])
        resolved = pd.notna(model["ci"]) and pd.notna(own["ci"])
        assert verdict == {"a": "above", "b": "below"}.get(apart, "overlap" if resolved else "not resolved"), run

    # the findings: each printed effect what a plain merge of the arms (replicates pooled) on size, budget, ratio and
    # task implies, each verdict one its intervals allow; the intervals count the replicates' spread
    found = findings_table(report)
    assert "Pretraining noise is measured per model size and objective where an arm of it was replicated" in report
    assert "1 replicated arm, 1 degree of freedom" in report  # each replicated stratum: one arm, two runs
    arms = pooled(scratch)
    only, clm, two = arms[arms["share"] == 0], arms[arms["share"] == 1], arms[(arms["share"] > 0) & (arms["share"] < 1)]
    one = merged(only, clm, ["size", "budget", "task"])
    check_effects(found["1"], one[one["task"] != "msmarco"])  # on SC and QA, as the paper states it
    assert set(one["size"]) == {"micro", "tiny"}
    four = merged(two, only, ["size", "budget", "ratio", "task"])
    check_effects(found["4"], four)
    assert set(four["size"]) == {"tiny", "mini"} and len(four) == 2 * len(TASKS)  # the replicated split vs pooled MLM
    # finding 3: the slope on the masking ratio (per task, the sizes with two ratios) grows from micro to tiny, and
    # retrieval's slope exceeds the other family's, per size
    ratios = only[only["size"].isin(["micro", "tiny"])].pivot_table(index=["size", "task"], columns="ratio",
                                                                     values="score")
    slopes = ((ratios[0.4] - ratios[0.2]) / 2).unstack("task")  # points per 10 points of masking
    trend = re.match(r"([+-]\d+\.\d\d) pts", found["3"][1].split("the smallest's: tiny - micro: ", 1)[1])
    assert float(trend.group(1)) == pytest.approx(slopes.loc["tiny"].mean() - slopes.loc["micro"].mean(), abs=0.006)
    retrieval = effects(found["3"][1].split("retrieval's slope - the other families': ", 1)[1])
    assert set(retrieval) == {"micro", "tiny"}
    for size, (estimate, _, _) in retrieval.items():
        assert estimate == pytest.approx(slopes.loc[size, "msmarco"] - slopes.loc[size, "tweets"], abs=0.006), size
    # finding 2: CLM - MLM at the early checkpoint (one LR there), and MLM's LR spread - CLM's at the final ones
    early = pooled(summary_rows(root, final=False))
    efficiency = merged(early[early["share"] == 1], early[early["share"] == 0], ["size", "pretrain_step", "task"])
    assert len(efficiency) == len(TASKS)
    two_parts = found["2"][1].split(" · ")
    check_effects((found["2"][0], two_parts[0]), efficiency)
    spread = merged(only, clm, ["size", "budget", "task"])
    spread = spread.assign(score_a=spread["spread_a"], score_b=spread["spread_b"])
    assert two_parts[1].startswith("LR spread, max - min over the complete LRs: ")
    check_effects((found["2"][0], two_parts[1]), spread)
    continued = pooled(s[s["init_from"].notna()])
    from_clm = continued["init_from"].str.contains("-clm-")
    five = merged(continued[from_clm], continued[~from_clm], ["size", "budget", "ratio", "task"])
    assert len(five) == len(TASKS)
    check_effects(found["5"], five)
    # beyond the paper: mini (the 1b-like size) predicted from micro and tiny only, beside what it showed, and the
    # share of its cells whose interval covered it (the forecast at the next size: none above mini)
    prediction = report.split("Beyond the paper: the next model size, predicted from the smaller ones\n", 1)[1]
    prediction = prediction.split("\n## ", 1)[0]
    assert "**mini predicted from micro, tiny only, beside what it showed**" in prediction
    assert re.search(r"mini's scores fell inside their 95% intervals in (\d+ of \d+ \(\d+%\)|none)", prediction)
