"""What a fine-tuning trial leaves on disk, and under which settings: its record
`<experiment>/records/<key>.json` (one finished, stopped or completed row, raybiphase.results.rows), named by the
trial's key and a digest of the settings that shape a trial's result (`trial_settings`), so a record made under
other settings is never reused; and the check that a finetune.parquet holds rows of one set of settings only.
raybiphase.finetune.fanout writes and reads them; a rerun skips every trial with a record."""

from __future__ import annotations

import hashlib
import json
import re

from raybiphase import storage
from raybiphase.config import FinetuneConfig
from raybiphase.errors import UserError
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from raybiphase.results.rows import FinetuneRow

SETTINGS_COLUMN = "finetune_settings"
"""The FinetuneRow field every row of ours fills with `trial_settings`: a table is kept to one set of fine-tuning
settings."""
PROTOCOL = 4
"""Bumped when the trial protocol changes what a record holds, so older records are not reused. 2: diverged trials
score a floor; offline validation paragraphs held out of the pretraining corpus; every sub-token of a word
labelled; QA windows without the answer trained at position 0. 3: each task's own floor (SQuAD v2's no-answer F1,
a random ranking's NDCG@10) with per-example entries; retrieval on the authors' corpora and splits, each dataset
validated on its own split. 4: MS MARCO's two splits rank one corpus, relevance binary by default, NQ's passages
"title. text"; sentence pairs written as one text in the authors' templates (CHANGELOG.md)."""
TrialKey = tuple  # rows.TRIAL_KEY: (run, pretrain_step, task, lr, seed)


def trial_settings(cfg: FinetuneConfig) -> str:
    """A digest of the settings that shape one trial's result (not the grid): a record made under other settings
    is not reused. A GPU trial computes in bf16, so whether trials hold a GPU is one of them. Settings that change
    only floating-point rounding (finetune.compile, which kernels run, how wide a CUDA batch is padded) are not."""
    settings = [cfg.batch_size, cfg.max_steps, cfg.warmup_ratio, cfg.eval_every, cfg.max_examples, cfg.max_len,
                ["protocol", PROTOCOL]]
    if cfg.max_eval_examples:
        settings.append(["max_eval_examples", cfg.max_eval_examples])
    if cfg.gpus_per_trial > 0:
        settings.append("bf16")
    if cfg.bucket_by_length:
        settings.append("bucket_by_length")
    if cfg.tc_labels != "all_subtokens":  # the default's own change is PROTOCOL 2's
        settings.append(["tc_labels", cfg.tc_labels])
    if cfg.ir_corpus != "judged":
        settings.append(["ir_corpus", cfg.ir_corpus])
    if cfg.ir_relevance != "binary":
        settings.append(["ir_relevance", cfg.ir_relevance])
    if cfg.dataset_revisions:
        settings.append(["dataset_revisions", sorted(cfg.dataset_revisions)])
    return hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:8]


def check_settings(table: str, cfg: FinetuneConfig) -> None:
    """UserError when the finetune.parquet at `table` holds trials of ours made under other fine-tuning settings:
    their keys (run, step, task, LR, seed) do not name the settings, so they would count as done and the report
    would mix them. Rows from before the column existed are not checked."""

    rows = store.read_rows(table, ["source", SETTINGS_COLUMN])
    if SETTINGS_COLUMN not in rows:
        return
    made = set(rows[(rows["source"] == result_rows.OURS) & rows[SETTINGS_COLUMN].notna()][SETTINGS_COLUMN])
    if made - {trial_settings(cfg)}:
        raise UserError(f"finetune: {table} holds trials fine-tuned under other settings (finetune.batch_size, "
                        "max_steps, warmup_ratio, eval_every, max_examples, max_eval_examples, max_len, "
                        "bucket_by_length, tc_labels, ir_corpus or ir_relevance); "
                        "they would count as done and the report would mix them: set another sweep.name (or output "
                        "folder), or move that file away")


def record_path(experiment: str, key: TrialKey, settings: str) -> str:
    run, step, task, lr, seed = key
    digest = hashlib.sha256(json.dumps([*key, settings]).encode()).hexdigest()[:8]
    safe_run = re.sub(r"[^A-Za-z0-9._-]+", "_", run)
    return storage.join(experiment, storage.RECORDS, f"{safe_run}__{step}__{task}__lr{lr:g}__seed{seed}__{digest}.json")


def write_record(location: str, row: FinetuneRow) -> None:
    storage.write_json(location, row.record())


def read_record(location: str) -> FinetuneRow | None:
    record = storage.read_json(location)
    return None if record is None else FinetuneRow.from_record(record)
