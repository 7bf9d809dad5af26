"""Whether pretrained models beat their untrained control, per task and per family (docs/statistics.md,
"Pretrained against the untrained control").

Pure pandas on the report's enriched summary (raybiphase.results.report: columns source, run, task, family, final,
objective, size, budget, mask_ratio, init_from, score and ci in points, n_seeds, and the run's dotted settings).
A model against its control is decided only when both sides have a 95% interval (MIN_SEEDS seeds or more) and the
intervals are apart; otherwise it says so.
"""

from __future__ import annotations

import pandas as pd

from raybiphase.results.stats.matching import MIN_SEEDS, compare, key_text, setting_columns

UNTRAINED = "untrained"
"""The objective label of a sweep's control: its step-0 weights, fine-tuned like every checkpoint."""
CONTROL_ARM = ("model.", "data.", "train.")
"""The settings a model shares with its untrained control (phases and optimizer: the control has none)."""


def versus_control(s: pd.DataFrame) -> pd.DataFrame:
    """Per task, each pretrained model's final score against the untrained control of its own arm (the same model
    size, data and model settings: `CONTROL_ARM`): "above" or "below" when the 95% intervals are apart, "overlap"
    when they are not, "not resolved" without intervals (fewer than MIN_SEEDS seeds). A model with no matching
    control is left out. Columns: family, task, run, objective, score, ci, control, control_ci, verdict."""
    ours = s[(s["source"] == "raybiphase") & s["final"]]
    ours = ours.assign(size=ours["size"] if "size" in ours else "")
    key = ["task", "size", *(c for c in setting_columns(ours) if c.startswith(CONTROL_ARM))]
    controls = ours[ours["objective"] == UNTRAINED]
    models = ours[ours["objective"] != UNTRAINED].sort_values(["task", "run"])
    rows = []
    for _, r in models.iterrows():
        same = (controls[key].map(key_text) == [key_text(r[c]) for c in key]).all(axis=1)
        for _, c in controls[same].iterrows():
            verdict = {"a": "above", "b": "below", "overlap": "overlap"}.get(compare(r, c), "not resolved")
            rows.append({"family": r["family"], "task": r["task"], "run": r["run"], "objective": r["objective"],
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

