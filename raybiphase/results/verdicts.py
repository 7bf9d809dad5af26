"""Verdicts from intervals: whether pretrained models beat their untrained control, per task and per family.

Pure pandas on the report's enriched summary (raybiphase.results.report: columns source, run, task, family, final,
objective, score and ci in points, n_seeds). A comparison is decided only when both sides have a 95% interval
(MIN_SEEDS seeds or more) and the intervals are apart; otherwise it says so.
"""

from __future__ import annotations

import pandas as pd

MIN_SEEDS = 3
"""Fewest seeds behind a printed or drawn interval: with 2, Student's t at 1 degree of freedom makes it meaningless
(12.7 standard errors); fewer seeds show the mean and the seed count only."""
UNTRAINED = "untrained"
"""The objective label of a sweep's control: its step-0 weights, fine-tuned like every checkpoint."""


def versus_control(s: pd.DataFrame) -> pd.DataFrame:
    """Per task, each pretrained model's final score against the untrained control of the same sweep: "above" or
    "below" when the 95% intervals are apart, "overlap" when they are not, "not resolved" without intervals
    (fewer than MIN_SEEDS seeds). Columns: family, task, run, objective, score, ci, control, control_ci, verdict."""
    ours = s[(s["source"] == "raybiphase") & s["final"]]
    rows = []
    for task, group in ours.groupby("task", sort=True):
        control = group[group["objective"] == UNTRAINED]
        if control.empty:
            continue
        c = control.iloc[0]
        for _, r in group[group["objective"] != UNTRAINED].sort_values("run").iterrows():
            if pd.isna(r["ci"]) or pd.isna(c["ci"]):
                verdict = "not resolved"
            elif r["score"] - r["ci"] > c["score"] + c["ci"]:
                verdict = "above"
            elif r["score"] + r["ci"] < c["score"] - c["ci"]:
                verdict = "below"
            else:
                verdict = "overlap"
            rows.append({"family": r["family"], "task": task, "run": r["run"], "objective": r["objective"],
                         "score": r["score"], "ci": r["ci"], "n_seeds": r["n_seeds"], "control": c["score"],
                         "control_ci": c["ci"], "control_seeds": c["n_seeds"], "verdict": verdict})
    return pd.DataFrame(rows, columns=["family", "task", "run", "objective", "score", "ci", "n_seeds", "control",
                                       "control_ci", "control_seeds", "verdict"])


def family_verdicts(versus: pd.DataFrame) -> dict[str, str]:
    """One sentence per family: do the pretrained models beat the untrained control, 95% intervals apart?"""
    out = {}
    for family, group in versus.groupby("family", sort=True):
        above, n = int((group["verdict"] == "above").sum()), len(group)
        unresolved = int((group["verdict"] == "not resolved").sum())
        if above == n:
            verdict = f"yes: all {n} pretrained model-task pairs beat the untrained control, 95% intervals apart"
        elif unresolved == n:
            verdict = f"not resolved: fewer than {MIN_SEEDS} seeds, no intervals"
        else:
            verdict = (f"{'partly' if above else 'no'}: {above} of {n} pretrained model-task pairs beat the untrained "
                       f"control with 95% intervals apart ({n - above - unresolved} overlap or fall below"
                       + (f", {unresolved} unresolved" if unresolved else "") + ")")
        out[family] = verdict
    return out
