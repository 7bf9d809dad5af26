"""The report's section on pretraining replicates: arms pretrained more than once (`train.seed`: another init and
data order, nothing else) with the spread between their pretraining runs beside the fine-tuning interval.

A fine-tuning interval says how much a score moves with the fine-tuning seed on one set of weights; it says nothing
of how much it moves when the same recipe is pretrained again. Where a sweep has replicates, the findings count the
spread between runs in every arm's interval (raybiphase.results.stats.noise.replicate_noise) and this table shows
both, per arm (raybiphase.results.stats.matching.pool_replicates). What replicates cost before they run is the
dry run's (raybiphase.planning.replicate_cost).
"""

from __future__ import annotations

import pandas as pd

from raybiphase.naming import strip_hash
from raybiphase.results.stats.control import UNTRAINED
from raybiphase.results.stats.matching import pool_replicates
from raybiphase.results.tables import Section, markdown, mean_ci


def replicates_section(s: pd.DataFrame) -> Section | None:
    """Per arm with replicates and task, at the final checkpoint: the replicates' mean with the between-run 95%
    interval, their standard deviation, and the mean fine-tuning interval; None without replicates."""
    ours = s[(s["source"] == "raybiphase") & s["final"] & (s["objective"] != UNTRAINED)]
    pooled = pool_replicates(ours)
    arms = pooled[pooled["n_runs"] > 1]
    if arms.empty:
        return None
    table = pd.DataFrame({
        "arm": [strip_hash(r.split(" (+")[0]) for r in arms["run"]], "size": arms["size"], "task": arms["task"],
        "runs": arms["n_runs"].astype(int),
        "test (%), between runs": [mean_ci(m, c, n) for m, c, n in zip(arms["score"], arms["ci"], arms["n_runs"])],
        "between-run SD (pts)": arms["between_sd"].round(2),
        "fine-tuning 95% CI (pts, mean)": arms["seed_ci"].round(2)})
    note = ("Arms pretrained more than once (`train.seed`: another init and data order). The interval is Student's t "
            "over the replicates' scores (each a mean over fine-tuning seeds, so it holds both kinds of noise) and "
            "the SD is this arm's alone. The findings pool the replicated arms' spread and widen every arm by it "
            "(docs/statistics.md). A between-run SD above the fine-tuning interval means one pretraining run per "
            "arm cannot tell such a gap from pretraining noise.")
    return Section("replicates", "Pretraining replicates: the spread between runs", None, note, markdown(table))
