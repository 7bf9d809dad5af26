"""A larger model size's scores predicted from the smaller sizes' rows, each with a 95% prediction interval, and
the chance each of the paper's findings holds there (docs/statistics.md, "Predicting a larger size").

    python -m raybiphase predict RESULTS_DIR --size 1b [--json]

Pure numpy and pandas. Per source (ours, the paper's) and task, one least-squares fit over every arm's cells at
the smaller sizes: score = the arm's intercept + the task's slope x ln(non-embedding parameters). The slope is
shared by the arms of a task (an arm seen at one size borrows it from those seen at several), the intercepts are
the arm offsets; a task where no arm was seen at two sizes has no slope and is not predicted. An arm is a
pretraining recipe whatever its size (`size_free_arm`): two sizes of `clm-10k-mlm40-42k` are one arm.

A prediction interval covers the score one run of the arm at the new size will show, and adds up:

- the fit's own uncertainty, L Σ L': each prediction is a linear map L of the observed cells, whose covariance Σ
  holds the fine-tuning seeds' variance of each cell and, where some arm was pretrained several times, the
  replicates' pretraining noise (`raybiphase.results.stats.noise.replicate_noise`: the larger of the two, as the
  findings take it, and the replicates' correlation across the tasks one run is scored on);
- model error: the residual variance the fit leaves beyond what Σ explains, pooled over the source's tasks (zero
  where the residuals show none). With three sizes or more it holds a curve the line misses; with two it can only
  hold arms leaving the shared slope (it has degrees of freedom where several arms were seen at both sizes).
  Without replicates it also takes up the pretraining noise the seeds cannot see;
- curvature: with three sizes or more, the squared gap between the line's prediction and a curved fit's (a
  shared x^2 term); with two, an SD of TWO_SIZES x the change predicted from the arm's largest size; widened by the
  number of ladder steps where the prediction reaches farther than REACH;
- the new run's own noise: the replicates' per-run variance, or the task's fine-tuning seed variance.

The quantile is Student's t with Satterthwaite's degrees of freedom over the parts estimated with few: the model
error (the residual degrees of freedom) and the replicates' noise (theirs); the seeds' variance is taken as known,
and with neither estimate the quantile is the normal one. A finding's chance is the probability, under the
predictive distribution of its true effect at the size (fit and model error, not the new run's noise), that the
effect is in the paper's direction: a forecast of where the effect lies, not of the verdict one sweep would reach.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from raybiphase.config.sizes import SIZES
from raybiphase.errors import UserError
from raybiphase.naming import strip_hash
from raybiphase.results.aggregate import t_cdf, t_quantile
from raybiphase.results.rows import BASELINE
from raybiphase.results.stats.control import UNTRAINED
from raybiphase.results.stats.findings import one_size_contrasts
from raybiphase.results.stats.matching import arm_ids, pool, with_noise_columns
from raybiphase.results.stats.noise import Noise, replicate_noise
from raybiphase.results.stats.rules import plural
from raybiphase.results.tables import POINTS

SIZE_COLUMNS = ("size", "model.size", "init_from", "model.init_from")
"""Columns that name a model size (a continued run's start is a path with its size in it): an arm across sizes
is its arm without them, the run name (its size dropped) telling a continued run's start instead."""
TWO_SIZES = 0.5
"""With two sizes a line cannot show a curve: its model error counts at least this share of the change it
extrapolates from an arm's largest size (an SD of half the predicted gain). With three sizes or more it counts
the difference between the line's prediction and a curve's (a shared x^2 term) instead."""
REACH = 1.0
"""How far a prediction reaches before it is widened, in ladder steps: ln(parameters) past the largest fitted
size, over the widest gap between two consecutive fitted sizes. Beyond it, the curvature part of the model error
(its SD) is multiplied by the number of steps: a curve's misfit grows with the distance, and the data say
nothing of it there."""
Z95 = 1.959963984540054
"""The normal 97.5% quantile: an interval's half-width in standard deviations when no part is estimated."""


def parameters(size: str) -> float:
    """A size's non-embedding parameter count (raybiphase.config.sizes): what the fit's x is the log of, as in
    Kaplan et al.'s scaling laws (the embeddings' share depends on the vocabulary, not the model)."""
    if size not in SIZES:
        raise UserError(f"--size {size}: not a model size of the project; known: {', '.join(SIZES)}")
    return float(SIZES[size].non_embedding_params())


def run_at(run: str, size: str) -> str:
    """An arm's run name at another size in the paper's scheme: `tiny-clm-100-mlm40-420-s1-abc123 (+2 replicates)`
    at 1b -> `1b-clm-100-mlm40-420` (no settings hash, no replicate)."""
    name = re.sub(r"-s\d+$", "", strip_hash(str(run).split(" (+")[0]))
    return f"{size}-{name.partition('-')[2]}"


def size_free_arm(cells: pd.DataFrame) -> pd.Series:
    """Each row's arm across sizes: its run name without the size, hash and replicate, and every weight-shaping
    setting but the size (`SIZE_COLUMNS`)."""
    return cells["run"].map(lambda r: run_at(r, "")) + "\x1e" + arm_ids(cells, without=SIZE_COLUMNS)


@dataclass(frozen=True)
class Forecast:
    """Predicted cells at one size (`cells`: source, arm, run, task, family, predicted, low, high, sd, df, sizes
    and the columns of the arm's row at its largest smaller size) and the covariance of their predictions in points,
    in three parts: `fit` (L Σ L'), `model` (the model error's) and `future` (a new run's own noise)."""

    size: str
    based_on: tuple[str, ...]
    """The smaller sizes whose rows it rests on, smallest first."""
    cells: pd.DataFrame
    fit: np.ndarray
    model: np.ndarray
    future: np.ndarray
    regime: str
    """One sentence on what the intervals count."""

    def chances(self) -> list[tuple[str, float, int]]:
        """(claim, the probability its effect at this size is in the paper's direction, cells it rests on) for each
        finding the predicted cells can compare (`raybiphase.results.stats.findings.one_size_contrasts`), over the paper's
        settings only (runs with knobs beyond the paper are left out, as the findings leave them)."""
        return [(claim, chance, len(runs)) for claim, chance, runs in self.served()]

    def served(self, contrasts: list[tuple[str, np.ndarray]] | None = None) -> list[tuple[str, float, list[str]]]:
        """`chances` with, in place of the count, the predicted cells' runs (names at this size) each finding's
        contrast rests on, one entry per cell: the arms that serve it. `contrasts`: `self.contrasts()` when
        already known (they depend on the cells' arms and tasks, not on the scores)."""
        out = []
        for claim, c in self.contrasts() if contrasts is None else contrasts:
            used = self.cells[c != 0]
            parts = [(float(c @ self.fit @ c), used["noise_df"].min()), (float(c @ self.model @ c),
                                                                         used["model_df"].min())]
            mean = float(c @ self.cells["mean"].to_numpy())
            out.append((claim, _above_zero(mean, sum(v for v, _ in parts), satterthwaite(parts)),
                        list(used["run"])))
        return out

    def contrasts(self) -> list[tuple[str, np.ndarray]]:
        """Each finding the predicted cells can compare, as its weights over `cells` (paper's settings only)."""
        cells = self.cells[self.cells["knobs"] == ""] if "knobs" in self.cells else self.cells
        position = {(a, t): i for i, (a, t) in enumerate(zip(self.cells["arm"], self.cells["task"]))}
        out = []
        for claim, contrast in one_size_contrasts(cells.assign(score=cells["predicted"], final=True)):
            c = np.zeros(len(self.cells))
            for cell, weight in contrast.items():
                c[position[cell]] += weight
            out.append((claim, c))
        return out

    def restricted(self, runs: set[str]) -> Forecast:
        """The forecast of the cells whose run (its name at this size) is in `runs` only: what a plan that has those
        arms at this size would compare."""
        keep = self.cells["run"].isin(runs).to_numpy()
        pick = np.ix_(keep, keep)
        return Forecast(self.size, self.based_on, self.cells[keep].reset_index(drop=True), self.fit[pick],
                        self.model[pick], self.future[pick], self.regime)

    def records(self) -> list[dict]:
        """One dict per predicted cell: `run` (the arm's name at the size), `task`, `predicted`, `low`, `high` on the
        summary's scale (fractions, as test_mean; None where there is no interval)."""
        def scale(value: float) -> float | None:
            return round(float(value) / 100, 6) if math.isfinite(value) else None

        return [{"run": run, "task": task, "predicted": scale(m), "low": scale(lo), "high": scale(hi)}
                for run, task, m, lo, hi in zip(self.cells["run"], self.cells["task"], self.cells["predicted"],
                                                self.cells["low"], self.cells["high"])]

    def table(self) -> pd.DataFrame:
        """The predicted cells as the report shows them, in points: run, task, predicted [low, high], and the
        sizes the arm was seen at."""
        interval = [f"{m:.2f} [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else f"{m:.2f} (no interval)"
                    for m, lo, hi in zip(self.cells["predicted"], self.cells["low"], self.cells["high"])]
        table = pd.DataFrame({"run": self.cells["run"], "task": self.cells["task"],
                              f"predicted at {self.size} (%), 95% interval": interval,
                              "sizes seen": self.cells["sizes"]})
        return table.sort_values(["run", "task"], kind="stable").reset_index(drop=True)

    def chances_table(self) -> pd.DataFrame:
        return pd.DataFrame([(claim, f"{p:.0%}" if math.isfinite(p) else "no interval", n)
                             for claim, p, n in self.chances()],
                            columns=["finding", f"P(effect at {self.size} in the paper's direction)", "cells"])


def satterthwaite(parts: list[tuple[float, float]]) -> float:
    """Satterthwaite's degrees of freedom of a sum of variances, each (variance, the degrees of freedom of its
    estimate; inf: taken as known)."""
    total = sum(v for v, _ in parts)
    spread = sum(v**2 / df for v, df in parts if v > 0 and math.isfinite(df))
    return total**2 / spread if spread > 0 else math.inf


def _quantile(df: float) -> float:
    """t's 97.5% quantile at `df` rounded down to two significant digits (a shade wider; the cached quantiles are
    reused), normal beyond 1,000 degrees of freedom (or none known: the interval itself is then NaN)."""
    if not df <= 1000:
        return Z95
    scale = 10.0 ** (1 - math.floor(math.log10(df)))
    return t_quantile(0.975, math.floor(df * scale) / scale)


def _above_zero(mean: float, variance: float, df: float) -> float:
    """P(effect > 0) for an effect of this mean and variance (t at `df`, normal at inf); NaN without a variance."""
    if not math.isfinite(variance):
        return math.nan
    if variance <= 0:
        return 1.0 if mean > 0 else 0.0 if mean < 0 else 0.5
    z = mean / math.sqrt(variance)
    return 0.5 * (1 + math.erf(z / math.sqrt(2))) if not math.isfinite(df) else t_cdf(z, df)


def sized_rows(s: pd.DataFrame) -> pd.DataFrame:
    """The enriched summary's final checkpoints of a size the project defines (baselines have none)."""
    return s[s["final"] & (s["source"] != BASELINE) & s["size"].isin(list(SIZES))]


def observations(s: pd.DataFrame, size: str, *, at: bool = False) -> tuple[pd.DataFrame, Noise | None]:
    """From the report's enriched summary (raybiphase.results.report.enriched_summary): the final checkpoints of
    every size smaller than `size` (of `size` itself with `at`), pooled over replicates (one row per arm, size and
    task, with `arm` the arm across sizes, `x` = ln parameters and `target` the run name at `size`), and the
    replicates' noise."""
    final = sized_rows(s)
    sizes = final["size"].map(parameters)
    final = final[sizes == parameters(size) if at else sizes < parameters(size)]
    runs = with_noise_columns(final)
    noise = replicate_noise(runs[runs["objective"] != UNTRAINED], "score")
    cells = pool(runs)
    cells = cells.assign(arm=size_free_arm(cells), x=np.log(cells["size"].map(parameters).astype(float)),
                         target=cells["run"].map(lambda r: run_at(r, size)))
    return cells, noise


def predict(s: pd.DataFrame, size: str) -> Forecast:
    """Every arm's score at `size` on every task, from the smaller sizes' rows of the enriched summary; a
    UserError for an unknown size or fewer than two smaller sizes."""
    cells, noise = observations(s, size)
    sizes = sorted(cells["size"].unique(), key=parameters)
    if len(sizes) < 2:
        raise UserError(f"--size {size}: the results hold {len(sizes)} size(s) smaller than {size} "
                        f"({', '.join(sizes) or 'none'}); a prediction needs two")
    return forecast(cells, size, noise)


def reach(x: list[float], x_target: float) -> float:
    """The extrapolation's length in ladder steps (`REACH`) from the fitted sizes' ln parameters `x`."""
    x = sorted(set(x))
    step = max(b - a for a, b in zip(x, x[1:]))
    return max(0.0, x_target - x[-1]) / step


def forecast(cells: pd.DataFrame, size: str, noise: Noise | None) -> Forecast:
    """`predict` from the pooled observations (columns source, arm, task, x, score in points, score_se, n_runs,
    target, and the rest carried): each source fitted on its own."""
    fits = [_fit_source(group, math.log(parameters(size)), noise)
            for _, group in cells.groupby("source", sort=True)]
    fits = [f for f in fits if f is not None]
    if not fits:
        raise UserError(f"--size {size}: no source's rows hold two sizes of one arm on one task: no slope to fit")
    predicted = pd.concat([f[0] for f in fits], ignore_index=True)
    fit, model, future = (_block_diagonal([f[i] for f in fits]) for i in (1, 2, 3))
    variance = np.diag(fit) + np.diag(model) + np.diag(future)
    noisy = np.diag(fit) + np.diag(future)  # the replicates' estimate where they cover the task, else the seeds'
    df = [satterthwaite([(n, nd), (m, md)]) for n, nd, m, md in
          zip(noisy, predicted["noise_df"], np.diag(model), predicted["model_df"])]
    half = np.array([_quantile(d) for d in df]) * np.sqrt(variance)
    mean = predicted["mean"].to_numpy()
    predicted = predicted.assign(size=size, **{"model.size": size}, predicted=mean.clip(*POINTS),
                                 low=(mean - half).clip(*POINTS), high=(mean + half).clip(*POINTS),
                                 sd=np.sqrt(variance), df=df)
    based_on = tuple(sorted(cells["size"].unique(), key=parameters))
    steps = reach(list(cells["x"]), math.log(parameters(size)))
    return Forecast(size, based_on, predicted, fit, model, future, _regime(noise, predicted, len(based_on), steps))


def _regime(noise: Noise | None, predicted: pd.DataFrame, sizes: int, steps: float = 0.0) -> str:
    """One sentence on what the intervals count."""
    parts = ["the replicates' pretraining noise" if noise is not None else
             "pretraining noise only as far as the residuals show it (no arm was pretrained twice)"]
    measured = predicted["model_df"][predicted["model_df"].map(math.isfinite)]
    if measured.empty:
        parts.append("no model error (no residual degrees of freedom)")
    else:
        parts.append(f"model error from the residuals ({plural(int(measured.min()), 'degree')} of freedom"
                     + ("; with two sizes they show arms leaving the shared slope, not a curve)" if sizes < 3 else ")"))
    parts.append("the curve a line may miss: " + (
        "the gap between the line's prediction and a curved fit's" if sizes >= 3 else
        f"with two sizes none can be seen, so an SD of {TWO_SIZES:g} x the change predicted from each arm's "
        "largest size"))
    far = (f" The prediction is {steps:.1f} ladder steps beyond the largest size (the widest gap between the "
           f"sizes fitted): that part is widened {steps / REACH:.1f}x, and the interval is a rough guide only."
           if steps > REACH + 1e-9 else "")
    return "The intervals count fine-tuning seeds, the fit's own uncertainty, " + ", ".join(parts) + "." + far


def _block_diagonal(blocks: list[np.ndarray]) -> np.ndarray:
    out = np.zeros((sum(len(b) for b in blocks),) * 2)
    start = 0
    for block in blocks:
        out[start:start + len(block), start:start + len(block)] = block
        start += len(block)
    return out


def _noise(obs: pd.DataFrame, noise: Noise | None) -> tuple[np.ndarray, pd.Series]:
    """(Σ: the covariance of the observed cells' scores from seeds and replicates, each task's variance of one new
    run). A cell's variance is the larger of the replicates' per-run variance over its runs and its seeds' squared
    standard error (a missing one: its task's mean); cells of one run set (arm and size) on two tasks covary by
    the replicates' covariance. NaN where a task has neither."""
    seeds = obs["score_se"].astype(float) ** 2
    seeds = seeds.fillna(seeds.groupby(obs["task"]).transform("mean"))
    per_run = (seeds * obs["n_runs"]).groupby(obs["task"]).mean()
    sigma = np.diag(seeds.to_numpy())
    if noise is None:
        return sigma, per_run
    tasks, runs = obs["task"].to_numpy(), obs["n_runs"].to_numpy(dtype=float)
    c = noise.covariance.reindex(index=tasks, columns=tasks).fillna(0.0).to_numpy()
    run_set = obs.groupby(["arm", "x"], sort=False).ngroup().to_numpy()
    sigma = np.where(run_set[:, None] == run_set[None, :], c, 0.0) / runs[:, None]
    covered = obs["task"].isin(noise.covariance.index).to_numpy()
    np.fill_diagonal(sigma, np.where(covered, np.fmax(sigma.diagonal(), seeds.to_numpy()), seeds.to_numpy()))
    measured = pd.Series(np.diag(noise.covariance.to_numpy()), index=noise.covariance.index)
    return sigma, per_run.combine(measured.reindex(per_run.index), np.fmax)


def _fit_source(obs: pd.DataFrame, x_target: float, noise: Noise | None):
    """One source's fits, task by task: (predicted cells, L Σ L', model-error covariance, a new run's noise), or
    None when no task has a slope."""
    obs = obs[obs["score"].notna()].reset_index(drop=True)
    sigma, per_run = _noise(obs, noise)
    largest = obs.sort_values("x", kind="stable").groupby(["arm", "task"]).tail(1)  # the row an arm's cell carries
    largest = dict(zip(zip(largest["arm"], largest["task"]), largest.index))
    maps, rows, excess, residual_df, bends = [], [], 0.0, 0, []
    widen = max(1.0, reach(list(obs["x"]), x_target) / REACH) ** 2
    for task, group in obs.groupby("task", sort=True):
        idx = group.index.to_numpy()
        arms = sorted(group["arm"].unique())
        design = np.zeros((len(idx), len(arms) + 1))
        design[np.arange(len(idx)), [arms.index(a) for a in group["arm"]]] = 1.0
        design[:, -1] = group["x"]
        if np.linalg.matrix_rank(design) < design.shape[1]:
            continue  # no arm seen at two sizes: no slope for this task
        solve = np.linalg.solve(design.T @ design, design.T)
        residual = np.eye(len(idx)) - design @ solve
        r = residual @ group["score"].to_numpy(dtype=float)
        if np.isfinite(sigma[np.ix_(idx, idx)]).all():
            excess += float(r @ r - np.trace(residual @ sigma[np.ix_(idx, idx)]))
            residual_df += len(idx) - design.shape[1]
        curved = _curved(design, group, arms, x_target)
        for k, arm in enumerate(arms):
            at = np.zeros(len(arms) + 1)
            at[k], at[-1] = 1.0, x_target
            row = np.zeros(len(obs))
            row[idx] = at @ solve
            maps.append(row)
            rows.append(largest[arm, task])
            line = float(at @ solve @ group["score"].to_numpy(dtype=float))
            last = float(obs.loc[largest[arm, task], "score"])  # the arm's score at its largest size
            bends.append((curved[k] - line) ** 2 if curved is not None else (TWO_SIZES * (line - last)) ** 2)
    if not rows:
        return None
    mapping = np.array(maps)
    model_var = max(0.0, excess / residual_df) if residual_df > 0 else 0.0
    model_df = float(residual_df) if residual_df > 0 else math.inf
    seen = obs.groupby(["arm", "task"])["x"].nunique()
    cells = obs.loc[rows].reset_index(drop=True)
    cells = cells.assign(mean=mapping @ obs["score"].to_numpy(dtype=float), run=cells["target"],
                         sizes=[int(seen[a, t]) for a, t in zip(cells["arm"], cells["task"])], model_df=model_df,
                         noise_df=[float(noise.df.loc[t, t]) if noise is not None and t in noise.df.index
                                   else math.inf for t in cells["task"]])
    fit = mapping @ np.nan_to_num(sigma) @ mapping.T
    unknown = (mapping != 0) @ np.isnan(sigma.diagonal()) > 0  # rests on a task with no seed variance: no interval
    fit[unknown, :], fit[:, unknown] = math.nan, math.nan
    model = model_var * (mapping @ mapping.T + np.eye(len(cells))) + widen * np.diag(bends)
    return cells, fit, model, _future(cells, per_run, noise)


def _curved(design: np.ndarray, group: pd.DataFrame, arms: list[str], x_target: float) -> list[float] | None:
    """Each arm's prediction at x_target from the same fit with a curvature term (x^2, shared by the task's arms),
    where the task has three sizes or more to show one; None otherwise."""
    if group["x"].nunique() < 3:
        return None
    quadratic = np.column_stack([design, group["x"].to_numpy(dtype=float) ** 2])
    if np.linalg.matrix_rank(quadratic) < quadratic.shape[1]:
        return None
    coef = np.linalg.lstsq(quadratic, group["score"].to_numpy(dtype=float), rcond=None)[0]
    return [float(coef[k] + coef[-2] * x_target + coef[-1] * x_target**2) for k in range(len(arms))]


def _future(cells: pd.DataFrame, per_run: pd.Series, noise: Noise | None) -> np.ndarray:
    """A new run's noise at the predicted size: its task's per-run variance; the replicates' covariance between
    the tasks of one arm."""
    tasks = cells["task"].to_numpy()
    out = np.zeros((len(cells), len(cells)))
    if noise is not None:
        c = noise.covariance.reindex(index=tasks, columns=tasks).fillna(0.0).to_numpy()
        arms = cells["arm"].to_numpy()
        out = np.where(arms[:, None] == arms[None, :], c, 0.0)
    np.fill_diagonal(out, per_run.reindex(tasks).to_numpy())
    return out
