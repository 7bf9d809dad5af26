"""The source cut into pieces that are read independently (raybiphase.data.prepare writes one task per piece).

A piece is a slice of the offline corpus (SQuAD *train* contexts and the pretraining part of the Wikipedia leads,
capped at `data.max_documents`, shuffled once with a fixed seed), a range of row groups of a Parquet file holding
about `data.piece_documents` rows, a whole .jsonl or .txt file (on disk or in a bucket), or one shard of an HF
dataset read in streaming mode. Planning reads file listings and Parquet footers, and of documents only the first
JSONL file's first (a source in another format fails before Ray starts) and the offline corpus, which ships with the
package. A capped non-Parquet corpus is one "stream" piece read in order.

    pieces = plan_pieces(data)
    for text in piece_texts(data, pieces[0]): ...
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from raybiphase import storage
from raybiphase.config import DataConfig
from raybiphase.data import revisions, sources
from raybiphase.errors import UserError

OFFLINE_SEED = 1234  # the offline corpus's document order


@dataclass(frozen=True)
class Piece:
    """An independently readable part of the source."""

    index: int
    kind: str  # "offline" | "file" | "hf" | "stream" (the whole source in order, up to `limit` documents)
    location: str = ""  # file: the file; hf: the dataset id
    start: int = 0  # offline: first document; file: first Parquet row group; hf: shard index
    stop: int = 0  # offline: end document; file: end row group (0: the whole file); hf: number of shards
    limit: int = 0  # stream: documents to read


def _source_kind(source: str) -> str:
    if source == "offline":
        return "offline"
    if storage.is_uri(source) or Path(source).expanduser().exists():
        return "files"
    if "/" in source and not source.startswith((".", "/")):
        return "hf"
    raise UserError(f"data.source: {source!r} is not 'offline', an existing path, a bucket URI or a dataset id")


@functools.lru_cache(maxsize=2)
def offline_documents(max_documents: int) -> tuple[str, ...]:
    """The offline corpus, capped at max_documents (0: all), in a fixed shuffled order."""

    docs = [d for d in sources.pretraining_texts() if d.strip()]
    docs = docs[:max_documents] if max_documents else docs
    order = np.random.default_rng(OFFLINE_SEED).permutation(len(docs))
    return tuple(docs[i] for i in order)


def source_revision(data: DataConfig) -> str | None:
    """The commit an HF dataset source is read at (data.hf_revision, checked against its snapshot under
    RAYBIPHASE_DATASETS_DIR, else the snapshot's own: `revisions.checked_commit`), the branch name or None when
    unpinned (a warning says so); None for the offline corpus and files."""
    if _source_kind(data.source) != "hf":
        return None
    root = revisions.snapshot_root()
    path = os.path.join(root, data.source) if root else None  # a missing snapshot: said where it is loaded
    return revisions.checked_commit(data.source, path if path and os.path.isdir(path) else None, data.hf_revision,
                                    key="data.hf_revision")


def _hf_stream(data: DataConfig):
    import datasets

    root = revisions.snapshot_root()
    where = {"path": os.path.join(root, data.source)} if root else {"path": data.source, "revision": data.hf_revision}
    try:
        return datasets.load_dataset(**where, name=data.hf_config, split="train", streaming=True)
    except Exception as e:  # the datasets library raises many types; report one line
        at = f" at revision {data.hf_revision}" if data.hf_revision else ""
        raise UserError(f"data.source: could not load {data.source} ({data.hf_config}){at}: "
                        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def plan_pieces(data: DataConfig) -> list[Piece]:
    """The pieces of the source, in source order; reads file listings and Parquet footers (a file without a `text`
    column fails here), and of documents only the first JSONL file's first and the offline corpus, which ships with
    the package."""

    kind = _source_kind(data.source)
    per = data.piece_documents
    if kind == "offline":
        n = len(offline_documents(data.max_documents))
        return [Piece(i, "offline", start=s, stop=min(n, s + per)) for i, s in enumerate(range(0, n, per))]
    if kind == "hf":
        source_revision(data)  # a revision its snapshot is not at fails here, and an unpinned read is warned of
        stream = _hf_stream(data)  # an id, config or revision the hub does not have fails here, before Ray starts
        if data.max_documents:  # a capped corpus is small: read it in order
            return [Piece(0, "stream", data.source, limit=data.max_documents)]
        shards = stream.num_shards
        return [Piece(i, "hf", data.source, start=i, stop=shards) for i in range(shards)]
    try:
        files = sources.text_files(data.source)
    except sources.SourceError as err:
        raise UserError(f"data.source: {err}") from None
    if jsonl := [f for f in files if f.endswith(".jsonl")]:
        _first_document(jsonl[0])  # a source in another format fails now, not in a piece once Ray has started
    if data.max_documents and not all(f.endswith(".parquet") for f in files):
        return [Piece(0, "stream", data.source, limit=data.max_documents)]
    pieces: list[Piece] = []
    remaining = data.max_documents or None
    for file in files:
        if not file.endswith(".parquet"):
            pieces.append(Piece(len(pieces), "file", file))
            continue
        fs, path = storage.filesystem(file)
        with fs.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            meta, columns = parquet.metadata, parquet.schema_arrow.names
        if "text" not in columns:
            raise UserError(f"data.source: {file} has no 'text' column; columns: {', '.join(columns)}")
        first, rows = 0, 0
        for group in range(meta.num_row_groups):
            rows += meta.row_group(group).num_rows
            last = group + 1 == meta.num_row_groups
            capped = remaining is not None and rows >= remaining
            if rows >= per or last or capped:
                pieces.append(Piece(len(pieces), "file", file, start=first, stop=group + 1,
                                    limit=remaining if capped else 0))
                if remaining is not None:
                    remaining -= min(rows, remaining)
                    if remaining == 0:
                        return pieces
                first, rows = group + 1, 0
    return pieces


def _first_document(file: str) -> None:
    try:
        next(sources.file_texts(file), None)
    except sources.SourceError as err:
        raise UserError(f"data.source: {err}") from None


def piece_texts(data: DataConfig, piece: Piece) -> Iterator[str]:
    """The non-blank documents of a piece, in source order."""

    if piece.kind == "offline":
        yield from offline_documents(data.max_documents)[piece.start:piece.stop]
        return
    if piece.kind == "file":
        groups = range(piece.start, piece.stop) if piece.stop else None
        texts: Iterable[str] = sources.file_texts(piece.location, row_groups=groups)
    elif piece.kind == "hf":
        rows = _hf_stream(data).shard(num_shards=piece.stop, index=piece.start)
        texts = (row[data.text_field] for row in rows if isinstance(row.get(data.text_field), str))
    elif _source_kind(data.source) == "hf":
        texts = sources.hf_texts(data.source, "train", data.text_field, config_name=data.hf_config,
                                 revision=data.hf_revision)
    else:
        texts = sources.corpus_texts(data.source)
    count = 0
    for text in texts:
        if text.strip():
            yield text
            count += 1
            if piece.limit and count >= piece.limit:
                return


def windows(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    window: list[str] = []
    for text in texts:
        window.append(text)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window
