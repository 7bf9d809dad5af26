"""The report's first verdict, simulated: does a pretrained model beat its untrained control (a row's "above"),
and do a family's models beat it (the family's "yes" / "partly")?

A study has the quickstart's shape: one task per family, three pretrained models and their control per task, three
fine-tuning seeds a cell, each seed's score normal around the cell's truth (seed SD 1 point), the interval the rows
state computed from them. The rule ("above" when the 95% intervals are apart) is a test at far below 5% per row: with
no true effect, a family claims a model above (or below) its control in at most 2% of studies; its price is power,
stated in docs/statistics.md and held here: a family's "yes" needs about 8 seed SDs of effect at 3 seeds. Seeded:
the same draws every run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raybiphase.results.aggregate import mean_ci
from raybiphase.results.stats.control import UNTRAINED, family_verdicts, versus_control

TASKS = {"squad_shuffle": "SC", "squad_commas": "TC", "squad_sentence": "QA", "squad_retrieval": "IR"}
MODELS = 3
STUDIES = 150
pytestmark = pytest.mark.slow  # 450 simulated studies, about 12 s: outside the unit layer


def _study(rng: np.random.Generator, effect: float, seeds: int = 3, seed_sd: float = 1.0) -> pd.DataFrame:
    """One simulated study's enriched summary rows: each pretrained model `effect` points above its control."""
    rows = []
    for task, family in TASKS.items():
        truth = rng.uniform(20, 80)
        for model in range(MODELS + 1):
            control = model == MODELS
            ft = mean_ci(truth + (0.0 if control else effect) + rng.normal(0, seed_sd, size=seeds))
            rows.append({"source": "raybiphase", "run": "control" if control else f"tiny-model{model}", "task": task,
                         "family": family, "score": ft.mean, "ci": ft.half_width, "n_seeds": seeds, "size": "tiny",
                         "final": True, "objective": UNTRAINED if control else "MLM"})
    return pd.DataFrame(rows)


def _judged(effect: float) -> tuple[pd.DataFrame, list[str]]:
    """Every row's verdict and every family's sentence over STUDIES seeded studies."""
    rng = np.random.default_rng(20261128)
    rows, families = [], []
    for _ in range(STUDIES):
        versus = versus_control(_study(rng, effect))
        rows.append(versus)
        families += family_verdicts(versus).values()
    return pd.concat(rows), families


def test_with_no_true_effect_a_row_or_a_family_claims_a_difference_in_at_most_two_percent() -> None:
    rows, families = _judged(0.0)
    assert len(rows) == STUDIES * len(TASKS) * MODELS and set(rows["verdict"]) <= {"above", "below", "overlap"}
    assert (rows["verdict"] != "overlap").mean() <= 0.02
    assert sum(not f.startswith("no:") for f in families) <= 0.02 * len(families), families


@pytest.mark.parametrize("effect, least", [(4.0, 0.0), (8.0, 0.80)])
def test_a_familys_yes_needs_about_eight_seed_sds_at_three_seeds(effect: float, least: float) -> None:
    """The rule's power, as docs/statistics.md states it: at 4 seed SDs a family rarely says "yes" (every model
    apart), at 8 it says so in at least 80% of studies; a "below" is never claimed for a better model."""
    rows, families = _judged(effect)
    yes = sum(f.startswith("yes") for f in families) / len(families)
    assert yes >= least and (effect >= 8.0 or yes <= 0.35), yes
    assert not (rows["verdict"] == "below").any()


if __name__ == "__main__":  # the figures docs/statistics.md states
    for effect in (0.0, 4.0, 8.0):
        rows, families = _judged(effect)
        print(f"effect {effect:g} seed SDs: {int((rows['verdict'] != 'overlap').sum())} of {len(rows)} rows apart; "
              f"{sum(not f.startswith('no:') for f in families)} of {len(families)} families claim a model above "
              f"or below, {sum(f.startswith('yes') for f in families)} say yes")
