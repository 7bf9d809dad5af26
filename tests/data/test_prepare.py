"""Corpus preparation streams piece by piece: to a folder or a bucket, resumable, the same bytes either way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raybiphase import storage
from raybiphase.config import ConfigError, DataConfig
from raybiphase.data import pieces as src
from raybiphase.data import prepare as prep
from raybiphase.data.stream import open_dataset, read_samples
from raybiphase.errors import UserError

SMALL = {"max_documents": 1200, "vocab_size": 512, "seq_len": 64, "val_blocks": 8, "shard_rows": 128,
         "piece_documents": 300}


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def reference(offline_cache, tmp_path_factory):
    """The small corpus prepared in one uninterrupted in-process run."""
    data = DataConfig(**SMALL, dir=str(tmp_path_factory.mktemp("reference") / "data"))
    return data, prep.prepare(data, quiet=True, on_ray=False)


def test_pieces_cover_the_corpus_once_in_order(reference):
    data, _ = reference
    pieces = src.plan_pieces(data)
    assert [p.index for p in pieces] == [0, 1, 2, 3]
    texts = [t for p in pieces for t in src.piece_texts(data, p)]
    assert texts == list(src.offline_documents(data.max_documents))
    assert len(texts) == data.max_documents


def test_manifest_lists_every_piece_shard_and_counts(reference):
    data, location = reference
    meta = json.loads((Path(location) / "manifest.json").read_text())
    assert meta["pieces"] == 4 and meta["documents"] == data.max_documents
    assert [s["file"] for s in meta["shards"]] == sorted(s["file"] for s in meta["shards"])
    assert {s["file"][:11] for s in meta["shards"]} == {f"train-{i:05d}" for i in range(4)}
    assert all(s["rows"] <= data.shard_rows for s in meta["shards"]) and meta["val"]["rows"] == data.val_blocks
    manifest = open_dataset(location, seq_len=data.seq_len)
    blocks = read_samples(manifest, np.arange(manifest.train_rows), seed=0)
    # every token of the corpus is in a block, but the last partial block of each piece
    assert meta["tokens"] - 4 * data.seq_len < blocks.size + data.val_blocks * data.seq_len <= meta["tokens"]


def test_an_interrupted_preparation_redoes_only_unfinished_pieces(reference, tmp_path, monkeypatch):
    data, location = reference
    data = DataConfig(**SMALL, dir=str(tmp_path / "data"))
    real = prep.write_piece
    calls = []

    def dies_at_piece_2(data, out, piece, *rest):
        if piece.index == 2:
            raise KeyboardInterrupt  # the machine went away
        calls.append(piece.index)
        return real(data, out, piece, *rest)

    monkeypatch.setattr(prep, "write_piece", dies_at_piece_2)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(data, quiet=True, on_ray=False)
    assert calls == [0, 1] and not (tmp_path / "data" / "manifest.json").exists()

    def counted(data, out, piece, *rest):
        calls.append(piece.index)
        return real(data, out, piece, *rest)

    monkeypatch.setattr(prep, "write_piece", counted)
    prep.prepare(data, quiet=True, on_ray=False)
    assert calls == [0, 1, 2, 3]  # pieces 0 and 1 were not redone
    assert files_of(tmp_path / "data") == files_of(Path(location))


@pytest.mark.slow  # a real S3 server round trip of many files: seconds
def test_a_bucket_holds_the_same_dataset_and_trains_from_it(reference, s3_bucket):
    data, location = reference
    uri = f"{s3_bucket}/shards/small"
    assert prep.prepare(DataConfig(**SMALL, dir=uri), quiet=True, on_ray=False) == uri
    local = files_of(Path(location))
    for name, body in local.items():
        assert storage.read_bytes(storage.join(uri, name)) == body, name
    remote = open_dataset(uri, seq_len=data.seq_len)
    here = open_dataset(location, seq_len=data.seq_len)
    ids = np.arange(0, remote.train_rows, 7)
    assert np.array_equal(read_samples(remote, ids, seed=3), read_samples(here, ids, seed=3))
    assert (remote.local_tokenizer() / "tokenizer.json").read_bytes() == local["tokenizer/tokenizer.json"]


def test_a_sweep_on_a_bucket_keeps_its_shards_there(s3_bucket):
    data = DataConfig(**SMALL)
    assert prep.dataset_location(data, f"{s3_bucket}/results") == f"{s3_bucket}/results/shards/{prep.fingerprint(data)}"
    assert not storage.is_uri(prep.dataset_location(data, "/tmp/results"))


def test_parquet_pieces_follow_row_groups_and_the_document_cap(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [f"document number {i} " * 3 for i in range(250)]
    pq.write_table(pa.table({"text": texts[:150]}), corpus / "a.parquet", row_group_size=40)
    pq.write_table(pa.table({"text": texts[150:]}), corpus / "b.parquet", row_group_size=40)
    data = DataConfig(source=str(corpus), piece_documents=70)
    pieces = src.plan_pieces(data)
    assert [(Path(p.location).name, p.start, p.stop) for p in pieces] == [
        ("a.parquet", 0, 2), ("a.parquet", 2, 4), ("b.parquet", 0, 2), ("b.parquet", 2, 3)]
    assert [t for p in pieces for t in src.piece_texts(data, p)] == texts
    capped = DataConfig(source=str(corpus), piece_documents=70, max_documents=170)
    assert [t for p in src.plan_pieces(capped) for t in src.piece_texts(capped, p)] == texts[:170]


def test_an_hf_dataset_streams_one_piece_per_shard(tmp_path, monkeypatch):
    """The production loader (`datasets.load_dataset(..., streaming=True)`) on files in the hub's layout."""
    import datasets

    repo = tmp_path / "org--corpus"
    (repo / "data").mkdir(parents=True)
    texts = [f"a streamed document {i}" for i in range(60)]
    for shard in range(3):
        pq.write_table(pa.table({"text": texts[shard * 20:(shard + 1) * 20], "id": list(range(20))}),
                       repo / "data" / f"train-{shard:05d}-of-00003.parquet")
    monkeypatch.setattr(src, "_hf_stream", lambda data: datasets.load_dataset(str(repo), split="train", streaming=True))
    data = DataConfig(source="org/corpus")
    pieces = src.plan_pieces(data)
    assert [(p.kind, p.start, p.stop) for p in pieces] == [("hf", 0, 3), ("hf", 1, 3), ("hf", 2, 3)]
    assert sorted(t for p in pieces for t in src.piece_texts(data, p)) == sorted(texts)


def test_bad_locations_are_named_before_anything_is_written(s3_bucket, tmp_path, offline_cache):
    with pytest.raises(ConfigError, match="data.dir: unknown URI scheme 'ftp'"):
        DataConfig(dir="ftp://host/shards")
    with pytest.raises(UserError, match="data.dir: cannot write to s3://no-such-bucket/shards"):
        prep.prepare(DataConfig(**SMALL, dir="s3://no-such-bucket/shards"), quiet=True, on_ray=False)
    with pytest.raises(UserError, match="data.source: no such file or folder: s3://raybiphase-test/nothing"):
        prep.prepare(DataConfig(**SMALL, source=f"{s3_bucket}/nothing", dir=str(tmp_path / "d")), quiet=True)
    assert not (tmp_path / "d").exists()


def test_too_small_a_corpus_leaves_nothing_behind(tmp_path, offline_cache):
    data = DataConfig(**{**SMALL, "max_documents": 20, "val_blocks": 400}, dir=str(tmp_path / "d"))
    with pytest.raises(UserError, match="too few for data.val_blocks=400"):
        prep.prepare(data, quiet=True, on_ray=False)
    assert not (tmp_path / "d").exists()


def test_a_llama3_tokenizer_keeps_its_vocabulary_and_masks_with_its_reserved_token(tmp_path):
    """The paper masks with Llama-3's reserved id 128002 and keeps 128,256 ids: no new token is added (a tokenizer
    of Llama-3's layout in small: learned ids, then begin/end of text and reserved tokens)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["a small corpus of plain words"] * 20, vocab_size=300, min_frequency=1)
    bpe.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(4)])
    folder = tmp_path / "llama3-like"
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|begin_of_text|>",
                            eos_token="<|end_of_text|>").save_pretrained(str(folder))
    size = len(PreTrainedTokenizerFast.from_pretrained(str(folder)))

    tok = prep.build_tokenizer(DataConfig(tokenizer=str(folder)), [], tmp_path / "out")
    assert len(tok) == size  # nothing added
    assert tok.mask_token == "<|reserved_special_token_0|>" and tok.mask_token_id == tok.eos_token_id + 1
    assert tok.pad_token_id == tok.eos_token_id  # Llama-3's convention


def test_shards_of_an_earlier_offline_corpus_are_not_reused(monkeypatch):
    """The offline corpus changed what it holds (held-out evaluation text); its version is in the shards'
    fingerprint, so a cache prepared from the earlier corpus is never found again. Other sources ignore it."""
    from raybiphase.config import DataConfig
    from raybiphase.data import sources
    from raybiphase.data.prepare import fingerprint

    offline, hub = DataConfig(), DataConfig(source="HuggingFaceFW/fineweb-edu", hf_config="sample-350BT")
    before = fingerprint(offline), fingerprint(hub)
    monkeypatch.setattr(sources, "OFFLINE_CORPUS_VERSION", sources.OFFLINE_CORPUS_VERSION + 1)
    assert fingerprint(offline) != before[0] and fingerprint(hub) == before[1]
    assert fingerprint(DataConfig(max_epochs=3)) == fingerprint(offline)  # passes allowed do not change the shards


def test_shards_at_a_given_dir_made_with_other_settings_are_refused_naming_the_setting(reference):
    """A run whose data settings differ from those its `data.dir` shards were made with would train on a corpus,
    vocabulary or length its config does not say: check_data and prepare refuse it, naming the setting."""
    data, folder = reference
    assert prep.check_data(data) == str(folder)  # made as asked: found
    for key, value in (("vocab_size", 1024), ("max_documents", 600)):
        other = DataConfig(**{**SMALL, key: value}, dir=str(folder))
        with pytest.raises(UserError, match=rf"^data\.{key}: the shards at .* were made with \d+, unlike this config \({value}\)"):
            prep.check_data(other)
        with pytest.raises(UserError, match=rf"^data\.{key}:"):
            prep.prepare(other, quiet=True, on_ray=False)
    passes = DataConfig(**SMALL, dir=str(folder), max_epochs=2)
    assert prep.check_data(passes) == str(folder)  # the passes a run may make do not change the shards


def test_shards_whose_manifest_predates_the_recorded_settings_are_refused_by_fingerprint(tmp_path):
    from raybiphase.data.fingerprint import check_made_as_asked

    data = DataConfig(**SMALL, dir=str(tmp_path))
    check_made_as_asked(data, {"fingerprint": prep.fingerprint(data)}, str(tmp_path))  # the same: nothing said
    with pytest.raises(UserError, match=r"^data\.dir: .* other data settings than this config's"):
        check_made_as_asked(data, {"fingerprint": "0" * 12}, str(tmp_path))


def test_a_source_in_another_format_is_refused_before_anything_is_prepared(tmp_path):
    """A JSONL source whose first line is not a JSON object with a `text` field, or a Parquet file without a
    `text` column, is said by check_data (before Ray starts), not by a piece once preparation runs."""
    (tmp_path / "lines.jsonl").write_text("plain text, not JSON\n")
    (tmp_path / "fields.jsonl").write_text(json.dumps({"body": "a document"}) + "\n")
    (tmp_path / "numbers.jsonl").write_text(json.dumps({"text": 3}) + "\n")
    pq.write_table(pa.table({"body": ["a document"]}), tmp_path / "columns.parquet")
    cases = {"lines.jsonl": r"lines\.jsonl:1: not a JSON object with a 'text' field",
             "fields.jsonl": r"fields\.jsonl:1: not a JSON object with a 'text' field",
             "numbers.jsonl": r"numbers\.jsonl:1: 'text' is not a string but int 3",
             "columns.parquet": r"columns\.parquet has no 'text' column; columns: body"}
    for name, message in cases.items():
        for capped in (0, 100):  # a capped source is read as one stream: checked all the same
            data = DataConfig(**{**SMALL, "max_documents": capped}, source=str(tmp_path / name),
                              dir=str(tmp_path / "shards"))
            with pytest.raises(UserError, match=rf"^data\.source: .*{message}"):
                prep.check_data(data)
    assert not (tmp_path / "shards").exists()


def test_a_source_error_raised_in_a_ray_task_reads_as_one_line_naming_the_setting():
    """Ray wraps a task's exception in one whose text is the traceback, the last line led by the class's dotted
    name; the error said is that line's message under the setting it concerns."""
    from raybiphase.data.sources import SourceError

    class TaskError(SourceError):  # what Ray raises: a subclass of the task's exception, its text the traceback
        def __str__(self):
            return ("ray::PieceTask() (pid=1)\n  File \"prepare.py\", line 1\n"
                    "raybiphase.data.sources.SourceError: /corpus/a.jsonl:2: not a JSON object with a 'text' field")

    wrapper = RuntimeError("Ray Data's own wrapper")
    wrapper.__cause__ = TaskError()
    err = prep._user_error(wrapper)
    assert str(err) == "data.source: /corpus/a.jsonl:2: not a JSON object with a 'text' field"
    assert str(prep._user_error(UserError("data.tokenizer: no such folder"))) == "data.tokenizer: no such folder"
    assert prep._user_error(RuntimeError("a bug, not bad input")) is None
