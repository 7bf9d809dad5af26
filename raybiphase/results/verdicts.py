"""Verdicts from intervals: whether pretrained models beat their untrained control, per task and per family, and
the paper's five findings at the scale of the user's sweep.

Pure pandas on the report's enriched summary (raybiphase.results.report: columns source, run, task, family, final,
objective, size, budget, mask_ratio, init_from, score and ci in points, n_seeds, and the run's dotted settings).
A comparison is decided only when both sides have a 95% interval (MIN_SEEDS seeds or more) and the intervals are
apart; otherwise it says so.

Comparisons are between matched arms (`matched_pairs`): the same model size, budget, masking ratio, data,
optimizer and every other setting that shapes the weights, only the compared factor differing. Every matched pair
counts once and nothing is the best of several: the best 1b MLM model never stands in for a 610m comparison, and
a finding's verdict gives each size's tally.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from raybiphase.config import shapes_weights
from raybiphase.results.aggregate import t_quantile
from raybiphase.naming import steps_label

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
    """Per task, each pretrained model's final score against the untrained control of its own arm (the same model
    size, data and model settings: `CONTROL_ARM`): "above" or "below" when the 95% intervals are apart, "overlap"
    when they are not, "not resolved" without intervals (fewer than MIN_SEEDS seeds). A model with no matching
    control is left out. Columns: family, task, run, objective, score, ci, control, control_ci, verdict."""
    ours = s[(s["source"] == "raybiphase") & s["final"]]
    ours = ours.assign(size=ours["size"] if "size" in ours else "")
    key = ["task", "size", *(c for c in _setting_columns(ours) if c.startswith(CONTROL_ARM))]
    controls = ours[ours["objective"] == UNTRAINED]
    models = ours[ours["objective"] != UNTRAINED].sort_values(["task", "run"])
    rows = []
    for _, r in models.iterrows():
        same = (controls[key].map(_key_text) == [_key_text(r[c]) for c in key]).all(axis=1)
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


# ------------------------------------------------------------------------------------------------ matched arms

HELD, NOT_HELD, MIXED, UNRESOLVED = "held", "not held", "mixed", "not resolved"

ARM = ("source", "task", "pretrain_step", "size", "budget", "mask_ratio", "init_from")
"""The enriched summary's columns that place a checkpoint in the grid; with every other weight-shaping setting
column (`_setting_columns`) they define an arm. Two rows are matched when they agree on all of them except the
factor a comparison varies."""
DESCRIBED = frozenset({"model.size", "phases.steps", "phases.mask_ratio", "model.init_from", "phases.clm_share",
                       "phases.clm_steps", "phases.plan"})
"""Settings the ARM columns (and the objective) already stand for; `phases.plan` is the explicit form of the same
phases, and runs with knobs beyond the paper are kept out of the findings by the report (`knobs`)."""
CONTROL_ARM = ("model.", "data.", "train.")
"""The settings a model shares with its untrained control (phases and optimizer: the control has none)."""


def _setting_columns(frame: pd.DataFrame) -> list[str]:
    """Dotted run settings that shape the weights (raybiphase.config.shapes_weights), besides those ARM stands for."""
    return sorted(c for c in frame.columns if "." in c and c not in DESCRIBED and shapes_weights(c))


def _key_text(value: object) -> str:
    """A setting as a match key: missing values (None, NaN) are one value, the rest compare by their text."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def matched_pairs(a: pd.DataFrame, b: pd.DataFrame, vary: tuple[str, ...]) -> pd.DataFrame:
    """Every row of `a` with every row of `b` that agrees with it on the arm (ARM and the weight-shaping settings)
    except `vary`: one row per matched pair, each pair once, nothing chosen as the best of several. Columns: the
    key, run_a, run_b, score_a, ci_a, score_b, ci_b, side (`compare`'s answer)."""
    both = pd.concat([a, b])
    key = [c for c in (*ARM, *_setting_columns(both)) if c in both and c not in vary]
    left, right = (frame.assign(**{f"_k{i}": frame[c].map(_key_text) for i, c in enumerate(key)}) for frame in (a, b))
    on = [f"_k{i}" for i in range(len(key))]
    merged = left.merge(right[[*on, "run", "score", "ci"]], on=on, suffixes=("_a", "_b"))
    sides = [compare(pd.Series({"score": sa, "ci": ca}), pd.Series({"score": sb, "ci": cb}))
             for sa, ca, sb, cb in zip(merged["score_a"], merged["ci_a"], merged["score_b"], merged["ci_b"])]
    columns = ["task", "size", "budget", "pretrain_step", "run_a", "run_b", "score_a", "ci_a", "score_b", "ci_b"]
    out = merged.assign(size=merged["size"] if "size" in merged else "").reindex(columns=columns)
    return out.assign(side=sides)


def judge(sides: Sequence[str], expected: str = "a", whose: str = "the paper's") -> tuple[str, str]:
    """HELD when every decided pair goes the claim's way, NOT_HELD when every one goes the other way, MIXED when
    both happen, UNRESOLVED when none is decided; with the tally."""
    if not len(sides):
        return UNRESOLVED, "nothing to compare in this sweep"
    way = sum(side == expected for side in sides)
    other = sum(side in ("a", "b") and side != expected for side in sides)
    tally = f"{way} of {len(sides)} comparisons {whose} way, {other} the other way, {len(sides) - way - other} undecided"
    if way and other:
        return MIXED, tally
    return (HELD if way else NOT_HELD if other else UNRESOLVED), tally


def judge_by_size(pairs: pd.DataFrame, expected: str = "a") -> tuple[str, str]:
    """`judge` over every matched pair, with the tally of each model size when the pairs span several."""
    verdict, tally = judge(list(pairs["side"]), expected)
    sizes = sorted(s for s in pairs["size"].unique() if s) if len(pairs) else []
    if len(sizes) > 1:
        tally += " (" + "; ".join(f"{size}: {judge(list(pairs.loc[pairs['size'] == size, 'side']), expected)[1]}"
                                   for size in sizes) + ")"
    return verdict, tally


# ------------------------------------------------------------------------------------------------ the findings


def _of(frame: pd.DataFrame, *objectives: str) -> pd.DataFrame:
    return frame[frame["objective"].isin(objectives)]


def _undecayed(ours: pd.DataFrame) -> pd.DataFrame:
    """Intermediate checkpoints of runs from scratch taken before their decay began, each set of weights once: a
    row copied from the run that shares the prefix (`trials_of`) is the same checkpoint and is left out."""
    early = ours[~ours["final"] & ours["init_from"].isna()]
    if "optim.decay_steps" in early:
        decay_start = early["budget"] - pd.to_numeric(early["optim.decay_steps"], errors="coerce")
        early = early[~(early["pretrain_step"] > decay_start)]  # unknown decay: kept
    if "trials_of" in early:
        early = early[early["trials_of"].map(_key_text) == ""]
    return early


def _steps_text(steps: Sequence[float]) -> str:
    return ", ".join(steps_label(int(s)) for s in steps)


def crossover(pairs: pd.DataFrame) -> str:
    """Where CLM's lead over MLM (side a) ends along the pretraining steps, per model size: the steps at which the
    decided matched pairs mostly favour each objective, and the interval the curves cross in, if they do."""
    out = []
    for size, group in pairs.groupby("size", sort=True):
        lead = {}
        for step, at in group.groupby("pretrain_step", sort=True):
            a, b = int((at["side"] == "a").sum()), int((at["side"] == "b").sum())
            lead[step] = "CLM" if a > b else "MLM" if b > a else "even"
        clm = [s for s, who in lead.items() if who == "CLM"]
        mlm = [s for s, who in lead.items() if who == "MLM"]
        text = (f"CLM ahead at {_steps_text(clm) or 'no step'}, MLM ahead at {_steps_text(mlm) or 'no step'}"
                f" of {_steps_text(list(lead))}")
        later = [s for s in mlm if clm and s > clm[0]]
        if later:
            before = max(s for s in lead if s < later[0] and lead[s] == "CLM") if clm[0] < later[0] else clm[0]
            text += f"; the curves cross between steps {steps_label(int(before))} and {steps_label(int(later[0]))}"
        out.append(f"{size}: {text}" if size else text)
    return "; ".join(out)


def _data_efficiency(ours: pd.DataFrame) -> tuple[str, str, str]:
    claim = "2. CLM is more data-efficient early (it leads MLM at the earliest undecayed checkpoints)"
    early = _undecayed(ours)
    pairs = matched_pairs(_of(early, "CLM"), _of(early, "MLM"), vary=("objective", "budget", "mask_ratio"))
    if pairs.empty:
        return claim, UNRESOLVED, "nothing to compare in this sweep (no undecayed intermediate checkpoints)"
    first = pairs[pairs["pretrain_step"] == pairs.groupby("size")["pretrain_step"].transform("min")]
    verdict, tally = judge_by_size(first)
    return claim, verdict, f"at the earliest step: {tally}; {crossover(pairs)}"


def _ratio_verdict(pairs: pd.DataFrame) -> str:
    sides = set(pairs["side"])
    if {"a", "b"} <= sides:
        return HELD
    return NOT_HELD if sides & {"a", "b"} and "overlap" not in sides else UNRESOLVED


def _masking(mlm: pd.DataFrame) -> tuple[str, str, str]:
    """Finding 3 per model size: the lowest against the highest masking ratio of each size, matched arms; held
    when the better ratio changes with the task within a size, or with the size for the same task."""
    claim = "3. No masking ratio is best on every task"
    verdicts, evidence, winners = [], [], {}
    for size, group in mlm.groupby("size", sort=True):
        ratios = sorted(group["mask_ratio"].dropna().unique())
        if len(ratios) < 2:
            continue
        low, high = (group[group["mask_ratio"] == r] for r in (ratios[0], ratios[-1]))
        pairs = matched_pairs(low, high, vary=("mask_ratio",))
        names = {"a": f"{ratios[0]:.0%}", "b": f"{ratios[-1]:.0%}"}
        decided = pairs[pairs["side"].isin(list(names))]
        for task, side in zip(decided["task"], decided["side"]):
            winners.setdefault(task, set()).add(side)
        verdicts.append(_ratio_verdict(pairs))
        listed = "; ".join(f"{names[p.side]} better on {p.task} {p.budget:g}" for p in decided.itertuples())
        evidence.append(f"{size + ': ' if size else ''}masking {names['a']} vs {names['b']} (task, budget): "
                        f"{listed or 'none decided'}; {len(pairs) - len(decided)} of {len(pairs)} undecided")
    if not verdicts:
        return claim, UNRESOLVED, "one masking ratio per model size in this sweep"
    by_size = any(len(sides) > 1 for sides in winners.values())  # one task, a different winner per size
    verdict = HELD if HELD in verdicts or by_size else NOT_HELD if set(verdicts) == {NOT_HELD} else UNRESOLVED
    return claim, verdict, "; ".join(evidence)


def findings(s: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The paper's five findings, each (claim, verdict, evidence), from matched pairs of our checkpoints (the
    enriched summary: objective, size, budget, mask_ratio, init_from, pretrain_step, final, score, ci, family and
    the dotted settings). Every comparison is between arms that differ in the compared factor only, each matched
    pair counts once, and the evidence gives each model size's tally. An arm pretrained several times is one side,
    decided on the spread between its pretraining runs (`pool_replicates`)."""
    ours = s[s["source"] == "raybiphase"]
    ours = pool_replicates(ours.assign(size=ours["size"] if "size" in ours else ""))
    final = ours[ours["final"] & ours["init_from"].isna()]
    sc_qa = final[final["family"].isin(["SC", "QA"])]
    continued = ours[ours["final"] & ours["init_from"].notna()]
    from_clm = continued["run"].astype(str).str.contains("-clm-dec")  # the name says the start: 610m-clm-dec42k-...
    return [
        ("1. MLM beats CLM on sequence classification and QA",
         *judge_by_size(matched_pairs(_of(sc_qa, "MLM"), _of(sc_qa, "CLM"), vary=("objective", "mask_ratio")))),
        _data_efficiency(ours),
        _masking(_of(final, "MLM")),
        ("4. Under a fixed budget, CLM then MLM beats MLM only",
         *judge_by_size(matched_pairs(_of(final, "CLM→MLM"), _of(final, "MLM"), vary=("objective",)))),
        ("5. Continued MLM from a CLM checkpoint beats continued MLM from an MLM checkpoint",
         *judge_by_size(matched_pairs(continued[from_clm], continued[~from_clm], vary=("init_from",)))),
    ]


# ------------------------------------------------------------------------------------------------ replicates

REPLICATE = "train.seed"
"""The setting that makes a pretraining replicate: the init and the data order, together."""


def pool_replicates(frame: pd.DataFrame) -> pd.DataFrame:
    """Arms pretrained more than once (rows equal in every setting but REPLICATE) as one row each, so comparisons
    are decided on the spread between pretraining runs: `score` is the mean of the replicates' scores and `ci` the
    t-interval of that mean over the replicates (n-1 degrees of freedom; NaN under MIN_SEEDS replicates). Each
    replicate's score is already a mean over fine-tuning seeds, so the interval holds both sources of noise; the
    fine-tuning interval stays beside it as `seed_ci` (the replicates' mean), `n_runs` counts the replicates and
    `between_sd` is their standard deviation. Arms pretrained once pass through unchanged (n_runs 1)."""
    out = frame.assign(n_runs=1, seed_ci=frame["ci"] if "ci" in frame else math.nan, between_sd=math.nan)
    if REPLICATE not in frame or frame[REPLICATE].nunique() < 2:
        return out
    columns = [c for c in (*ARM, "objective", "family", *_setting_columns(frame)) if c in frame and c != REPLICATE]
    keyed = out.assign(_arm=out[columns].map(_key_text).agg("\x1f".join, axis=1))
    rows = []
    for _, arm in keyed.groupby("_arm", sort=False):
        first = arm.sort_values(REPLICATE).iloc[0].copy()
        if arm[REPLICATE].nunique() > 1:
            n, sd = len(arm), float(arm["score"].std(ddof=1))
            first["score"], first["n_runs"], first["between_sd"] = float(arm["score"].mean()), n, sd
            first["seed_ci"] = float(arm["ci"].mean())
            first["ci"] = t_quantile(0.975, n - 1) * sd / math.sqrt(n) if n >= MIN_SEEDS else math.nan
            first["run"] = f"{first['run']} (+{n - 1} replicates)"
        rows.append(first.drop("_arm"))
    return pd.DataFrame(rows).reset_index(drop=True)
