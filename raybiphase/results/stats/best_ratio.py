"""Finding 3's first clause, "no masking ratio is best everywhere", as a test with a stated error rate
(docs/statistics.md, "No ratio is best everywhere").

"Everywhere" is every (model size, task family) of the sweep where two masking ratios or more were run from
scratch as matched MLM arms. For a ratio r, a *loss* is a comparison d(g, r', r): in place g, the mean over g's
tasks of the mean matched difference arm at r' - arm at r (`effects.pair_contrast`, with the findings' noise:
per-stratum replicate covariance and degrees of freedom). The clause says every ratio loses somewhere:

- **held** (no ratio is best everywhere): for *every* ratio r, some loss d(g, r', r) > 0 clears a one-sided
  test at 2.5% / m_r, m_r the number of r's comparisons (Bonferroni, which is Holm's first step: one loss is
  enough). This is an intersection-union test (Berger 1982): the null "some ratio is best everywhere" is the union
  over r of "r is best everywhere", and each is rejected at its own level, so when some ratio is truly at least as
  good as every other everywhere the clause is claimed in at most 2.5% of studies (the two-sided 5% convention of
  the other findings); its p-value is the largest of the ratios' adjusted ones.
- **not held** (some ratio is best everywhere): some ratio r* wins *every* comparison d(g, r*, r'), each at
  2.5% / K one-sided, K the number of ratios compared (Bonferroni over which ratio is best).

The two are exclusive, and the test's p-value (twice the smaller, capped at 1) joins finding 3's Holm family, so
the finding's familywise error stays at 5%. `NoBestRatio` has `Effect`'s face (p_value, estimate's sign, source,
text) for that family.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from raybiphase.results.aggregate import t_cdf
from raybiphase.results.stats.effects import ALPHA, Contrast, Effect, pair_contrast


@dataclass(frozen=True)
class Comparison:
    """d(where, a, b): ratio a minus ratio b in one size and family."""

    a: float
    b: float
    where: str
    effect: Effect | None

    @functools.cached_property
    def p_above(self) -> float:
        """One-sided p of "a beats b here" (1 without an interval)."""
        e = self.effect
        if e is None:
            return 1.0
        if e.se == 0:
            return 0.0 if e.estimate > 0 else 1.0
        return 1.0 - t_cdf(e.estimate / e.se, e.df)

    def flipped(self) -> Comparison:
        e = self.effect
        return Comparison(self.b, self.a, self.where, e and dataclasses.replace(e, estimate=-e.estimate))

    def text(self, level: float, unit: str) -> str:
        head = f"{self.a:.0%} over {self.b:.0%} in {self.where}"
        return f"{head} {self.effect.text(unit, level)}" if self.effect else f"{head}: no interval"


@dataclass(frozen=True)
class NoBestRatio:
    """The clause's test over the comparisons of every ratio with every other in every place."""

    comparisons: tuple[Comparison, ...]
    """Both directions of every pair of ratios in every place."""
    tasks: int

    def _losses(self) -> dict[float, list[Comparison]]:
        out: dict[float, list[Comparison]] = {}
        for c in self.comparisons:
            out.setdefault(c.b, []).append(c)
        return out

    @property
    def ratios(self) -> int:
        return len(self._losses())

    @functools.cached_property
    def held_p(self) -> float:
        """The largest over ratios of m_r x its most significant loss's one-sided p (capped at 1)."""
        return max(min(1.0, len(cs) * min(c.p_above for c in cs)) for cs in self._losses().values())

    @functools.cached_property
    def best(self) -> tuple[float, float]:
        """(the ratio likeliest best everywhere, K x its least significant win's one-sided p, capped at 1)."""
        wins: dict[float, float] = {}
        for c in self.comparisons:
            wins[c.a] = max(wins.get(c.a, 0.0), c.p_above)
        ratio = min(wins, key=lambda r: (wins[r], r))
        return ratio, min(1.0, len(wins) * wins[ratio])

    @property
    def p_value(self) -> float:
        return min(1.0, 2 * min(self.held_p, self.best[1]))

    @property
    def estimate(self) -> float:
        """+1: the data lean to "no ratio is best everywhere"; -1: to one ratio best everywhere."""
        return 1.0 if self.held_p <= self.best[1] else -1.0

    @property
    def source(self) -> str:
        sources = {c.effect.source for c in self.comparisons if c.effect}
        return "replicates" if sources == {"replicates"} else "fine-tuning seeds"

    @property
    def widened(self) -> tuple[str, ...]:
        return tuple(sorted({w for c in self.comparisons if c.effect for w in c.effect.widened}))

    def text(self, unit: str = "pts", level: float = ALPHA) -> str:
        """Each ratio's most significant loss at level / m_r (the interval its part of the decision uses: it
        excludes zero when that loss clears), and, when the data lean the other way, the likeliest best ratio's
        narrowest win at level / K."""
        losses = self._losses()
        parts = [f"{min(cs, key=lambda c: c.p_above).text(level / len(cs), unit)}"
                 for _, cs in sorted(losses.items())]
        text = "each ratio's clearest loss: " + "; ".join(parts)
        if self.estimate < 0:
            ratio, _ = self.best
            wins = [c for c in self.comparisons if c.a == ratio]
            narrowest = max(wins, key=lambda c: c.p_above)
            text += (f"; the likeliest best everywhere, {ratio:.0%}, by its narrowest lead: "
                     f"{narrowest.text(level / len({c.a for c in self.comparisons}), unit)}")
        return text


def no_best_ratio(places: Mapping[str, pd.DataFrame], effect: Callable[[Contrast], Effect | None]
                  ) -> NoBestRatio | None:
    """The clause's test from `places` (a name such as "610m IR" -> its MLM cells from scratch: columns group,
    the arm but the ratio; arm; task; mask_ratio), each comparison's `effect` the findings' estimate of a
    contrast; None when no place has two ratios."""
    comparisons, tasks = [], set()
    for where, cells in places.items():
        arms: dict[float, dict[tuple[str, str], str]] = {}  # ratio -> (group, task) -> arm
        for ratio, group, task, arm in zip(cells["mask_ratio"], cells["group"], cells["task"], cells["arm"]):
            if pd.notna(ratio):
                arms.setdefault(float(ratio), {})[group, task] = arm
        ratios = sorted(arms)
        for i, low in enumerate(ratios):
            for high in ratios[i + 1:]:
                matched = [(task, arm, arms[low][group, task]) for (group, task), arm in arms[high].items()
                           if (group, task) in arms[low]]
                if not matched:
                    continue
                pairs = dict(zip(("task", "arm_a", "arm_b"), map(list, zip(*matched))))
                tasks.update(pairs["task"])
                up = Comparison(high, low, where, effect(pair_contrast(pairs)))
                comparisons += [up, up.flipped()]
    return NoBestRatio(tuple(comparisons), len(tasks)) if comparisons else None
