"""What the sweep fine-tunes: each distinct checkpoint and untrained control as a source, the baselines' rows, and
the trials already done. raybiphase.sweep.scheduler runs a source's trials as soon as it is ready.

A checkpoint's trials do not wait for the last segment of the sweep: the untrained controls are exported and
fine-tuned at once, and each distinct checkpoint (plan.checkpoints) is fine-tuned as soon as the segment that holds
it has ended. Resuming: a trial with a row or a record is not rerun (the fan-out's own rule).
"""

from __future__ import annotations

import dataclasses

from raybiphase import storage
from raybiphase.config import SweepSpec
from raybiphase.finetune.baselines import bm25_baseline, majority_baseline
from raybiphase.finetune.fanout import plan_trials
from raybiphase.finetune.spec import FinetuneSource
from raybiphase.finetune.tasks import get_task
from raybiphase.pretrain.export import export_initial
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from raybiphase.sweep.context import SweepContext


def finetune_sources(ctx: SweepContext, segments: set[str] | None = None) -> list[FinetuneSource]:
    """One source per distinct checkpoint (plan.checkpoints: every run's final and train.export_steps ones), under
    the first run whose weights it holds, with its grid (plan.grids: finetune.exports' for an intermediate step);
    the other runs sharing it ride along in `shared_by` (their rows are copies: shared weights are fine-tuned
    once). With `segments`, only the checkpoints those segments hold."""
    out = []
    grids = ctx.plan.grids(ctx.spec)
    for (segment, step), names in ctx.plan.checkpoints().items():
        if segments is not None and segment not in segments:
            continue
        hf = storage.hf_dir(ctx.paths.checkpoint(segment, step))
        first, *others = (FinetuneSource(name, step, hf,
                                                     result_rows.config_columns(ctx.plan.runs[name].config),
                                                     grid=grids[(segment, step)])
                          for name in names)
        out.append(dataclasses.replace(first, shared_by=tuple(others)))
    return out


def first_sources(ctx: SweepContext, done: frozenset[str]) -> list[FinetuneSource]:
    """What the sweep fine-tunes before any segment ends: the untrained controls first (`control_sources`), then the
    checkpoints of the segments `done` as it starts."""
    return control_sources(ctx) + finetune_sources(ctx, set(done))


def control_sources(ctx: SweepContext, *, export: bool = True) -> list[FinetuneSource]:
    """The untrained controls (plan.controls): each one's step-0 weights exported once, under
    <sweep>/controls/<name>/hf (an `exported.json` beside it marks a finished export), as a source at step 0.
    With `export` False, only the controls already exported."""
    out = []
    for control in ctx.plan.controls.values():
        folder = ctx.paths.control(control.name)
        hf = storage.join(folder, storage.HF_DIR)
        if not storage.exists(storage.join(folder, storage.EXPORTED)):
            if not export:
                continue
            storage.delete(hf)  # an export cut short, if any
            export_initial(control.config, ctx.data_dir(control.config), hf)
            storage.write_json(storage.join(folder, storage.EXPORTED), {"runs": control.runs})
        out.append(FinetuneSource(control.name, 0, hf, result_rows.control_columns(control.config)))
    return out


def baseline_rows(spec: SweepSpec) -> list[dict]:
    """Baseline rows on the same test splits (each appended once: its key is fixed): BM25 for every retrieval task
    (run "bm25"), the majority class for every sequence-classification task (run "majority")."""
    rows, caps = [], {"max_examples": spec.finetune.max_examples, "max_eval_examples": spec.finetune.max_eval_examples}
    for name in spec.finetune.tasks:
        family = get_task(name).family
        if family == "IR":
            bm25 = bm25_baseline(name, **caps, ir_relevance=spec.finetune.ir_relevance)
            rows.append(result_rows.baseline_row(bm25, run="bm25", family=family, sweep=spec.sweep.name).record())
        elif family == "SC":
            rows.append(result_rows.baseline_row(majority_baseline(name, **caps), run="majority",
                                                 family=family, sweep=spec.sweep.name).record())
    return rows


def say_planned(ctx: SweepContext) -> None:
    """How many of the sweep's trials are already done, and that the rest run as their checkpoints are ready."""
    done = {result_rows.trial_key(dict(zip(result_rows.TRIAL_KEY, key)))
            for key in trials_done(ctx.paths.table(storage.FINETUNE_FILE))}
    planned = {t.key for t in plan_trials(_planned_sources(ctx), ctx.spec.finetune)}
    ctx.say(f"fine-tuning: {len(planned & done)}/{len(planned)} trials already done; the rest run as their "
            f"checkpoints are ready ({'ASHA' if ctx.spec.finetune.asha else 'full grid'})")


def trials_done(table: str, source: str = result_rows.OURS) -> set[tuple]:
    """The keys (rows.TRIAL_KEY) of the trials of `source` (ours, or the public encoders') with a row in the
    finetune.parquet at `table`."""
    return {key[:-1] for key in store.done_keys(table, result_rows.FINETUNE_KEY) if key[-1] == source}


def _planned_sources(ctx: SweepContext) -> list[FinetuneSource]:
    """Every source the sweep fine-tunes, the controls included, without exporting anything (for counting)."""
    controls = [FinetuneSource(c.name, 0, "", {}) for c in ctx.plan.controls.values()]
    return controls + finetune_sources(ctx)
