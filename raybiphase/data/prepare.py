"""Corpus -> tokenizer -> packed Parquet shards + manifest, streamed: `raybiphase prepare CONFIG [--set k=v]`.

The source is cut into pieces that are read independently (raybiphase.data.pieces): slices of the offline corpus (SQuAD *train* contexts
and the pretraining part of the Wikipedia leads, shuffled once with a fixed seed), row-group ranges of Parquet files,
whole .jsonl/.txt files (on disk or in a bucket), or the shards of an HF dataset read in streaming mode. One Ray
Data task per piece (`map_batches`) reads it in windows of `data.piece_documents` documents, shuffles each window
(seeded by the piece), tokenizes it, wraps every document as `<bos> doc <eos>`, packs the stream into blocks of
`data.seq_len` tokens (a long document continues in the next block; a piece drops only its last partial block) and
writes the blocks straight to `data.dir` as shards of at most `data.shard_rows` rows. The driver holds one small
record per piece, never a document, so its memory does not grow with the corpus.

Layout of `data.dir` (a folder or a bucket URI):
    tokenizer/                    HF fast tokenizer with bos, eos, pad and mask tokens (written first)
    train-PPPPP-SSSS.parquet      column `input_ids`: fixed_size_list<int32>[seq_len]; piece P, shard S
    val.parquet                   the first `data.val_blocks` blocks of piece 0 (whole documents, held out)
    held_out.npz                  the decontamination index (raybiphase.data.decontam), when data.decontam_tasks
                                  holds tasks out: a document overlapping one never reaches a shard (made first)
    pieces/PPPPP.json             a finished piece: its shards, rows, bytes, sha256, documents, tokens
    manifest.json                 written last, from the piece records: a dataset without it is unfinished
A rerun finds the manifest and does nothing, or finds the finished pieces of an interrupted run and does only the
others. The in-process path (`on_ray=False`) runs the same piece function: the same shards, byte for byte.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raybiphase import storage, transfer
from raybiphase.config import DataConfig
from raybiphase.data import decontam
from raybiphase.data.assets import cache_dir
from raybiphase.data.fingerprint import check_made_as_asked, fingerprint, shard_settings
from raybiphase.data.pieces import Piece, piece_texts, plan_pieces, source_revision, windows
from raybiphase.data.revisions import UnpinnedDatasetWarning
from raybiphase.data.sources import SourceError
from raybiphase.data.stream import FORMAT_VERSION, MANIFEST, open_dataset
from raybiphase.errors import UserError
from raybiphase.raycluster import ensure_ray, quiet_data

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "mask_token": "<mask>"}
RESERVED_MASK = "<|reserved_special_token_0|>"  # Llama-3's first reserved id, the paper's mask token
SHUFFLE_SEED = 1234  # window order within a piece, seeded by (this, piece); fixed so shards are a pure function
TOKENIZER_DIR, PIECES_DIR, VAL_FILE = "tokenizer", "pieces", "val.parquet"


def dataset_location(data: DataConfig, storage_root: str | None = None) -> str:
    """`data.dir`; when empty, <sweep.storage>/shards/<fingerprint> for a sweep on a bucket (every node reads it),
    else this machine's cache."""
    if data.dir:
        return storage.absolute(data.dir)
    if storage_root and storage.is_uri(storage_root):
        return storage.join(storage_root, "shards", fingerprint(data))

    return str(cache_dir() / "shards" / fingerprint(data))


def shard_name(piece: int, shard: int) -> str:
    return f"train-{piece:05d}-{shard:04d}.parquet"


# ------------------------------------------------------------------------------------------------- tokenizer


def tokenizer_folder(data: DataConfig) -> Path:
    """The folder of a given (not trained) tokenizer; a UserError when it does not exist."""
    path = Path(data.tokenizer).expanduser()
    if not path.exists():
        raise UserError(f"data.tokenizer: {data.tokenizer!r} is neither 'train-bpe' nor an existing folder")
    return path


def build_tokenizer(data: DataConfig, docs: list[str], out_dir: Path):
    """Train a byte-level BPE on `docs`, or load the given tokenizer; either way it has bos/eos/pad/mask."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if data.tokenizer == "train-bpe":
        from tokenizers import ByteLevelBPETokenizer

        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(
            docs, vocab_size=data.vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS.values())
        )
        tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, **SPECIAL_TOKENS)
    else:
        tok = AutoTokenizer.from_pretrained(str(tokenizer_folder(data)))
        missing = {k: v for k, v in SPECIAL_TOKENS.items() if getattr(tok, k) is None}
        if "pad_token" in missing and tok.eos_token is not None:  # Llama-3 convention: pad = eos
            tok.pad_token = tok.eos_token
            missing.pop("pad_token")
        if "mask_token" in missing and RESERVED_MASK in tok.get_vocab():  # Llama-3 (the paper): id 128002, no new id
            tok.mask_token = RESERVED_MASK
            missing.pop("mask_token")
        if missing:
            tok.add_special_tokens(missing)
    tok.save_pretrained(str(out_dir))
    return tok


def tokenizer_fingerprint(tokenizer_dir: str) -> str:
    digest = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = storage.join(tokenizer_dir, name)
        if storage.is_file(path):
            digest.update(storage.read_bytes(path))
    return digest.hexdigest()[:16]


def make_tokenizer(data: DataConfig, pieces: list[Piece], location: str, held_out: str = "") -> str:
    """Build the tokenizer and store it at `location`; returns its fingerprint. 'train-bpe' learns from the first
    `data.tokenizer_documents` documents of the source that decontamination keeps (`held_out`: the index's digest,
    stored beside the tokenizer's folder)."""
    wanted = data.tokenizer_documents if data.tokenizer == "train-bpe" else 1
    held = _held_out(storage.parent(location), held_out)
    docs: list[str] = []
    for piece in pieces:
        for text in piece_texts(data, piece):
            if held is not None and held.overlaps([text])[0]:
                continue
            docs.append(text)
            if len(docs) >= wanted:
                break
        if len(docs) >= wanted:
            break
    if not docs:
        raise UserError(f"data.source: {data.source!r} yielded no documents (empty corpus)")
    with tempfile.TemporaryDirectory() as tmp:
        build_tokenizer(data, docs, Path(tmp))
        transfer.upload(Path(tmp), location)
    return tokenizer_fingerprint(location)


def ensure_tokenizer(data: DataConfig, pieces: list[Piece], out: str, on_ray: bool, held_out: str = "") -> str:
    """The tokenizer under `out`, made now (in a Ray task: the driver never holds the sample nor imports
    transformers) unless an interrupted earlier run left it; returns its fingerprint."""
    location = storage.join(out, TOKENIZER_DIR)
    if storage.is_file(storage.join(location, "tokenizer.json")):
        return tokenizer_fingerprint(location)
    return _in_task(on_ray, make_tokenizer, data, pieces, location, held_out)


def ensure_held_out(data: DataConfig, out: str, texts: decontam.EvaluationTexts | None, on_ray: bool) -> str:
    """The digest of the evaluation index under `out` ("" when data holds nothing out), built now from `texts` (in
    a Ray task: the driver never holds the tasks' text) unless an interrupted earlier run left it."""
    settings, location = data.decontamination(), storage.join(out, decontam.HELD_OUT_FILE)
    if not settings:
        return ""
    if storage.is_file(location):
        return decontam.held_out_digest(location)
    if texts is None:
        raise UserError(f"data.decontam_tasks: decontaminating against {', '.join(settings['tasks'])} needs their "
                        "evaluation text; prepare this data with `raybiphase prepare` or a sweep")
    return _in_task(on_ray, decontam.write_held_out, settings["tasks"], settings["ngram"], texts, location)


def _in_task(on_ray: bool, function, *args):
    """`function(*args)` here, or in a Ray task of one CPU (the driver never holds what it reads); a UserError
    raised there comes back as one line."""
    if not on_ray:
        return function(*args)
    import ray

    try:
        return ray.get(ray.remote(num_cpus=1)(function).remote(*args))
    except Exception as err:
        raise (_user_error(err) or err) from None


def _held_out(out: str, digest: str) -> decontam.HeldOut | None:
    return decontam.load_held_out(storage.join(out, decontam.HELD_OUT_FILE), digest) if digest else None


@functools.lru_cache(maxsize=2)
def _load_tokenizer(location: str, version: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(transfer.local_copy(location, cache_dir(), version=version)))


# -------------------------------------------------------------------------------------- tokenize and pack


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


def write_blocks(location: str, blocks: np.ndarray) -> dict:
    """One shard: the blocks as a fixed-size-list column, written whole; its entry for the manifest."""
    seq_len = blocks.shape[1]
    column = pa.FixedSizeListArray.from_arrays(pa.array(blocks.reshape(-1), type=pa.int32()), seq_len)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"input_ids": column}), sink, write_page_checksum=True)
    body = sink.getvalue().to_pybytes()
    storage.write_bytes(location, body)
    return {"file": location.rsplit("/", 1)[-1], "rows": int(blocks.shape[0]), "bytes": len(body),
            "sha256": hashlib.sha256(body).hexdigest()}


class _Blocks:
    """Packed blocks waiting to be written."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.rows = 0

    def add(self, blocks: np.ndarray) -> None:
        self.parts.append(blocks)
        self.rows += len(blocks)

    def take(self, n: int) -> np.ndarray:
        flat = np.concatenate(self.parts)
        self.parts, self.rows = [flat[n:]], len(flat) - min(n, len(flat))
        return flat[:n]


def write_piece(data: DataConfig, out: str, piece: Piece, tokenizer_version: str, held_out: str = "") -> dict:
    """Read, shuffle, decontaminate, tokenize, pack and write one piece; then its record under pieces/, which marks
    it done. Decontamination drops documents after the shuffle, so the others keep their order: shards of data
    that overlaps nothing are the same bytes with or without it."""
    tok = _load_tokenizer(storage.join(out, TOKENIZER_DIR), tokenizer_version)
    held, dropped = _held_out(out, held_out), decontam.DropCounts()
    rng = np.random.default_rng([SHUFFLE_SEED, piece.index])
    counts = {"documents": 0, "tokens": 0}
    unigram = np.zeros(len(tok), dtype=np.int64)

    def token_ids() -> Iterator[np.ndarray]:
        for window in windows(piece_texts(data, piece), data.piece_documents):
            shuffled = [window[i] for i in rng.permutation(len(window))]
            encoded = tok(shuffled, add_special_tokens=False)["input_ids"]
            if held is not None:
                encoded = decontam.drop_overlapping(held, shuffled, encoded, dropped)
            counts["documents"] += len(encoded)
            counts["tokens"] += sum(len(ids) + 2 for ids in encoded)
            if encoded:
                unigram[:] += np.bincount(np.concatenate([np.asarray(ids, dtype=np.int64) for ids in encoded]),
                                          minlength=len(unigram))[:len(unigram)]
            yield from (np.asarray(ids, dtype=np.int32) for ids in encoded)

    val_rows = data.val_blocks if piece.index == 0 else 0
    pending, shards, val = _Blocks(), [], None
    for blocks in pack(token_ids(), data.seq_len, tok.bos_token_id, tok.eos_token_id):
        pending.add(blocks)
        if val_rows and val is None:
            if pending.rows <= val_rows:
                continue
            val = write_blocks(storage.join(out, VAL_FILE), pending.take(val_rows))
        while pending.rows >= data.shard_rows:
            shards.append(write_blocks(storage.join(out, shard_name(piece.index, len(shards))),
                                       pending.take(data.shard_rows)))
    if pending.rows and (val is not None or not val_rows):
        shards.append(write_blocks(storage.join(out, shard_name(piece.index, len(shards))),
                                   pending.take(pending.rows)))
    specials = {k: getattr(tok, k + "_id") for k in ("bos_token", "eos_token", "pad_token", "mask_token")}
    buffer = io.BytesIO()
    np.save(buffer, unigram)
    storage.write_bytes(storage.join(out, PIECES_DIR, f"{piece.index:05d}.unigram.npy"), buffer.getvalue())
    record = {"piece": asdict(piece), "tokenizer_fingerprint": tokenizer_version, "vocab_size": len(tok),
              "special_ids": specials, **counts, "held_out": held_out, "dropped": held and dropped.as_record(),
              "held_blocks": pending.rows, "shards": shards, "val": val}
    storage.write_json(storage.join(out, PIECES_DIR, f"{piece.index:05d}.json"), record)
    return record


@dataclass(frozen=True)
class PieceTask:
    """`write_piece` as a Ray Data batch function: one piece (as JSON) in, its record (as JSON) out."""

    data: DataConfig
    out: str
    tokenizer_version: str
    held_out: str = ""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        records = [write_piece(self.data, self.out, Piece(**json.loads(p)), self.tokenizer_version, self.held_out)
                   for p in batch["piece"]]
        return {"record": np.array([json.dumps(r) for r in records], dtype=object)}


def _user_error(err: BaseException) -> UserError | None:
    """The UserError a Ray task raised, found in the chain of wrappers Ray Data puts around it."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, UserError):  # its message is the last line, after the class's dotted name
            line = re.sub(r"^(?:\w+\.)+\w*(?:Error|Exception): ", "", str(err).strip().splitlines()[-1])
            return UserError(f"data.source: {line}" if isinstance(err, SourceError) else line)
        err = getattr(err, "cause", None) or err.__cause__
    return None


def _records_on_ray(task: PieceTask, todo: list[Piece]) -> Iterator[dict]:
    import ray

    ensure_ray()
    quiet_data()
    ds = ray.data.from_items([{"piece": json.dumps(asdict(p))} for p in todo], override_num_blocks=len(todo))
    ds = ds.map_batches(task, batch_size=1, batch_format="numpy")
    try:
        for row in ds.iter_rows():
            yield json.loads(row["record"])
    except Exception as err:
        raise (_user_error(err) or err) from None


def _finished(out: str, tokenizer_version: str, held_out: str) -> dict[int, dict]:
    folder = storage.join(out, PIECES_DIR)
    records = (storage.read_json(storage.join(folder, name)) for name in sorted(storage.list_files(folder))
               if name.endswith(".json"))
    return {r["piece"]["index"]: r for r in records  # pieces made with this tokenizer and evaluation index
            if r and r["tokenizer_fingerprint"] == tokenizer_version and r.get("held_out", "") == held_out}


def unigram_entropy(out: str, pieces: list[Piece]) -> float | None:
    """Entropy (nats per token) of the corpus' token frequencies, from the pieces' counts (document text only,
    without bos/eos): the loss of a model that knows only how often each token occurs, the reference line a
    pretrained model's held-out loss should fall well below. None for pieces made before counts were kept."""
    total = None
    for piece in pieces:
        location = storage.join(out, PIECES_DIR, f"{piece.index:05d}.unigram.npy")
        if not storage.is_file(location):
            return None
        counts = np.load(io.BytesIO(storage.read_bytes(location)))
        total = counts if total is None else total + counts
    if total is None or not total.sum():
        return None
    p = total[total > 0] / total.sum()
    return float(-(p * np.log(p)).sum())


def _quietly(read, data: DataConfig):
    """`read(data)` without its unpinned-read warning: planning the pieces gave it already."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnpinnedDatasetWarning)
        return read(data)


def _manifest(data: DataConfig, pieces: list[Piece], records: dict[int, dict], version: str, out: str) -> dict:
    val = records[0]["val"] if records else None
    shards = [s for p in pieces for s in records[p.index]["shards"]]
    if val is None or val["rows"] < data.val_blocks or not shards:
        blocks = sum(r["held_blocks"] + sum(s["rows"] for s in r["shards"]) for r in records.values())
        raise UserError(f"data.source: {blocks + (val['rows'] if val else 0)} blocks of {data.seq_len} tokens is too "
                        f"few for data.val_blocks={data.val_blocks} and a training shard")
    return {
        "format": FORMAT_VERSION,
        "fingerprint": fingerprint(data),
        "settings": shard_settings(data),
        "source": data.source,
        "source_revision": _quietly(source_revision, data),
        "seq_len": data.seq_len,
        "tokenizer_fingerprint": version,
        "vocab_size": records[0]["vocab_size"],
        "special_ids": records[0]["special_ids"],
        "pieces": len(pieces),
        "documents": sum(r["documents"] for r in records.values()),
        "tokens": sum(r["tokens"] for r in records.values()),
        "train_rows": sum(s["rows"] for s in shards),
        "shards": shards,
        "val": val,
        "unigram_entropy": unigram_entropy(out, pieces),
        "decontamination": decontam.manifest_record(data, [r["dropped"] for r in records.values()]),
    }


def check_data(data: DataConfig, *, storage_root: str | None = None) -> str:
    """What a sweep or a run checks before Ray starts; returns the dataset's location. Prepared shards are read
    back as training will read them (open_dataset: a missing or corrupt shard, a corrupt manifest); otherwise the
    source must be readable (its pieces are planned), the tokenizer must exist, and data.dir must be writable."""
    out = dataset_location(data, storage_root)
    if storage.is_file(storage.join(out, MANIFEST)):
        open_dataset(out, seq_len=data.seq_len)
        check_made_as_asked(data, storage.read_json(storage.join(out, MANIFEST)), out)
        return out
    plan_pieces(data)
    if data.tokenizer != "train-bpe":
        tokenizer_folder(data)
    created = not storage.exists(out)
    storage.check_writable(out, "data.dir")
    if created:  # the probe's folder: prepare() tells a dataset it made from one it found by whether it exists
        storage.delete(out)
    return out


def prepare(data: DataConfig, *, quiet: bool = False, on_ray: bool = True, storage_root: str | None = None,
            evaluation_texts: decontam.EvaluationTexts | None = None) -> str:
    """Make the shards for `data` unless they exist; returns the dataset's location (a folder or a URI).
    `on_ray=False` runs the pieces in this process: the same shards, byte for byte. `evaluation_texts` gives the
    data.decontam_tasks' evaluation text (raybiphase.finetune.heldout.evaluation_texts; the data layer comes
    before the tasks): needed only when the data holds tasks out and is not prepared yet."""
    out = dataset_location(data, storage_root)
    if storage.is_file(storage.join(out, MANIFEST)):
        check_made_as_asked(data, storage.read_json(storage.join(out, MANIFEST)), out)
        return out
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    started = time.time()
    pieces = plan_pieces(data)
    created = not storage.exists(out)
    storage.check_writable(out, "data.dir")
    try:
        if on_ray:
            ensure_ray()
        held_out = ensure_held_out(data, out, evaluation_texts, on_ray)
        version = ensure_tokenizer(data, pieces, out, on_ray, held_out)
        records = _finished(out, version, held_out)
        todo = [p for p in pieces if p.index not in records]
        say(f"prepare: {data.source} in {len(pieces)} piece(s), {len(records)} already done -> {out}")
        if on_ray and todo:
            stream = _records_on_ray(PieceTask(data, out, version, held_out), todo)
        else:
            stream = (write_piece(data, out, piece, version, held_out) for piece in todo)
        for done, record in enumerate(stream, start=1):
            records[record["piece"]["index"]] = record
            say(f"prepare: piece {done}/{len(todo)}: {record['documents']:,} documents, {record['tokens']:,} tokens, "
                f"{time.time() - started:.0f}s")
        manifest = _manifest(data, pieces, records, version, out)
    except UserError:
        if created:  # nothing of use was made: leave no half-written dataset behind
            storage.delete(out)
        raise
    storage.write_json(storage.join(out, MANIFEST), manifest)
    rate = manifest["tokens"] / max(time.time() - started, 1e-9)
    say(f"prepare: {manifest['train_rows']:,} train + {manifest['val']['rows']} val blocks of {data.seq_len} tokens "
        f"from {manifest['documents']:,} documents in {time.time() - started:.0f}s ({rate:,.0f} tokens/s) -> {out}")
    if manifest["decontamination"]:
        say(f"prepare: {decontam.summary_line(manifest['decontamination'])}")
    return out
