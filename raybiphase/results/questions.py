"""Questions beyond the paper, answered when a sweep has their runs (sweeps/beyond.yaml): each run
whose name shows a knob (an optimizer reset `r`, a ratio schedule `to15`, per-sequence rates `u15to60`, MNTP,
frozen blocks `f6`) is paired, per task, with the run that differs from it only by not having it, and each
question is one effect (the mean over tasks of the mean difference between the run with the knob and its
counterpart, in the claim's direction) with its 95% interval. Each run is its own side: the intervals count
fine-tuning seeds only (a beyond-the-paper sweep pretrains each arm once) and ignore pretraining noise, so, as for
the findings, no question is decided on them: each says "not resolved (no replicated arm ...)" beside its effect.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from raybiphase.naming import join_label, label_parts, strip_hash
from raybiphase.results.stats.control import UNTRAINED
from raybiphase.results.stats.effects import estimate, pair_contrast, shared_trials
from raybiphase.results.stats.matching import compare, with_noise_columns
from raybiphase.results.stats.rules import NO_REPLICATES, UNRESOLVED, plural
from raybiphase.results.tables import Section, markdown, mean_ci


@dataclass(frozen=True)
class Question:
    """A question beyond the paper: runs whose name shows `knob` (side a) against the run that differs
    from each only by not having it (side b, `counterpart`: a pattern over the name without its hash); `claim` is
    the literature's answer, `expected` the side it says wins."""

    name: str
    title: str
    claim: str
    has: Callable[[dict[str, str]], bool]
    counterpart: Callable[[dict[str, str]], str]
    expected: str = "a"


def _drop(part: str) -> Callable[[dict[str, str]], str]:
    return lambda p: re.escape(join_label({**p, part: ""}))


QUESTIONS = (
    Question("optimizer_reset", "Optimizer state at the objective switch: reset vs carried",
             "Resetting AdamW at the switch and warming up again (Ettin) beats carrying its moments (the paper)",
             lambda p: bool(p["reset"]), _drop("reset")),
    Question("ratio_schedule", "Masking-ratio schedule: decayed vs fixed",
             "A masking ratio decayed over the phase (Ankner et al.) beats the fixed starting ratio",
             lambda p: bool(p["end"]) and not p["ratio"].startswith("u"), _drop("end")),
    Question("uniform_rate", "The masking-rate confound: per-sequence rates vs one fixed rate",
             "Per-sequence masking rates drawn from a range beat the best fixed rate (CLM's spread of rates, "
             "given to MLM)",
             lambda p: p["ratio"].startswith("u"),
             lambda p: re.escape(p["objective"]) + r"\d+" + re.escape(join_label({**p, "objective": "", "ratio": ""}))),
    Question("mntp", "MNTP vs MLM from the same start",
             "Masked next-token prediction (LLM2Vec) beats MLM trained from the same weights",
             lambda p: p["objective"] == "mntp", lambda p: re.escape(join_label({**p, "objective": "mlm"}))),
    Question("frozen_layers", "Layer freezing during a phase: every block vs frozen blocks",
             "Training every block beats freezing some during the phase (the change the phase brings needs them)",
             lambda p: bool(p["frozen"]), _drop("frozen"), expected="b"),
)
"""The questions the report answers when the sweep has their runs (sweeps/beyond.yaml)."""


def _tokens(run: str) -> list[tuple[str, dict[str, str] | None]]:
    return [(token, label_parts(token)) for token in strip_hash(str(run)).split("-")]


def knobs(run: str) -> str:
    """The beyond-the-paper knobs a run's name shows (QUESTIONS' names, comma-separated), empty for none."""
    labels = [parts for _, parts in _tokens(run) if parts]
    return ",".join(q.name for q in QUESTIONS if any(q.has(p) for p in labels))


def _counterparts(run: str, question: Question) -> list[re.Pattern]:
    """Patterns of the runs that differ from `run` only by not having the question's knob, one per phase that
    has it."""
    tokens = _tokens(run)
    out = []
    for i, (_, parts) in enumerate(tokens):
        if parts and question.has(parts):
            pattern = "-".join(question.counterpart(p) if j == i else re.escape(t)
                               for j, (t, p) in enumerate(tokens))
            out.append(re.compile(pattern))
    return out


def question_pairs(s: pd.DataFrame, question: Question) -> pd.DataFrame:
    """Per task, every run with the question's knob against its counterpart (the best-scoring one where a pattern
    matches several), final checkpoints of our runs. Columns: task, family, run, score, ci, n_seeds,
    counterpart, counterpart_score, counterpart_ci, counterpart_seeds, better ("a", "b", "overlap", "no
    interval")."""
    final = s[(s["source"] == "raybiphase") & s["final"] & (s["objective"] != UNTRAINED)]
    keys = final["run"].map(lambda r: strip_hash(str(r)))
    rows = []
    for _, a in final[final["run"].map(lambda r: question.name in knobs(r).split(","))].iterrows():
        for pattern in _counterparts(a["run"], question):
            match = final[(final["task"] == a["task"]) & keys.map(lambda k: bool(pattern.fullmatch(k)))]
            if match.empty:
                continue
            b = match.sort_values("score", ascending=False).iloc[0]
            rows.append({"task": a["task"], "family": a["family"], "run": a["run"], "score": a["score"],
                         "ci": a["ci"], "n_seeds": a["n_seeds"], "counterpart": b["run"],
                         "counterpart_score": b["score"], "counterpart_ci": b["ci"],
                         "counterpart_seeds": b["n_seeds"], "better": compare(a, b)})
    return pd.DataFrame(rows, columns=["task", "family", "run", "score", "ci", "n_seeds", "counterpart",
                                       "counterpart_score", "counterpart_ci", "counterpart_seeds", "better"])


def question_verdict(pairs: pd.DataFrame, question: Question) -> tuple[str, str]:
    """(verdict, evidence) of a question over its pairs: the mean over tasks of the mean difference in the claim's
    direction (the run with the knob minus its counterpart, or the reverse where the claim is that the knob
    loses), with its 95% interval over the fine-tuning seeds' standard errors: shown, never decided on
    (NO_REPLICATES: pretraining noise is not measured)."""
    if pairs.empty:
        return UNRESOLVED, "nothing to compare in this sweep"
    with_knob, without = (("run", "counterpart") if question.expected == "a" else ("counterpart", "run"))
    sides = pd.concat([
        pd.DataFrame({"arm": pairs["run"], "task": pairs["task"], "family": pairs["family"], "score": pairs["score"],
                      "ci": pairs["ci"], "n_seeds": pairs["n_seeds"]}),
        pd.DataFrame({"arm": pairs["counterpart"], "task": pairs["task"], "family": pairs["family"],
                      "score": pairs["counterpart_score"], "ci": pairs["counterpart_ci"],
                      "n_seeds": pairs["counterpart_seeds"]})]).drop_duplicates(["arm", "task"])
    cells = with_noise_columns(sides).assign(arm=sides["arm"], n_runs=1).set_index(["arm", "task"]).to_dict("index")
    contrast = pair_contrast(pd.DataFrame({"task": pairs["task"], "arm_a": pairs[with_knob],
                                           "arm_b": pairs[without]}))
    effect = estimate(contrast, cells, None, groups=shared_trials(pairs["task"], pairs["family"]))
    rests = plural(len(pairs), "pair")
    if effect is None:
        return UNRESOLVED, f"{rests}, no interval (a side with fewer than 3 fine-tuning seeds)"
    return NO_REPLICATES, (f"{effect.text()} over {effect.tasks} task(s), {rests} (fine-tuning seeds only, "
                           "pretraining noise ignored)")


def beyond_sections(s: pd.DataFrame) -> list[Section]:
    """A section per question beyond the paper whose runs the sweep has (QUESTIONS)."""
    out = []
    for question in QUESTIONS:
        pairs = question_pairs(s, question)
        if not pairs.empty:
            out.append(question_section(question, pairs))
    return out


def question_section(question: Question, pairs: pd.DataFrame) -> Section:
    verdict, tally = question_verdict(pairs, question)
    names = {"a": "with", "b": "without", "overlap": "overlap", "no interval": "not resolved"}
    table = pd.DataFrame({
        "task": pairs["task"], "family": pairs["family"], "with the knob": pairs["run"],
        "test (%)": [mean_ci(m, c, n) for m, c, n in zip(pairs["score"], pairs["ci"], pairs["n_seeds"])],
        "without": pairs["counterpart"],
        "test (%) ": [mean_ci(m, c, n) for m, c, n in
                      zip(pairs["counterpart_score"], pairs["counterpart_ci"], pairs["counterpart_seeds"])],
        "better (95% CI apart)": pairs["better"].map(names)})
    note = (f"Claim: {question.claim}. Verdict: **{verdict}** ({tally}, the claim's direction positive). Each run "
            "with the setting against the run that differs from it only by not having it (the best-scoring one where "
            "several do), final checkpoints; the effect is the mean difference over tasks with its 95% interval over "
            "fine-tuning seeds. Such an interval ignores pretraining noise, so no verdict is drawn from it: "
            "pretrain both sides more than once (`train.seed`) to decide (docs/statistics.md).")
    return Section(f"beyond_{question.name}", f"Beyond the paper: {question.title}", None, note, markdown(table))
