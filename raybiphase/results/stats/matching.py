"""The matched arms and the pooled replicates the paper's findings are built on (docs/statistics.md, "What is
compared"; raybiphase.results.stats.findings).

Comparisons are between matched arms (`matched_pairs`): the same model size, budget, masking ratio, data,
optimizer and every other setting that shapes the weights, only the compared factor differing. Every matched pair
counts once and nothing is the best of several: the best 1b MLM model never stands in for a 610m comparison. An
arm is every weight-shaping setting but the pretraining seed (`arm_ids`); its replicates are one side
(`pool_replicates`). Pure pandas on the report's enriched summary (raybiphase.results.stats.control).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from raybiphase.config import shapes_weights
from raybiphase.results.aggregate import t_quantile

MIN_SEEDS = 3
"""Fewest seeds behind a printed or drawn interval: with 2, Student's t at 1 degree of freedom makes it meaningless
(12.7 standard errors); fewer seeds show the mean and the seed count only."""


def compare(a: Mapping, b: Mapping) -> str:
    """'a' or 'b' when that side's 95% interval lies wholly above the other's, 'overlap', or 'no interval'."""
    if pd.isna(a["ci"]) or pd.isna(b["ci"]):
        return "no interval"
    if a["score"] - a["ci"] > b["score"] + b["ci"]:
        return "a"
    if b["score"] - b["ci"] > a["score"] + a["ci"]:
        return "b"
    return "overlap"


# ------------------------------------------------------------------------------------------------ matched arms

ARM = ("source", "task", "pretrain_step", "size", "budget", "mask_ratio", "init_from")
"""The enriched summary's columns that place a checkpoint in the grid; with every other weight-shaping setting
column (`setting_columns`) they define an arm. Two rows are matched when they agree on all of them except the
factor a comparison varies."""
DESCRIBED = frozenset({"model.size", "phases.steps", "phases.mask_ratio", "model.init_from", "phases.clm_share",
                       "phases.clm_steps", "phases.plan"})
"""Settings the ARM columns (and the objective) already stand for; `phases.plan` is the explicit form of the same
phases, and runs with knobs beyond the paper are kept out of the findings by the report (`knobs`)."""


def setting_columns(frame: pd.DataFrame) -> list[str]:
    """Dotted run settings that shape the weights (raybiphase.config.shapes_weights), besides those ARM stands for."""
    return sorted(c for c in frame.columns if "." in c and c not in DESCRIBED and shapes_weights(c))


def key_text(value: object) -> str:
    """A setting as a match key: missing values (None, NaN) are one value, the rest compare by their text."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def matched_pairs(a: pd.DataFrame, b: pd.DataFrame, vary: tuple[str, ...]) -> pd.DataFrame:
    """Every row of `a` with every row of `b` that agrees with it on the arm (ARM and the weight-shaping settings
    but the pretraining seed: pass rows pooled over replicates, `pool_replicates`) except `vary`: one row per matched
    pair, each pair once, nothing chosen as the best of several. Columns: the key, run_a, run_b, score_a, ci_a,
    score_b, ci_b, arm_a and arm_b where the rows have an `arm`, side (`compare`'s answer)."""
    both = pd.concat([a, b])
    key = [c for c in (*ARM, *setting_columns(both)) if c in both and c not in vary and c != REPLICATE]
    left, right = (frame.assign(**{f"_k{i}": frame[c].map(key_text) for i, c in enumerate(key)}) for frame in (a, b))
    on = [f"_k{i}" for i in range(len(key))]
    carried = ["run", "score", "ci", *(["arm"] if "arm" in right else [])]
    merged = left.merge(right[[*on, *carried]], on=on, suffixes=("_a", "_b"))
    sides = [compare({"score": sa, "ci": ca}, {"score": sb, "ci": cb})
             for sa, ca, sb, cb in zip(merged["score_a"], merged["ci_a"], merged["score_b"], merged["ci_b"])]
    columns = ["task", "size", "budget", "pretrain_step", "run_a", "run_b", "score_a", "ci_a", "score_b", "ci_b",
               *(["arm_a", "arm_b"] if "arm_a" in merged else [])]
    out = merged.assign(size=merged["size"] if "size" in merged else "").reindex(columns=columns)
    return out.assign(side=sides)


# ------------------------------------------------------------------------------------------------ replicates

REPLICATE = "train.seed"
"""The setting that makes a pretraining replicate: the init and the data order, together."""


def arm_ids(frame: pd.DataFrame, without: tuple[str, ...] = ()) -> pd.Series:
    """Each row's arm as text: the checkpoint's place in the grid (ARM but the task), its objective and every
    weight-shaping setting, the ones ARM stands for included, but REPLICATE and `without`. Two replicates of one
    recipe share an arm; two CLM/MLM splits of one budget do not."""
    settings = sorted(c for c in frame.columns if "." in c and shapes_weights(c))
    columns = [c for c in (*ARM, "objective", *settings) if c in frame and c not in ("task", REPLICATE, *without)]
    out = pd.Series("", index=frame.index)
    for column in columns:
        out = out + frame[column].map(key_text).astype(str) + "\x1f"
    return out


def with_noise_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows with what `raybiphase.results.stats.effects` reads: `arm`, `lineage` (the arm but its checkpoint's
    step: one recipe's runs), `replicate` (the pretraining seed), the
    fine-tuning standard error and degrees of freedom of the score (`score_se`, `score_df`: from its 95% interval
    over seeds) and of the LR spread in points (`spread`, `spread_se`, `spread_df`)."""
    n = pd.to_numeric(frame["n_seeds"], errors="coerce") if "n_seeds" in frame else pd.Series(math.nan, frame.index)
    quantile = n.map(lambda k: t_quantile(0.975, int(k) - 1) if k >= MIN_SEEDS else math.nan)
    spread = pd.to_numeric(frame["lr_spread"], errors="coerce") * 100 if "lr_spread" in frame else math.nan
    spread_se = pd.to_numeric(frame["lr_spread_se"], errors="coerce") * 100 if "lr_spread_se" in frame else math.nan
    return frame.assign(
        arm=arm_ids(frame), lineage=arm_ids(frame, without=("pretrain_step",)), replicate=frame[REPLICATE].map(key_text) if REPLICATE in frame else "",
        score_se=frame["ci"] / quantile, score_df=n - 1, spread=spread,
        spread_se=pd.Series(spread_se, index=frame.index).where(n >= MIN_SEEDS), spread_df=n - 1)


def pool_replicates(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per arm and task (`arm_ids`: rows equal in every weight-shaping setting but REPLICATE are one arm;
    two CLM/MLM splits of one budget are two): `score` the mean of the replicates' scores and `ci` the t-interval of
    that mean over the replicates (n-1 degrees of freedom; NaN under MIN_SEEDS replicates). Each replicate's score
    is already a mean over fine-tuning seeds, so the interval holds both sources of noise; the fine-tuning interval
    stays beside it as `seed_ci` (the replicates' mean), `n_runs` counts the replicates and `between_sd` is their
    standard deviation (the spread of this arm alone). `score_se`, `spread` and `spread_se` are pooled as the
    standard errors of means over the replicates (`with_noise_columns`). Arms pretrained once pass through with
    n_runs 1."""
    return pool(with_noise_columns(frame))


def pool(keyed: pd.DataFrame) -> pd.DataFrame:
    """`pool_replicates` of rows that already have `with_noise_columns`' columns."""
    out = keyed.assign(n_runs=1, seed_ci=keyed["ci"] if "ci" in keyed else math.nan, between_sd=math.nan)
    if not len(out) or out.groupby(["arm", "task"])["replicate"].nunique().max() < 2:
        return out.reset_index(drop=True)
    ordered = out.sort_values(REPLICATE, kind="stable") if REPLICATE in out else out
    groups = ordered.groupby(["arm", "task"], sort=False)
    first = groups.head(1).set_index(["arm", "task"], drop=False)
    n = groups["replicate"].nunique()
    sd = groups["score"].std(ddof=1)
    several = n > 1
    pooled = first.assign(
        n_runs=n, score=groups["score"].mean(), between_sd=sd.where(several), seed_ci=groups["ci"].mean(),
        ci=[t_quantile(0.975, k - 1) * v / math.sqrt(k) if k >= MIN_SEEDS else math.nan for k, v in zip(n, sd)],
        run=[f"{r} (+{k - 1} replicates)" if k > 1 else r for r, k in zip(first["run"], n)],
        spread=groups["spread"].mean(),
        **{f"{m}_se": _pooled_se(ordered, f"{m}_se") / n for m in ("score", "spread")},
        **{f"{m}_df": groups[f"{m}_df"].min() for m in ("score", "spread")})
    single = ~several.reindex(pooled.index).to_numpy()
    pooled.loc[single, "ci"] = first.loc[single, "ci"]  # an arm pretrained once keeps its fine-tuning interval
    return pooled.reset_index(drop=True)


def _pooled_se(ordered: pd.DataFrame, column: str) -> pd.Series:
    """Per (arm, task), the square root of the sum of the replicates' squared standard errors; NaN where one is
    missing (a replicate with fewer seeds than an interval needs)."""
    groups = ordered.assign(_squared=ordered[column] ** 2).groupby(["arm", "task"], sort=False)["_squared"]
    return np.sqrt(groups.sum().where(groups.count() == groups.size()))
