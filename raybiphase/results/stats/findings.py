"""The paper's five findings judged on a sweep's rows, each an effect per model size with an interval (at its Holm
level) and a calibrated decision (raybiphase.results.stats.effects and raybiphase.results.stats.rules; the
method, its assumptions and its simulation: docs/statistics.md).

Every comparison is between matched arms (raybiphase.results.stats.matching.matched_pairs: the same size, budget,
masking ratio, data and every other weight-shaping setting, only the compared factor differing), an arm pretrained
several times is one side (its replicates pooled), and each size's effect is the mean over tasks of the mean
matched difference, an arm reused by several pairs entering once. A finding holds where its Holm-adjusted test
clears 5% in the paper's direction; "not resolved" is the answer otherwise, and what a sweep cannot judge (one
ratio, no pairs) is said per finding, never given a verdict.

    findings(enriched_summary) -> [(claim, verdict, evidence), ...]   # the report's last section
"""

from __future__ import annotations

import pandas as pd

from raybiphase.config.sizes import SIZES
from raybiphase.config.sweep import UNMEASURED_SD
from raybiphase.naming import steps_label
from raybiphase.results.stats.best_ratio import NoBestRatio, no_best_ratio
from raybiphase.results.stats.control import UNTRAINED
from raybiphase.results.stats.effects import (
    ALPHA,
    Effect,
    difference,
    estimate,
    pair_contrast,
    shared_trials,
    slope_contrast,
)
from raybiphase.results.stats.matching import arm_ids, key_text, matched_pairs, pool, with_noise_columns
from raybiphase.results.stats.noise import Strata, strata_noise
from raybiphase.results.stats.rules import NO_REPLICATES, UNRESOLVED, combine, conjoin, decide, holm_levels, plural

RATIO_STEP = 0.1
"""Masking-ratio slopes are stated per 10 points of masking (20% -> 30%)."""


def _of(frame: pd.DataFrame, *objectives: str) -> pd.DataFrame:
    return frame[frame["objective"].isin(objectives)]


class Study:
    """Our rows of one sweep, pooled over pretraining replicates (`cells`, indexed by arm and task), with the noise
    the replicates measure for each measure (None without replicates: fine-tuning seeds only)."""

    def __init__(self, s: pd.DataFrame, unmeasured_sd: float = UNMEASURED_SD):
        """`unmeasured_sd`: sweep.unmeasured_sd, the SD factor of a stratum no replicated arm measures."""
        self.unmeasured_sd = unmeasured_sd
        ours = s[s["source"] == "raybiphase"]
        ours = ours.assign(size=ours["size"] if "size" in ours else "")
        runs = with_noise_columns(ours)
        pretrained = runs[runs["objective"] != UNTRAINED]  # a control's seeds are not pretraining runs
        self.noise: dict[str, Strata | None] = {m: strata_noise(pretrained, m, unmeasured_sd)
                                                   for m in ("score", "spread")}
        self.cells = pool(runs)
        self.lookup = self.cells.set_index(["arm", "task"]).to_dict("index")
        self.final = self.cells[self.cells["final"] & self.cells["init_from"].isna()]  # from scratch, final steps
        self.groups = shared_trials(self.cells["task"], self.cells["family"])

    def effect(self, contrast: dict, measure: str = "score") -> Effect | None:
        return estimate(contrast, self.lookup, self.noise[measure], measure=measure, groups=self.groups)

    def regime(self) -> str:
        """One sentence on the noise the intervals count."""
        noise = self.noise["score"]
        if noise is None:
            return ("No arm was pretrained more than once: the intervals count fine-tuning seeds only and ignore "
                    "pretraining noise, which at the paper's scale is larger, so no finding is decided on them "
                    "(each says \"not resolved\"); replicate an arm of each size (a `train.seed` grid) to measure "
                    "that noise and get verdicts.")
        measured = "; ".join(f"{size} {objective}: SD {noise.sd((size, objective)):.2f} pts, "
                             f"{plural(one.arms, 'replicated arm')}, "
                             f"{plural(int(one.df.to_numpy().diagonal().min()), 'degree')} of freedom"
                             for (size, objective), one in noise.measured.items())
        return (f"Pretraining noise is measured per model size and objective where an arm of it was replicated "
                f"({measured}) and every arm of that stratum, replicated or not, is widened by it. An arm whose "
                f"size and objective no replicated arm shares is assumed {self.unmeasured_sd:g}x as noisy (SD) as the "
                f"noisiest measured stratum ({' '.join(noise.noisiest).strip()}; the factor is sweep.unmeasured_sd, "
                "`raybiphase report --unmeasured-sd` overrides it), never as quiet as another size; its tests say "
                "\"widened\". Replicate an arm of each size and objective to measure them.")


Part = tuple[str, Effect | NoBestRatio | None, str]
"""One test of a finding: (who: the size, say; the effect, or a test with its face; what it rests on: "3 pairs")."""


def _size_text(who: str, effect: Effect | NoBestRatio | None, decision: str, rests_on: str, unit: str = "pts",
               level: float = ALPHA) -> str:
    """One test's line: its effect with the interval at `level` (its Holm level: `rules.holm_levels`)."""
    head = f"{who}: " if who else ""
    if effect is None:
        return f"{head}{rests_on}, no interval (a cell with fewer than 3 fine-tuning seeds)"
    source = effect.source + (f"; {', '.join(effect.widened)} widened" if effect.widened else "")
    return f"{head}{effect.text(unit, level)} over {effect.tasks} task(s), {rests_on} ({source}): {decision}"


def _paired(study: Study, pairs: pd.DataFrame, measure: str = "score", at_step: bool = False) -> list[Part]:
    """Per model size: the mean over tasks of the mean matched difference a - b (`effects.pair_contrast`)."""
    out = []
    for size, group in sorted(pairs.groupby("size", sort=True), key=lambda item: _parameters(item[1])):
        steps = sorted(set(group["pretrain_step"].astype(int)))
        who = f"{size} at {_steps_text(steps)}".strip() if at_step else size
        out.append((who, study.effect(pair_contrast(group), measure), plural(len(group), "pair")))
    return out




def _verdict(claim: str, parts: list[tuple[str, list[Part]]], empty: str, unit: str = "pts", *,
             both: tuple[str, ...] = ()) -> tuple[str, str, str]:
    """A finding from its parts (a label and per-size effects each), every test one Holm family; a test without
    measured pretraining noise is never decided (NO_REPLICATES). `both`: the paper's claim is these statements
    at once, each a part's label; each part gets its own verdict and the finding `conjoin`s them (a part the
    sweep cannot test is not resolved), so it is held only when every part is."""
    effects = [effect for _, sizes in parts for _, effect, _ in sizes]
    if not effects:
        return claim, UNRESOLVED, empty
    decisions = [NO_REPLICATES if effect is not None and effect.source != "replicates" else decision
                 for effect, decision in zip(effects, decide(effects))]
    verdict, steps = combine(decisions), iter(zip(decisions, holm_levels(effects)))  # NO_REPLICATES: not resolved
    texts, verdicts = [], {}
    for label, sizes in parts:
        tests, own = [], []
        for size, effect, n in sizes:
            decision, level = next(steps)
            own.append(decision)
            tests.append(_size_text(size, effect, decision, n, unit, level))
        verdicts[label] = combine(own)
        texts.append(label + "; ".join(tests) + (f" [this part: {verdicts[label]}]" if both else ""))
    if both:
        verdict = conjoin([verdicts.get(label, UNRESOLVED) for label in both])
        untested = [label.rstrip(": ").split(",")[0] for label in both if label not in verdicts]
        if untested:
            texts.append(f"not tested in this sweep: {', '.join(untested)}")
    return claim, verdict, " · ".join(texts)


def _undecayed(ours: pd.DataFrame) -> pd.DataFrame:
    """Intermediate checkpoints of runs from scratch taken before their decay began, each set of weights once: a
    row copied from the run that shares the prefix (`trials_of`) is the same checkpoint and is left out."""
    early = ours[~ours["final"] & ours["init_from"].isna()]
    if "optim.decay_steps" in early:
        decay_start = early["budget"] - pd.to_numeric(early["optim.decay_steps"], errors="coerce")
        early = early[~(early["pretrain_step"] > decay_start)]  # unknown decay: kept
    if "trials_of" in early:
        early = early[early["trials_of"].map(key_text) == ""]
    return early


def _early(pairs: pd.DataFrame) -> pd.DataFrame:
    """Finding 2's early pairs: per size, those at undecayed steps in the first quarter of their budget (every one
    of them, their mean the effect: fixed before the data, not where the curves cross), or the earliest step where
    none is."""
    if pairs.empty:
        return pairs
    half = pairs["pretrain_step"] <= pd.to_numeric(pairs["budget"], errors="coerce") / 4
    earliest = pairs["pretrain_step"] == pairs.groupby("size")["pretrain_step"].transform("min")
    in_half = half.groupby(pairs["size"]).transform("any")
    return pairs[(in_half & half) | (~in_half & earliest)]


def crossover(pairs: pd.DataFrame) -> str:
    """Where CLM's lead over MLM (side a) ends along the pretraining steps, per model size: the steps at which the
    matched pairs' mean difference favours each objective (descriptive: the test is at the earliest step)."""
    out = []
    for size, group in pairs.groupby("size", sort=True):
        lead = {step: ("CLM" if d > 0 else "MLM" if d < 0 else "even")
                for step, d in (group.assign(d=group["score_a"] - group["score_b"])
                                .groupby("pretrain_step", sort=True)["d"].mean().items())}
        clm = [s for s, who in lead.items() if who == "CLM"]
        mlm = [s for s, who in lead.items() if who == "MLM"]
        text = (f"mean difference favours CLM at {_steps_text(clm) or 'no step'}, MLM at "
                f"{_steps_text(mlm) or 'no step'} of {_steps_text(list(lead))}")
        later = [s for s in mlm if clm and s > clm[0]]
        if later:
            before = max(s for s in clm if s < later[0])
            text += f"; the curves cross between steps {steps_label(int(before))} and {steps_label(int(later[0]))}"
        out.append(f"{size}: {text}" if size else text)
    return "; ".join(out)


def _steps_text(steps: list) -> str:
    return ", ".join(steps_label(int(s)) for s in steps)


# ------------------------------------------------------------------------------------------------ the findings


def mlm_clm_pairs(final: pd.DataFrame) -> pd.DataFrame:
    """Finding 1's matched pairs: every MLM arm (side a) with the CLM arm of its grid place, SC and QA tasks."""
    sc_qa = final[final["family"].isin(["SC", "QA"])]
    return matched_pairs(_of(sc_qa, "MLM"), _of(sc_qa, "CLM"), vary=("objective", "mask_ratio"))


def fixed_budget_pairs(final: pd.DataFrame) -> pd.DataFrame:
    """Finding 4's matched pairs: every CLM→MLM split (side a) with the MLM arm of its budget."""
    return matched_pairs(_of(final, "CLM→MLM"), _of(final, "MLM"), vary=("objective",))


def continued_pairs(cells: pd.DataFrame) -> pd.DataFrame:
    """Finding 5's matched pairs among final checkpoints: continued from a CLM checkpoint (side a, the name says
    the start: 610m-clm-dec42k-...) with continued from an MLM one."""
    continued = cells[cells["final"] & cells["init_from"].notna()]
    from_clm = continued["run"].astype(str).str.contains("-clm-dec")
    return matched_pairs(continued[from_clm], continued[~from_clm], vary=("init_from",))


def ratio_groups(mlm: pd.DataFrame) -> pd.DataFrame:
    """MLM rows with `group`: their arm but the masking ratio, within which a masking slope is taken."""
    return mlm.assign(group=arm_ids(mlm, without=("mask_ratio", "phases.mask_ratio")))


def retrieval_contrast(group: pd.DataFrame) -> dict | None:
    """Finding 3's retrieval trend at one size (`ratio_groups` rows): the IR tasks' mean masking slope - the other
    families'; None without both."""
    ir, other = group[group["family"] == "IR"], group[group["family"] != "IR"]
    if not len(ir) or not len(other):
        return None
    return difference(slope_contrast(ir, "mask_ratio", RATIO_STEP), slope_contrast(other, "mask_ratio", RATIO_STEP))


def one_size_contrasts(cells: pd.DataFrame) -> list[tuple[str, dict]]:
    """The findings an effect at one model size decides, each as a contrast of `cells` (one size's final
    checkpoints, the study's columns and `arm`): 1, 3's retrieval trend, 4 and 5, those the cells can compare.
    Finding 2 (intermediate checkpoints, LR spreads) and 3's size trend (two sizes) are not among them."""
    scratch = cells[cells["init_from"].isna()]
    out = [("1. MLM beats CLM on SC and QA", pair_contrast(mlm_clm_pairs(scratch))),
           ("4. CLM then MLM beats MLM only (fixed budget)", pair_contrast(fixed_budget_pairs(scratch))),
           ("5. Continued MLM from CLM beats continued MLM from MLM", pair_contrast(continued_pairs(cells)))]
    mlm = _of(scratch, "MLM")
    if mlm["mask_ratio"].nunique() > 1:
        out.insert(1, ("3. Retrieval prefers higher masking ratios", retrieval_contrast(ratio_groups(mlm)) or {}))
    return [(claim, contrast) for claim, contrast in out if contrast]


def _mlm_beats_clm(study: Study, final: pd.DataFrame) -> tuple[str, str, str]:
    claim, verdict, evidence = _verdict("1. MLM beats CLM on sequence classification and QA (effect: MLM - CLM)",
                                        [("", _paired(study, mlm_clm_pairs(final)))],
                                        "nothing to compare in this sweep (no matched MLM and CLM runs)")
    return claim, verdict, f"{evidence} · {NOT_TESTED['1']}" if " pair" in evidence else evidence


NOT_TESTED = {"1": "not tested: the paper's \"CLM is competitive on token classification\" (an equivalence claim "
                   "this rule does not test; the verdict covers SC and QA only)",
              "4": "not tested: the paper's \"the 25% and 50% splits do best\" (the verdict compares every split "
                   "with MLM only, on average)"}
"""Clauses of the paper's findings the report does not test, said beside their finding's verdict."""


def _clm_early_and_lr(study: Study, cells: pd.DataFrame, final: pd.DataFrame) -> tuple[str, str, str]:
    claim = ("2. CLM is more data-efficient early (CLM - MLM over the undecayed checkpoints in the first quarter "
             "of the budget) and less sensitive to the fine-tuning LR (MLM's LR spread - CLM's); held when both are")
    early = _undecayed(cells)
    pairs = matched_pairs(_of(early, "CLM"), _of(early, "MLM"), vary=("objective", "budget", "mask_ratio"))
    first = _early(pairs)
    lr = matched_pairs(_of(final, "MLM"), _of(final, "CLM"), vary=("objective", "mask_ratio"))
    spread = {cell: values["spread"] for cell, values in study.lookup.items()}
    lr = lr[[pd.notna(spread.get((a, t))) and pd.notna(spread.get((b, t)))
             for a, b, t in zip(lr["arm_a"], lr["arm_b"], lr["task"])]] if len(lr) else lr
    labels = ("early, the mean over the undecayed checkpoints in the first quarter of the budget: ",
              "LR spread, max - min over the complete LRs: ")
    parts = []
    if len(first):
        parts.append((labels[0], _paired(study, first, at_step=True)))
    if len(lr):
        parts.append((labels[1], _paired(study, lr, "spread")))
    claim_, verdict, evidence = _verdict(claim, parts, "nothing to compare in this sweep (no undecayed "
                                                       "intermediate checkpoints, no two complete LRs)", both=labels)
    if len(pairs):
        evidence += f" · {crossover(pairs)}"
    return claim_, verdict, evidence


def masking(study: Study) -> tuple[str, str, str]:
    """Finding 3, three parts: no ratio is best everywhere (`best_ratio.no_best_ratio`: every ratio loses to
    another in some size and family), the masking slope grows with the model size (largest - smallest), and
    retrieval's slope exceeds the other families' (per size); with the preferred ratio per size and family
    (descriptive). From scratch, final checkpoints, MLM arms (the one tests/results/test_best_ratio.py simulates)."""
    claim = ("3. No masking ratio is best everywhere: larger models and retrieval prefer higher ratios (slopes in "
             "points per +10 points of masking); held when all three parts are")
    labels = ("no ratio is best everywhere, every ratio beaten by another in some size and family "
              "(intersection-union test): ",
              "larger models prefer higher ratios, the largest size's slope - the smallest's: ",
              "retrieval prefers higher ratios, retrieval's slope - the other families': ")
    mlm = ratio_groups(_of(study.final, "MLM"))
    slopes = {size: group for size, group in mlm.groupby("size", sort=True) if group["mask_ratio"].nunique() > 1}
    if not slopes:
        return claim, UNRESOLVED, "one masking ratio per model size in this sweep: nothing to compare"
    sizes = sorted(slopes, key=lambda z: _parameters(slopes[z]))  # smallest first
    preferred = []
    for size in sizes:
        means = slopes[size].groupby(["family", "mask_ratio"])["score"].mean()
        preferred.append(f"{size + ' ' if size else ''}" + ", ".join(
            f"{family} {means[family].idxmax():.0%}" for family in means.index.get_level_values(0).unique()))
    places = {f"{size} {family}".strip(): cells for size in sizes
              for family, cells in slopes[size].groupby("family", sort=True)}
    best = no_best_ratio(places, study.effect)
    shown = best if best is not None and any(c.effect for c in best.comparisons) else None  # None: no interval
    parts = [] if best is None else [(labels[0], [("", shown, f"{best.ratios} ratios in "
                                                            f"{plural(len(places), 'place')} (size and family)")])]
    if len(sizes) > 1:
        small, large = slopes[sizes[0]], slopes[sizes[-1]]
        common = set(small["task"]) & set(large["task"])
        trend = difference(slope_contrast(large[large["task"].isin(common)], "mask_ratio", RATIO_STEP),
                           slope_contrast(small[small["task"].isin(common)], "mask_ratio", RATIO_STEP))
        parts.append((labels[1], [(f"{sizes[-1]} - {sizes[0]}", study.effect(trend),
                                    plural(len(common), "common task"))]))
    retrieval = []
    for size in sizes:
        group = slopes[size]
        contrast = retrieval_contrast(group)
        if contrast is not None:
            ir = group["family"] == "IR"
            retrieval.append((size, study.effect(contrast), f"{group[ir]['task'].nunique()} IR and "
                                                            f"{plural(group[~ir]['task'].nunique(), 'other task')}"))
    if retrieval:
        parts.append((labels[2], retrieval))
    claim, verdict, evidence = _verdict(claim, parts, "one size and no retrieval task beside another family: "
                                                      "no trend to test", both=labels)
    return claim, verdict, f"best ratio by size and family (mean over its tasks): {'; '.join(preferred)} · {evidence}"


def _parameters(group: pd.DataFrame) -> float:
    """The size's parameter count where the model sizes define it, for ordering sizes (unknown: by name)."""
    size = SIZES.get(str(group["size"].iloc[0]))
    return float(size.non_embedding_params()) if size else float("inf")


def fixed_budget(study: Study) -> tuple[str, str, str]:
    """Finding 4 alone: CLM then MLM against MLM only, matched arms of one budget (the one the calibration
    simulation, tests/results/test_calibration.py, judges many times)."""
    claim, verdict, evidence = _verdict("4. Under a fixed budget, CLM then MLM beats MLM only (effect: CLM→MLM - "
                                        "MLM)", [("", _paired(study, fixed_budget_pairs(study.final)))],
                                        "nothing to compare in this sweep (no matched two-phase and MLM runs)")
    return claim, verdict, f"{evidence} · {NOT_TESTED['4']}" if " pair" in evidence else evidence


def _continued(study: Study) -> tuple[str, str, str]:
    return _verdict("5. Continued MLM from a CLM checkpoint beats continued MLM from an MLM checkpoint",
                    [("", _paired(study, continued_pairs(study.cells)))], "nothing to compare in this sweep (no continued runs from both)")


def findings(s: pd.DataFrame, unmeasured_sd: float = UNMEASURED_SD) -> list[tuple[str, str, str]]:
    """The paper's five findings, each (claim, verdict, evidence), from our checkpoints' cells (the enriched
    summary: objective, size, budget, mask_ratio, init_from, pretrain_step, final, score, ci, n_seeds, family,
    lr_spread, lr_spread_se and the dotted settings), each effect per size with its interval (at its Holm level)
    and the decision of `raybiphase.results.stats.rules`; `unmeasured_sd`: `Study`'s."""
    return judge(Study(s, unmeasured_sd))


def judge(study: Study) -> list[tuple[str, str, str]]:
    """`findings` of a study already pooled."""
    return [_mlm_beats_clm(study, study.final), _clm_early_and_lr(study, study.cells, study.final),
            masking(study), fixed_budget(study), _continued(study)]
