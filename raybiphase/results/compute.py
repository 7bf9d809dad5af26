"""The compute-matched view: every final checkpoint with the training FLOPs it took, beside the step-matched
findings, so two arms can be compared at equal compute as well as at equal steps.

FLOPs are counted as executed (no torch; the run's dotted settings in the summary are enough):

- per token, the blocks' matmuls and attention scores as `raybiphase.config.sizes.flops_per_token` counts them
  without the LM head, plus the head's 6 x vocabulary x hidden on the tokens it runs on: every token of a CLM step,
  only the masked ones of an MLM step (the sparse head computes the masked rows alone: phases.mask_ratio of them);
- per step, train.global_batch_tokens tokens;
- a continued run (model.init_from "@run") is charged for its source's steps too, found by name among the sweep's
  runs; a start from outside the sweep is said, not counted.

So under one step budget an MLM-only run costs less than a CLM-only one (its head runs on 40% of the tokens), and a
continued run costs its source plus its own steps.
"""

from __future__ import annotations

import math

import pandas as pd

from raybiphase.config.estimates import LLAMA3_VOCAB
from raybiphase.config.sizes import SIZES
from raybiphase.naming import steps_label, strip_hash
from raybiphase.results.tables import MarkdownTable, Section, markdown


def _setting(row: pd.Series, key: str, default: object = math.nan) -> object:
    value = row.get(key, default)
    return default if value is None or (isinstance(value, float) and math.isnan(value)) else value


def run_flops(row: pd.Series) -> float:
    """Executed training FLOPs of a run's own steps (NaN when its size or batch is unknown)."""
    size = SIZES.get(str(_setting(row, "model.size", "")))
    batch, steps = _setting(row, "train.global_batch_tokens"), _setting(row, "phases.steps")
    if size is None or pd.isna(batch) or pd.isna(steps):
        return math.nan
    train_bpe = _setting(row, "data.tokenizer", "") == "train-bpe"
    vocab = int(_setting(row, "data.vocab_size", LLAMA3_VOCAB)) if train_bpe else LLAMA3_VOCAB
    seq_len = int(_setting(row, "data.seq_len", 2048))
    blocks = size.flops_per_token(0, seq_len)  # without the LM head
    head = 6 * vocab * size.hidden
    clm = float(_setting(row, "phases.clm_steps", 0.0))
    ratio = float(_setting(row, "phases.mask_ratio", 0.0))
    return float(batch) * (clm * (blocks + head) + (float(steps) - clm) * (blocks + ratio * head))


def with_flops(final: pd.DataFrame) -> pd.DataFrame:
    """The rows with `flops` (a run's own steps plus, for a continued run, its source's: `flops_note` says when a
    source outside the sweep is not counted) and `total_steps`."""
    own = {strip_hash(str(r["run"])): (run_flops(r), float(_setting(r, "phases.steps", math.nan)))
           for _, r in final.drop_duplicates("run").iterrows()}
    flops, steps, notes = [], [], []
    for _, row in final.iterrows():
        mine, my_steps = own[strip_hash(str(row["run"]))]
        start = str(_setting(row, "model.init_from", ""))
        source = own.get(start[1:]) if start.startswith("@") else None
        notes.append("" if not start or source else "upstream not counted")
        flops.append(mine + (source[0] if source else 0.0))
        steps.append(my_steps + (source[1] if source else 0.0))
    return final.assign(flops=flops, total_steps=steps, flops_note=notes)


def _parameters(size: str) -> float:
    return float(SIZES[size].non_embedding_params()) if size in SIZES else math.inf


def compute_section(s: pd.DataFrame) -> Section:
    """Per model size (smallest first), the final checkpoints by executed training FLOPs, with their mean score over
    the tasks every one of them has; the FLOPs relative to that size's CLM-only run of the same total steps (the
    dense head on every token: the most a run of those steps can cost)."""
    title = "Compute-matched view: training FLOPs as executed"
    final = s[(s["source"] == "raybiphase") & s["final"] & (s["objective"] != "untrained")]
    if final.empty:
        return Section("compute", title, None, "Not drawn: no pretrained checkpoint has fine-tuning scores.")
    final = with_flops(final)
    tables, frames = [], []
    by_size = final.groupby("size", sort=True)
    for size, group in sorted(by_size, key=lambda item: _parameters(str(item[0]))):
        common = set.intersection(*(set(g["task"]) for _, g in group.groupby("run")))
        runs = (group[group["task"].isin(common)].groupby("run")
                .agg(objective=("objective", "first"), steps=("total_steps", "first"), flops=("flops", "first"),
                     note=("flops_note", "first"), score=("score", "mean"))
                .sort_values(["flops", "score"]))
        clm = runs[runs["objective"] == "CLM"].groupby("steps")["flops"].min()
        table = pd.DataFrame({
            "run": [strip_hash(r) for r in runs.index], "objective": runs["objective"].to_numpy(),
            "steps (with upstream)": [steps_label(int(x)) if pd.notna(x) else "?" for x in runs["steps"]],
            "training FLOPs": [f"{f:.3g}" + (f" ({n})" if n else "") for f, n in zip(runs["flops"], runs["note"])],
            "vs CLM-only, same steps": [f"{f / clm[x]:.3f}x" if x in clm.index else "" for f, x in
                                        zip(runs["flops"], runs["steps"])],
            f"mean test (%), {len(common)} task(s)": runs["score"].round(2).to_numpy()})
        tables.append(f"**{size or 'all sizes'}**\n\n{markdown(table)}")
        frames.append(table.rename(columns={table.columns[-1]: "mean test (%)"}).assign(size=size or "all sizes"))
    note = ("Every final checkpoint of the paper's settings with its training FLOPs as executed: the LM head on "
            "every token of a CLM step and on the masked tokens of an MLM step (the sparse head), a continued run "
            "charged for its source's steps. The findings compare arms at equal steps; this table lets two arms be "
            "read at equal compute. Scores: the mean over the tasks every run of the size has.")
    text = MarkdownTable("\n\n".join(tables))
    text.frame = pd.concat(frames, ignore_index=True)  # the sizes' tables as one, for the CSV and LaTeX
    return Section("compute", title, None, note, text)
