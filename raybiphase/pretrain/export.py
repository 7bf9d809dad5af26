"""`raybiphase export CHECKPOINT OUT [--name NAME] [--push-to-hub REPO [--private]]`: any raybiphase checkpoint
(local or in a bucket, at any step) as a folder stock transformers loads, with its model card.

    raybiphase export results/quickstart/runs/tiny-clm-0-400-8f7d5072/step-00000200 exports/clm-200
    python -c "from transformers import AutoModelForMaskedLM; AutoModelForMaskedLM.from_pretrained('exports/clm-200')"

A checkpoint the run exported (train.export_steps, the end) is copied; any other step is rebuilt from its sharded
weights (torch.distributed.checkpoint, read in this process) with the tokenizer of its data. Either way its
config's `max_position_embeddings` is the run's data.seq_len, the length it was trained on (an evaluation harness
sizes its inputs from that field), not EuroBERT's 8,192, and its tokenizer frames a text as pretraining did: a stock
`AutoTokenizer` call gives `<bos> text <eos>`, as fine-tuning frames its inputs (`<bos> A <eos> B <eos>` for a
pair). The card
(raybiphase.pretrain.card) names the run as the sweep did (pretrain.parquet), else in the paper's scheme from the
checkpoint's config, and lists the downstream scores summary.parquet holds for that run and step. OUT must not
exist or be empty; nothing is written there when the checkpoint is bad. `--push-to-hub` uploads the folder to a
Hugging Face Hub model repository (created if missing; needs `hf auth login` or HF_TOKEN).
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

from raybiphase import storage, transfer
from raybiphase.checkpoint_meta import read_meta
from raybiphase.config import RunConfig
from raybiphase.data.assets import cache_dir
from raybiphase.data.prepare import prepare
from raybiphase.data.stream import open_dataset
from raybiphase.errors import UserError
from raybiphase.naming import run_name
from raybiphase.pretrain import checkpoint as ckpt
from raybiphase.pretrain.card import CARD, model_card, scores_for
from raybiphase.pretrain.checkpoint import record_trained_length
from raybiphase.pretrain.model import initial_model
from raybiphase.results.store import read_table


def checkpoint_name(checkpoint: str, meta) -> str:
    """The run this checkpoint ends (else the first run through it) as the sweep recorded it; without records,
    the paper's scheme for its config."""

    rows = [r for r in read_table(storage.join(storage.sweep_root(checkpoint), storage.PRETRAIN_FILE))
            if r.get("checkpoint") and storage.absolute(r["checkpoint"]).rstrip("/") == checkpoint.rstrip("/")]
    ending = [r["run"] for r in rows if int(r.get("phases.steps") or 0) == meta.step]
    return (ending or [r["run"] for r in rows] or [run_name(meta.config)])[0]


def write_card(hf_location: str, checkpoint: str, *, name: str | None = None, location: str | None = None,
               summary: list[dict] | None = None) -> str:
    """Write README.md into an HF folder (local or in a bucket) for `checkpoint`; returns the run name used.
    `summary`: the sweep's summary rows when the caller holds them (else read from the checkpoint's sweep)."""

    meta = read_meta(checkpoint)
    name = name or checkpoint_name(checkpoint, meta)
    if summary is None:
        summary = read_table(storage.join(storage.sweep_root(checkpoint), storage.SUMMARY_FILE))
    text = model_card(meta, name=name, scores=scores_for(summary, run=name, step=meta.step),
                      location=location or hf_location)
    storage.write_bytes(storage.join(hf_location, CARD), text.encode())
    return name


def export_initial(run: RunConfig, data_dir: str, dest: str) -> None:
    """The run's step-0 weights (what `train_loop` starts from before any step) as an HF folder at `dest` (a folder
    or a bucket URI): the sweep's untrained control."""
    from transformers.utils import logging as hf_logging

    manifest = open_dataset(data_dir, seq_len=run.data.seq_len)
    model = initial_model(run, manifest)
    hf_logging.disable_progress_bar()  # one small folder: no "Writing model shards" bar in the sweep's output
    with tempfile.TemporaryDirectory() as tmp:
        ckpt.export_hf(Path(tmp) / storage.HF_DIR, model, manifest.local_tokenizer(), seq_len=run.data.seq_len)
        transfer.upload(Path(tmp) / storage.HF_DIR, dest)


def _rebuild(checkpoint: str, meta, dest: Path) -> None:
    """An HF folder from the sharded weights of a step that was not exported."""
    from transformers.utils import logging as hf_logging

    run = meta.config
    data_dir = prepare(run.data, on_ray=False, storage_root=storage.parent(storage.sweep_root(checkpoint)))
    manifest = open_dataset(data_dir, seq_len=run.data.seq_len)
    model = initial_model(run, manifest)  # the run's architecture; the checkpoint's weights replace its values
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        ckpt.load(transfer.local_copy(checkpoint, cache_dir()), model, name=str(checkpoint))
    hf_logging.disable_progress_bar()
    ckpt.export_hf(dest, model, manifest.local_tokenizer(), seq_len=meta.config.data.seq_len)


def push_to_hub(folder: Path, repo: str, *, private: bool = False) -> str:
    """Upload `folder` to the Hub model repository `repo`; UserError with the Hub's reason on failure."""
    from huggingface_hub import HfApi

    try:
        api = HfApi()
        url = api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model",
                          commit_message="raybiphase export")
    except Exception as err:  # the Hub's own errors are many; each becomes one line
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"export: pushing to the Hub repository {repo!r} failed: {type(err).__name__}: {reason}")
    return str(url)


def export_checkpoint(checkpoint: str, out: str, *, name: str | None = None, push: str | None = None,
                      private: bool = False) -> str:
    """Export `checkpoint` to `out` (a folder or a bucket URI) with its card; push to the Hub when `push` names a
    repository. Returns the run name written on the card."""

    checkpoint, out = storage.absolute(checkpoint), storage.absolute(out)
    if not storage.exists(checkpoint):
        raise UserError(f"export: checkpoint {checkpoint} does not exist")
    meta = read_meta(checkpoint)  # not a raybiphase checkpoint: one line, before anything is written
    if storage.exists(out) and (storage.list_files(out) or storage.list_folders(out)):
        raise UserError(f"export: {out} exists and is not empty; name a new folder")
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "hf"
        exported = storage.hf_dir(checkpoint)
        if storage.is_file(storage.join(exported, "config.json")):

            shutil.copytree(transfer.local_copy(exported, cache_dir()), local)
            ckpt.save_tokenizer(local, local)  # exports written before their tokenizer framed texts
        else:
            _rebuild(checkpoint, meta, local)
        record_trained_length(local, meta.config.data.seq_len)  # exports written before it said so
        (local / CARD).unlink(missing_ok=True)
        name = write_card(str(local), checkpoint, name=name, location=push or out)
        transfer.upload(local, out)
        if push:
            try:
                print(f"export: pushed to {push_to_hub(local, push, private=private)}")
            except UserError as err:
                raise UserError(f"{err} (the folder itself is complete at {out})") from None
    print(f"export: {name} step {meta.step:,} -> {out}")
    return name
