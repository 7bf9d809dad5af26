"""`raybiphase finetune MODEL OUT`: any encoder checkpoint in HF format (a released EuroBERT, BERT, RoBERTa,
ModernBERT or Ettin folder or Hub id, read at the commit the id resolves to when the command starts, or one of a
sweep's exports) through the sweep's own scheduler (with no segments), fan-out, protocol and rows, so
published models sit beside the user's in one report.

    raybiphase finetune path/to/610m-mlm40-42k results/published --set "finetune.tasks=[sst2, squad]"
    raybiphase finetune results/quickstart/controls/tiny-init-69ac65/hf results/mine sweeps/quickstart.yaml

The fine-tuning settings (`finetune.*`, `resources.max_concurrent`) come from an optional spec and `--set`; the
rows go to OUT/finetune.parquet under the run name `--name` (the model folder's name by default) with
pretrain_step 0, then OUT/summary.parquet and OUT/report/ are written. Run it again to resume: trials already in
OUT are not recomputed. `raybiphase report` over a folder holding a sweep's rows and these draws them together.
"""

from __future__ import annotations

from pathlib import Path

from raybiphase import storage
from raybiphase.config import SweepSpec
from raybiphase.finetune.encoders import encoder_source
from raybiphase.finetune.fanout import Fanout, check_tasks
from raybiphase.finetune.records import check_settings
from raybiphase.finetune.spec import FinetuneSource
from raybiphase.results import rows as result_rows
from raybiphase.results import store
from raybiphase.results.report import write_report
from raybiphase.sweep.scheduler import finetune_checkpoints


def finetune_model(model: str, out: str, spec: SweepSpec, name: str | None = None) -> list[dict]:
    """Fine-tune one HF checkpoint over spec.finetune's tasks x LRs x seeds into OUT; the new rows."""
    check_tasks(spec.finetune)
    model = encoder_source(model)  # a Hub id: pinned to its commit now, so every trial reads the same weights
    storage.check_reachable(model, "MODEL")  # a bucket out of reach: one line before anything, not retried reads
    storage.check_reachable(out, "OUT")
    out = storage.absolute(out)
    name = name or Path(str(model).rstrip("/").partition("@")[0]).name
    source = FinetuneSource(name, 0, str(model), {"model.init_from": str(model)})
    path = storage.join(out, storage.FINETUNE_FILE)
    check_settings(path, spec.finetune)
    done = {key[:-1] for key in store.done_keys(path, result_rows.FINETUNE_KEY) if key[-1] == result_rows.OURS}
    rows = finetune_checkpoints([source], Fanout.of(spec), storage=out, name="finetune", done=done)
    if rows:
        store.append_rows(path, rows, key=result_rows.FINETUNE_KEY)
    if storage.exists(path):
        write_report(out)
    return rows
