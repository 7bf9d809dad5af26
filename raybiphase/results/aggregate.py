"""Fine-tuning trials -> the paper's numbers: best LR on validation, mean test score ± 95% CI over seeds.

Pure pandas/numpy (no Ray, no scipy). The protocol (the authors', docs/protocol.md):
for each (source, run, pretrain_step, task)

1. per learning rate, the mean validation score over its seeds;
2. the best LR is the one with the highest such mean among the *complete* LRs, those whose every seed has a score
   (ties: the smaller LR): `choose_best_lr`. A diverged seed scores the metric's floor (the trial records it:
   `raybiphase.finetune.baselines.FLOORS`: what a model that learned nothing scores, the majority class for
   accuracy, no entity for entity F1, no answer for QA F1, a random ranking's NDCG@10 for retrieval) and counts
   against its LR like any other seed, as in the authors' harness, where a collapsed run still scores; an LR is
   never chosen on the seeds that happened to survive;
3. the reported score is the mean test score over all the seeds at that LR, with a 95% confidence interval from the
   t distribution with n-1 degrees of freedom: mean ± t(0.975, n-1) * std(ddof=1) / sqrt(n), its ends clipped to
   the metric's range [0, 1] (`clipped`: a symmetric interval can pass 100% where no score can);
4. the LR sensitivity (the paper's finding 2) is the spread of the mean test score across the complete LRs
   (diverged seeds included, at their floor): max - min and the standard deviation (ddof=0: the LR grid is the
   whole population, not a sample). An LR that ASHA cut short has only its best seeds left, which would
   understate the spread, so it is left out (`n_lrs_complete` says how many LRs it rests on; with fewer than two
   it is NaN). `finetune.complete_lrs` makes the fan-out finish every stopped trial, so every cell is complete.

Trials stopped by ASHA carry NaN test scores and make their LR incomplete; their early validation scores never
enter a mean. The fan-out's completion pass asks `choose_best_lr(..., complete_only=False)` which LR leads on the
seeds that finished, and finishes that LR's stopped seeds until the leader is complete: then the leader is the
best complete LR. `n_seeds` counts the seeds at the best LR, `n_diverged` the diverged trials of the group (and
`n_diverged_best` those at the best LR). Scores stay in the metric's own units (fractions in [0, 1] for accuracy,
F1 and NDCG@10). Rows made before diverged trials scored their floor (NaN scores, `diverged` true) leave their LR
incomplete. `bootstrap_ci` gives a percentile interval from per-example test scores (paired across seeds), seeded.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from raybiphase.errors import UserError

GROUP = ("source", "run", "pretrain_step", "task")
SUMMARY_KEY = GROUP
PER_TRIAL = frozenset(
    {"lr", "seed", "val_score", "test_score", "steps", "stopped_early", "seconds", "test_per_example", "diverged"}
)
"""Columns that vary from trial to trial; every other column constant within a group is carried into the summary."""


def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with `df` degrees of freedom (df may be fractional, as Welch-Satterthwaite's is).

    0.5 plus the integral of the density from 0 (Simpson's rule, 4,000 intervals): accurate to about 1e-9 for
    |x| up to a few hundred, which is all a test or an interval needs, without scipy."""
    if df <= 0:
        raise ValueError(f"t_cdf needs df > 0, got {df}")
    if x < 0:
        return 1.0 - t_cdf(-x, df)
    x = min(x, 1000.0)  # beyond it the tail is below any test's level; the cap keeps Simpson's steps fine
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    grid = np.linspace(0.0, x, 4001)
    density = np.exp(log_norm - (df + 1) / 2 * np.log1p(grid**2 / df))
    weights = np.ones_like(grid)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return min(1.0, 0.5 + float(weights @ density) * (x / 4000) / 3)


@functools.lru_cache(maxsize=1024)
def t_quantile(prob: float, df: float) -> float:
    """Quantile of Student's t with `df` degrees of freedom, e.g. t_quantile(0.975, 4) = 2.7764: `t_cdf` inverted
    by bisection."""
    if not 0.0 < prob < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < prob < 1 and df > 0, got prob={prob}, df={df}")
    if prob < 0.5:
        return -t_quantile(1.0 - prob, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < prob:
        high *= 2.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < prob else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class MeanCI:
    """A mean over seeds with the half-width of its confidence interval (NaN with fewer than 2 values)."""

    mean: float
    half_width: float
    std: float
    n: int


SCORE_RANGE = (0.0, 1.0)
"""What every task metric can reach (accuracy, F1, entity F1, NDCG@10 as fractions): intervals are clipped to it."""


def clipped(mean: float, half_width: float, bounds: tuple[float, float] = SCORE_RANGE) -> tuple[float, float]:
    """The interval mean ± half_width clipped to `bounds` (NaN, NaN without a half-width).

    A t-interval is symmetric and knows nothing of the metric's range: three seeds at 100, 100 and 70 give
    90 ± 43, a bar up to 133. Clipping keeps the t-interval the paper reports wherever it lies inside the range
    and only cuts what no score can reach; a range-respecting interval (on a logit scale, say) would move every
    interval, the paper's own included."""
    if not math.isfinite(half_width):
        return math.nan, math.nan
    return max(bounds[0], mean - half_width), min(bounds[1], mean + half_width)


def mean_ci(values: Sequence[float] | np.ndarray | pd.Series, confidence: float = 0.95) -> MeanCI:
    """Mean ± t((1+confidence)/2, n-1) * std / sqrt(n) of the finite values."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return MeanCI(math.nan, math.nan, math.nan, 0)
    if n == 1:
        return MeanCI(float(x[0]), math.nan, math.nan, 1)
    std = float(x.std(ddof=1))
    return MeanCI(float(x.mean()), t_quantile((1 + confidence) / 2, n - 1) * std / math.sqrt(n), std, n)


def _prepare(trials: pd.DataFrame) -> pd.DataFrame:
    trials = trials.copy()
    if "source" not in trials:
        trials["source"] = "raybiphase"
    trials["source"] = trials["source"].fillna("raybiphase")
    missing = [c for c in (*GROUP, "lr", "val_score", "test_score") if c not in trials]
    if missing:
        raise UserError(f"fine-tuning rows lack the column(s) {missing}: not a raybiphase finetune table")
    return trials


def _flag(group: pd.DataFrame, column: str) -> pd.Series:
    return group[column].fillna(False).astype(bool) if column in group else pd.Series(False, index=group.index)


def lr_table(trials: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """One row per (source, run, pretrain_step, task, lr): mean validation and mean test ± CI over the seeds with a
    score (diverged ones at their floor), the interval's ends clipped to the metric's range (`clipped`), how many of
    the group's seeds it holds, whether it is `complete` (every seed of the group scored), and how many of its
    trials diverged."""
    trials = _prepare(trials)
    group_seeds = {key: (g["seed"].nunique() if "seed" in g else len(g))
                   for key, g in trials.groupby(list(GROUP), dropna=False, sort=False)}
    rows = []
    for key, group in trials.groupby([*GROUP, "lr"], dropna=False, sort=True):
        test = mean_ci(group["test_score"], confidence)
        val = group["val_score"].astype(float).where(~_flag(group, "stopped_early"))  # early scores never compete
        scored = group["test_score"].astype(float).notna() & val.notna()
        n_group = group_seeds[key[:len(GROUP)]]
        rows.append({
            **dict(zip((*GROUP, "lr"), key)),
            "val_mean": float(val.mean()) if val.notna().any() else math.nan,
            "n_val": int(val.notna().sum()),
            "test_mean": test.mean, "test_ci95": test.half_width,
            **dict(zip(("test_ci_low", "test_ci_high"), clipped(test.mean, test.half_width))),
            "test_std": test.std, "n_seeds": test.n,
            "n_trials": len(group),
            "n_diverged": int(_flag(group, "diverged").sum()),
            "complete": bool(int(scored.sum()) >= n_group),
        })
    return pd.DataFrame(rows, columns=[*GROUP, "lr", "val_mean", "n_val", "test_mean", "test_ci95", "test_ci_low",
                                       "test_ci_high", "test_std", "n_seeds", "n_trials", "n_diverged", "complete"])


def choose_best_lr(lrs: pd.DataFrame, complete_only: bool = True) -> pd.Series | None:
    """The row of `lr_table` (one group) with the best LR: the highest mean validation among the complete LRs (every
    seed scored), ties to the smaller LR; None when no LR is complete. `complete_only=False` ranks the LRs on the
    seeds they have (ties to more seeds): the leader the fan-out's completion pass finishes first."""
    if lrs["val_mean"].isna().all():  # a baseline (BM25, majority class): a test score, no validation
        eligible = lrs[lrs["test_mean"].notna()]
        return eligible.iloc[0] if len(eligible) else None
    eligible = lrs[lrs["val_mean"].notna() & (lrs["complete"] if complete_only else lrs["val_mean"].notna())]
    if not len(eligible):
        return None
    return eligible.sort_values(["val_mean", "n_val", "lr"], ascending=[False, False, True]).iloc[0]


def best_lr(trials: pd.DataFrame | Sequence[dict], complete_only: bool = True) -> float | None:
    """The best LR of one group's trials (rows as a frame or as records): `choose_best_lr` over their lr_table."""
    trials = pd.DataFrame(list(trials)) if not isinstance(trials, pd.DataFrame) else trials
    best = choose_best_lr(lr_table(trials), complete_only) if len(trials) else None
    return None if best is None else float(best["lr"])


def _constant_columns(trials: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per group, the columns with one value (nulls aside): run config, family, dataset, metric, phases.clm_share..."""
    candidates = [c for c in trials.columns if c not in PER_TRIAL and c not in GROUP
                  and not trials[c].map(lambda v: isinstance(v, (list, dict, np.ndarray))).any()]
    grouped = trials.groupby(list(GROUP), dropna=False, sort=True)[candidates]
    return grouped.first(), grouped.nunique() == 1


def bootstrap_ci(
    per_example: Sequence[Sequence], confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0,
    metric: str = "mean",
) -> tuple[float, float]:
    """Percentile interval of the mean over seeds of the test score, resampling test examples.

    `per_example` holds one list per seed, all over the same test examples in the same order; every resample draws
    examples (the same draw for every seed), so the interval reflects test-set sampling. For `metric="entity_f1"`
    an entry is a sentence's [true positives, predicted, gold] entity counts and each resample recomputes corpus
    micro-F1 from the drawn sentences (a mean of per-sentence F1 is not micro-F1); otherwise entries are scores and
    a resample's score is their mean. Seeded: equal inputs give equal intervals.
    """
    rng = np.random.default_rng(seed)
    if metric == "entity_f1":
        counts = np.asarray([np.asarray(s, dtype=float).reshape(-1, 3) for s in per_example])  # (seeds, N, 3)
        if counts.ndim != 3 or counts.shape[1] == 0:
            raise ValueError("bootstrap_ci needs one non-empty list of [tp, pred, gold] per seed, all of one length")
        draws = rng.integers(0, counts.shape[1], size=(n_resamples, counts.shape[1]))
        totals = np.stack([c[draws].sum(axis=1) for c in counts])  # (seeds, resamples, 3)
        denominator = totals[..., 1] + totals[..., 2]
        f1 = np.divide(2 * totals[..., 0], denominator, out=np.zeros_like(denominator), where=totals[..., 0] > 0)
        stats = f1.mean(axis=0)
    else:
        scores = np.asarray([np.asarray(s, dtype=float) for s in per_example])
        if scores.ndim != 2 or scores.shape[1] == 0:
            raise ValueError("bootstrap_ci needs one non-empty score list per seed, all of the same length")
        per_item = scores.mean(axis=0)
        draws = rng.integers(0, len(per_item), size=(n_resamples, len(per_item)))
        stats = per_item[draws].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(stats, [tail, 100 - tail])
    return float(low), float(high)


SUMMARY_COLUMNS = (
    ("source", "Where the trials come from: raybiphase, paper (the authors' imported rows), baseline or hub (a public "
               "encoder on our protocol)."),
    ("run", "The pretraining run (or baseline) the checkpoint belongs to."),
    ("pretrain_step", "The checkpoint's pretraining step."),
    ("task", "The fine-tuning task."),
    ("best_lr", "The LR with the best mean validation score among the complete LRs (every seed scored), ties to the "
                "smaller LR."),
    ("best_val_mean", "The mean validation score at best_lr."),
    ("test_mean", "The mean test score at best_lr over its seeds (diverged ones at the metric's floor)."),
    ("test_ci95", "Half-width of the t-based confidence interval of test_mean (NaN for one seed)."),
    ("test_ci_low", "test_mean - test_ci95, clipped to the metric's range [0, 1]: what reports draw."),
    ("test_ci_high", "test_mean + test_ci95, clipped to [0, 1]."),
    ("test_std", "Standard deviation of the test score over the seeds at best_lr."),
    ("n_seeds", "Seeds with a test score at best_lr."),
    ("n_lrs", "Learning rates tried."),
    ("n_lrs_complete", "Learning rates with every seed scored."),
    ("lr_spread", "Max - min of the mean test score across the complete LRs (NaN below two)."),
    ("lr_std", "Standard deviation of the mean test score across the complete LRs (NaN below two)."),
    ("lr_spread_se", "Standard error of lr_spread from the seeds of the two LRs that make it (the best- and the "
                     "worst-scoring complete LR), which LRs those are taken as given (NaN below two LRs or seeds)."),
    ("n_trials", "Trials in the group."),
    ("n_stopped", "Trials ASHA stopped early."),
    ("n_diverged", "Trials whose loss turned NaN or inf, scored at the metric's floor (per LR in lr_table)."),
    ("n_diverged_best", "Diverged trials at best_lr."),
)
"""summarize's own columns in order, each with what it holds; every column constant within a group (the dotted
settings, family, dataset, metric, phases.clm_share) follows them."""

BOOTSTRAP_COLUMNS = (
    ("test_boot_low", "Low end of the bootstrap interval over every seed's per-example scores at best_lr "
                      "(summarize(bootstrap=True), when every seed has them)."),
    ("test_boot_high", "High end of that bootstrap interval."),
)
"""The columns summarize(bootstrap=True) adds after SUMMARY_COLUMNS where per-example scores allow."""


def summarize(trials: pd.DataFrame, confidence: float = 0.95, bootstrap: bool = False) -> pd.DataFrame:
    """One row per (source, run, pretrain_step, task): the best LR and its mean test score ± CI, LR spread.

    Columns: SUMMARY_COLUMNS (each described there), then every column constant within the group (config, family,
    dataset, metric, phases.clm_share). With `bootstrap=True` and per-example scores present, BOOTSTRAP_COLUMNS too,
    over every seed at the best LR (a diverged one through its floor's per-example entries); when a seed has none
    (rows recorded before diverged trials kept them), the interval is left out rather than drawn over the seeds that
    have.
    """
    if trials is None or len(trials) == 0:
        return pd.DataFrame(columns=[*GROUP, "best_lr", "test_mean", "test_ci95", "test_ci_low", "test_ci_high",
                                     "n_seeds"])
    trials = _prepare(trials)
    per_lr = dict(iter(lr_table(trials, confidence).groupby(list(GROUP), dropna=False, sort=True)))
    first, is_constant = _constant_columns(trials)
    rows = []
    for key, group in trials.groupby(list(GROUP), dropna=False, sort=True):
        lrs = per_lr[key]
        complete = lrs.loc[lrs["complete"], "test_mean"].dropna()  # every seed scored, diverged ones at the floor
        spread = len(complete) >= 2
        ends = lrs.loc[[complete.idxmax(), complete.idxmin()]] if spread else lrs.iloc[:0]
        spread_se = math.sqrt(float((ends["test_std"] ** 2 / ends["n_seeds"]).sum())) if spread else math.nan
        row = {**dict(zip(GROUP, key)), "best_lr": math.nan, "best_val_mean": math.nan, "test_mean": math.nan,
               "test_ci95": math.nan, "test_ci_low": math.nan, "test_ci_high": math.nan, "test_std": math.nan,
               "n_seeds": 0, "n_lrs": int(lrs["lr"].nunique()),
               "n_lrs_complete": len(complete),
               "lr_spread": float(complete.max() - complete.min()) if spread else math.nan,
               "lr_std": float(complete.std(ddof=0)) if spread else math.nan,
               "lr_spread_se": spread_se,
               "n_trials": len(group), "n_stopped": int(_flag(group, "stopped_early").sum()),
               "n_diverged": int(lrs["n_diverged"].sum()), "n_diverged_best": 0}
        best = choose_best_lr(lrs)
        if best is not None:
            row.update(best_lr=float(best["lr"]), best_val_mean=float(best["val_mean"]),
                       test_mean=float(best["test_mean"]), test_ci95=float(best["test_ci95"]),
                       test_ci_low=float(best["test_ci_low"]), test_ci_high=float(best["test_ci_high"]),
                       test_std=float(best["test_std"]), n_seeds=int(best["n_seeds"]),
                       n_diverged_best=int(best["n_diverged"]))
            if bootstrap and "test_per_example" in group:
                at_best = group[(group["lr"] == best["lr"]) & group["test_score"].notna()]
                lists = [[] if s is None else s for s in at_best["test_per_example"]]
                if lists and all(len(s) for s in lists) and len({len(s) for s in lists}) == 1:  # every seed, or none
                    metric = group["metric"].iloc[0] if "metric" in group else "mean"
                    row["test_boot_low"], row["test_boot_high"] = bootstrap_ci(lists, confidence, metric=metric)
        row.update(first.loc[key][is_constant.loc[key]].to_dict())
        rows.append(row)
    return pd.DataFrame(rows)
