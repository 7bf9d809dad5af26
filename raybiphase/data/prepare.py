"""Corpus -> tokenizer -> packed Parquet shards + manifest: `python -m raybiphase prepare CONFIG [--set k=v]`.

Documents are read from the configured source (offline: SQuAD *train* contexts and the pretraining part of the
Wikipedia leads; production: any `datasets` dataset, FineWeb-Edu included, or local text/JSONL/Parquet), shuffled
with a fixed seed, tokenized on Ray Data in parallel, wrapped as `<bos> doc <eos>` and packed into blocks of
`data.seq_len` tokens (a document longer than a block continues in the next one; nothing is dropped but the last
partial block). Whole documents go to a held-out validation split first, then to the training shards.

Output (written to a temporary directory, then renamed, so a half-written dataset never exists):
    <dir>/tokenizer/          HF fast tokenizer with bos, eos, pad and mask tokens
    <dir>/train-00000.parquet column `input_ids`: fixed_size_list<int32>[seq_len], one block per row
    <dir>/val.parquet         the held-out blocks
    <dir>/manifest.json       rows per shard, seq_len, tokenizer fingerprint, source, counts, checksums
A second run with the same inputs finds the manifest and does nothing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raybiphase.cli import UserError, config_parser, run_main
from raybiphase.config import DataConfig, SweepSpec, load

FORMAT_VERSION = 1
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "mask_token": "<mask>"}
SHUFFLE_SEED = 1234  # document order before packing; fixed so the shards are a pure function of the inputs


def fingerprint(data: DataConfig) -> str:
    """Short hash of everything that determines the shards."""
    keys = asdict(data)
    keys.pop("dir")
    keys["format"] = FORMAT_VERSION
    return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:12]


def dataset_dir(data: DataConfig) -> Path:
    if data.dir:
        return Path(data.dir).expanduser().resolve()
    from raybiphase.data.assets import cache_dir

    return cache_dir() / "shards" / fingerprint(data)


# ------------------------------------------------------------------------------------------------- documents


def read_documents(data: DataConfig) -> list[str]:
    """All documents of the source as strings (empty ones dropped), capped at data.max_documents."""
    from raybiphase.data import sources

    if data.source == "offline":
        docs: Iterable[str] = sources.pretraining_texts()
    elif Path(data.source).expanduser().exists():
        docs = sources.local_texts(Path(data.source).expanduser())
    elif "/" in data.source and not data.source.startswith((".", "/")):
        docs = sources.hf_texts(data.source, "train", data.text_field, config_name=data.hf_config)
    else:
        raise UserError(f"data.source: {data.source!r} is not 'offline', an existing path, or a dataset id")
    out = []
    for doc in docs:
        if doc and doc.strip():
            out.append(doc)
            if data.max_documents and len(out) >= data.max_documents:
                break
    if not out:
        raise UserError(f"data.source: {data.source!r} yielded no documents (empty corpus)")
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(out))
    return [out[i] for i in order]


# ------------------------------------------------------------------------------------------------- tokenizer


def build_tokenizer(data: DataConfig, docs: list[str], out_dir: Path):
    """Train a byte-level BPE on the corpus, or load the given one; either way it has bos/eos/pad/mask."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if data.tokenizer == "train-bpe":
        from tokenizers import ByteLevelBPETokenizer

        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(
            docs, vocab_size=data.vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS.values())
        )
        tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, **SPECIAL_TOKENS)
    else:
        path = Path(data.tokenizer).expanduser()
        if not path.exists():
            raise UserError(f"data.tokenizer: {data.tokenizer!r} is neither 'train-bpe' nor an existing folder")
        tok = AutoTokenizer.from_pretrained(str(path))
        missing = {k: v for k, v in SPECIAL_TOKENS.items() if getattr(tok, k) is None}
        if "pad_token" in missing and tok.eos_token is not None:  # Llama-3 convention: pad = eos
            tok.pad_token = tok.eos_token
            missing.pop("pad_token")
        if missing:
            tok.add_special_tokens(missing)
    tok.save_pretrained(str(out_dir))
    return tok


def tokenizer_fingerprint(tokenizer_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = tokenizer_dir / name
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# -------------------------------------------------------------------------------------- tokenize and pack


def tokenize(docs: list[str], tokenizer_dir: Path) -> list[np.ndarray]:
    """Token ids of every document, in order, in this process (small corpora, the unit tests)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return [np.asarray(ids, dtype=np.int32) for ids in tok(docs, add_special_tokens=False)["input_ids"]]


def tokenize_on_ray(docs: list[str], tokenizer_dir: Path) -> list[np.ndarray]:
    """Token ids of every document, in order, tokenized in parallel by Ray Data."""
    import ray

    from raybiphase.raycluster import ensure_ray

    ensure_ray()

    def encode(batch: pa.Table) -> pa.Table:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        ids = tok(batch.column("text").to_pylist(), add_special_tokens=False)["input_ids"]
        return pa.table({"doc": batch.column("doc"), "ids": pa.array(ids, type=pa.list_(pa.int32()))})

    ds = ray.data.from_items([{"doc": i, "text": t} for i, t in enumerate(docs)])
    ds = ds.map_batches(encode, batch_size=2048, batch_format="pyarrow")
    rows = sorted(ds.take_all(), key=lambda row: row["doc"])
    return [np.asarray(row["ids"], dtype=np.int32) for row in rows]


def pack(doc_ids: Iterable[np.ndarray], seq_len: int, bos: int, eos: int) -> Iterator[np.ndarray]:
    """`<bos> doc <eos>` streams cut into (n, seq_len) arrays; long documents continue across blocks."""
    buffer: list[np.ndarray] = []
    held = 0
    for ids in doc_ids:
        buffer.append(np.concatenate([[bos], ids, [eos]]).astype(np.int32))
        held += len(buffer[-1])
        if held >= seq_len:
            flat = np.concatenate(buffer)
            n = len(flat) // seq_len
            yield flat[: n * seq_len].reshape(n, seq_len)
            buffer, held = [flat[n * seq_len :]], len(flat) - n * seq_len


def write_blocks(path: Path, blocks: np.ndarray) -> dict:
    seq_len = blocks.shape[1]
    values = pa.array(blocks.reshape(-1), type=pa.int32())
    column = pa.FixedSizeListArray.from_arrays(values, seq_len)
    pq.write_table(pa.table({"input_ids": column}), path, write_page_checksum=True)
    return {"file": path.name, "rows": int(blocks.shape[0]), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def prepare(data: DataConfig, *, quiet: bool = False, on_ray: bool = True) -> Path:
    """Make the shards for `data` unless they exist; returns the dataset directory. `on_ray=False` tokenizes in
    this process: the same shards, byte for byte."""
    out = dataset_dir(data)
    if (out / "manifest.json").exists():
        return out
    say = (lambda *a: None) if quiet else print
    started = time.time()
    docs = read_documents(data)
    say(f"prepare: {len(docs):,} documents from {data.source}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tok = build_tokenizer(data, docs, tmp / "tokenizer")
        ids = (tokenize_on_ray if on_ray else tokenize)(docs, tmp / "tokenizer")
        blocks = np.concatenate(list(pack(ids, data.seq_len, tok.bos_token_id, tok.eos_token_id)) or [np.zeros((0, data.seq_len), np.int32)])
        if len(blocks) <= data.val_blocks:
            raise UserError(f"data.source: {len(blocks)} blocks of {data.seq_len} tokens is too few for data.val_blocks={data.val_blocks}")
        # validation first: the leading blocks hold whole documents of the shuffled order (one may straddle the edge)
        val, train = blocks[: data.val_blocks], blocks[data.val_blocks :]
        shards = [
            write_blocks(tmp / f"train-{i:05d}.parquet", train[start : start + data.shard_rows])
            for i, start in enumerate(range(0, len(train), data.shard_rows))
        ]
        manifest = {
            "format": FORMAT_VERSION,
            "fingerprint": fingerprint(data),
            "source": data.source,
            "seq_len": data.seq_len,
            "tokenizer_fingerprint": tokenizer_fingerprint(tmp / "tokenizer"),
            "vocab_size": len(tok),
            "special_ids": {k: getattr(tok, k + "_id") for k in ("bos_token", "eos_token", "pad_token", "mask_token")},
            "documents": len(docs),
            "tokens": int(sum(len(x) + 2 for x in ids)),
            "train_rows": int(len(train)),
            "shards": shards,
            "val": write_blocks(tmp / "val.parquet", val),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        if out.exists():  # a stale directory without a manifest: an interrupted earlier attempt
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"prepare: {len(train):,} train + {len(val)} val blocks of {data.seq_len} tokens in {time.time() - started:.0f}s -> {out}")
    return out


def main() -> int:
    parser = config_parser("raybiphase prepare", "Tokenize and pack the corpus of a config into Parquet shards.")
    args = parser.parse_args()
    cfg = load(SweepSpec, args.config, args.overrides)
    prepare(cfg.data)
    return 0


if __name__ == "__main__":
    run_main(main)
