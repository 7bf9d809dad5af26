"""Verdicts from intervals: whether pretrained models beat their untrained control, per task and per family, and
the paper's five findings (../shared/paper.md) at the scale of the user's sweep.

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


def compare(a: pd.Series, b: pd.Series) -> str:
    """'a' or 'b' when that side's 95% interval lies wholly above the other's, 'overlap', or 'no interval'."""
    if pd.isna(a["ci"]) or pd.isna(b["ci"]):
        return "no interval"
    if a["score"] - a["ci"] > b["score"] + b["ci"]:
        return "a"
    if b["score"] - b["ci"] > a["score"] + a["ci"]:
        return "b"
    return "overlap"


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
            verdict = {"a": "above", "b": "below", "overlap": "overlap"}.get(compare(r, c), "not resolved")
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


# ------------------------------------------------------------------------------------------------ the findings

HELD, NOT_HELD, MIXED, UNRESOLVED = "held", "not held", "mixed", "not resolved"


def _pairs(a: pd.DataFrame, b: pd.DataFrame, on: list[str]) -> list[tuple[str, str]]:
    """(label, side) for every row of `a` matched with a row of `b` on `on`, the better of each side per match."""
    out = []
    best = lambda frame: frame.sort_values("score", ascending=False).drop_duplicates(on)  # noqa: E731
    for _, row in best(a).merge(best(b), on=on, suffixes=("_a", "_b")).iterrows():
        left = pd.Series({"score": row["score_a"], "ci": row["ci_a"]})
        right = pd.Series({"score": row["score_b"], "ci": row["ci_b"]})
        label = " ".join(f"{row[k]:g}" if isinstance(row[k], float) else str(row[k]) for k in on)
        out.append((label, compare(left, right)))
    return out


def judge(pairs: list[tuple[str, str]], expected: str = "a", whose: str = "the paper's") -> tuple[str, str]:
    """HELD when every decided pair goes the claim's way, NOT_HELD when every one goes the other way, MIXED when
    both happen, UNRESOLVED when none is decided; with the tally."""
    if not pairs:
        return UNRESOLVED, "nothing to compare in this sweep"
    way = sum(side == expected for _, side in pairs)
    other = sum(side not in (expected, "overlap", "no interval") for _, side in pairs)
    tally = (f"{way} of {len(pairs)} comparisons {whose} way, {other} the other way, "
             f"{len(pairs) - way - other} undecided")
    if way and other:
        return MIXED, tally
    return (HELD if way else NOT_HELD if other else UNRESOLVED), tally


def findings(s: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The paper's five findings, each (claim, verdict, evidence), from our final checkpoints' scores and intervals
    (the enriched summary: objective, budget, mask_ratio, init_from, pretrain_step, final, score, ci, family)."""
    ours = s[s["source"] == "raybiphase"]
    final = ours[ours["final"] & ours["init_from"].isna() & (ours["objective"] != UNTRAINED)]
    mlm, clm = final[final["objective"] == "MLM"], final[final["objective"] == "CLM"]
    two = final[final["objective"] == "CLM→MLM"]
    out = []
    sc_qa = ["SC", "QA"]
    out.append(("1. MLM beats CLM on sequence classification and QA",
                *judge(_pairs(mlm[mlm["family"].isin(sc_qa)], clm[clm["family"].isin(sc_qa)], ["task", "budget"]))))
    early = ours[~ours["final"] & ours["init_from"].isna()]
    first = early[early["pretrain_step"] == early["pretrain_step"].min()] if len(early) else early
    out.append(("2. CLM is more data-efficient early (its earliest checkpoint beats MLM's)",
                *judge(_pairs(first[first["objective"] == "CLM"], first[first["objective"] == "MLM"],
                                 ["task", "pretrain_step"]))))
    ratios = sorted(mlm["mask_ratio"].dropna().unique())
    if len(ratios) >= 2:
        low, high = (mlm[mlm["mask_ratio"] == r].assign(budget=mlm["budget"]) for r in (ratios[0], ratios[-1]))
        pairs = _pairs(low, high, ["task", "budget"])
        sides = {side for _, side in pairs}
        verdict = (HELD if {"a", "b"} <= sides else NOT_HELD if sides & {"a", "b"} and not sides & {"overlap"}
                   else UNRESOLVED)
        names = {"a": f"{ratios[0]:.0%}", "b": f"{ratios[-1]:.0%}"}
        decided = [f"{names[side]} better on {label}" for label, side in pairs if side in names]
        evidence = (f"masking {names['a']} vs {names['b']} (task, budget): " + ("; ".join(decided) or "none decided")
                    + f"; {len(pairs) - len(decided)} of {len(pairs)} undecided")
        out.append(("3. No masking ratio is best on every task", verdict, evidence))
    else:
        out.append(("3. No masking ratio is best on every task", UNRESOLVED, "one masking ratio in this sweep"))
    out.append(("4. Under a fixed budget, CLM then MLM beats MLM only",
                *judge(_pairs(two, mlm[mlm["mask_ratio"].isin(two["mask_ratio"])], ["task", "budget"]))))
    continued = ours[ours["final"] & ours["init_from"].notna()]
    start = continued["run"].astype(str).str.contains("-clm-dec")  # the name says the start: 610m-clm-dec42k-...
    out.append(("5. Continued MLM from a CLM checkpoint beats continued MLM from an MLM checkpoint",
                *judge(_pairs(continued[start], continued[~start], ["task", "budget"]))))
    return out

