"""The pretraining corpus read from an HF dataset at a named commit: a hub-layout snapshot under
RAYBIPHASE_DATASETS_DIR that records its commit, as `hf download --revision --local-dir` leaves it. No network, no
Ray."""

from __future__ import annotations

import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raybiphase.config import DataConfig, RunConfig
from raybiphase.config.identity import weights_settings
from raybiphase.data.fingerprint import fingerprint, shard_settings
from raybiphase.data.pieces import piece_texts, plan_pieces, source_revision
from raybiphase.data.revisions import DATASETS_DIR_ENV, UnpinnedDatasetWarning
from raybiphase.errors import UserError
from tests.finetune.test_pinned_data import COMMIT, OTHER, record_commit

CORPUS = "test-org/corpus"
DOCUMENTS = [f"document {i} about the river and the town." for i in range(12)]


@pytest.fixture
def corpus_at(tmp_path, monkeypatch):
    """A snapshot of CORPUS (one parquet file of `text`, the hub's data/ layout) downloaded at COMMIT."""
    repo = tmp_path / "hub" / CORPUS
    (repo / "data").mkdir(parents=True)
    pq.write_table(pa.table({"text": DOCUMENTS}), repo / "data" / "train-00000-of-00001.parquet")
    record_commit(repo, COMMIT)
    monkeypatch.setenv(DATASETS_DIR_ENV, str(tmp_path / "hub"))
    return repo


def test_a_pinned_corpus_is_read_at_its_commit_without_a_warning(corpus_at):
    data = DataConfig(source=CORPUS, hf_revision=COMMIT, max_documents=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnpinnedDatasetWarning)
        pieces = plan_pieces(data)
        assert source_revision(data) == COMMIT
    assert list(piece_texts(data, pieces[0])) == DOCUMENTS[:5]


def test_a_revision_the_snapshot_is_not_at_is_one_line_and_an_unpinned_read_a_warning(corpus_at):
    with pytest.raises(UserError) as err:
        plan_pieces(DataConfig(source=CORPUS, hf_revision=OTHER, max_documents=5))
    assert f"data.hf_revision: revision {OTHER} of {CORPUS}" in str(err.value) and "\n" not in str(err.value)
    (corpus_at / ".cache").rename(corpus_at.parent / "moved")  # a snapshot that records no commit
    with pytest.warns(UnpinnedDatasetWarning, match=f"{CORPUS} is read unpinned"):
        assert source_revision(DataConfig(source=CORPUS)) is None


def test_the_revision_enters_the_shards_and_the_runs_identity_only_when_named():
    assert "hf_revision" not in shard_settings(DataConfig()) and "hf_revision" not in weights_settings(RunConfig())["data"]
    pinned = DataConfig(source=CORPUS, hf_revision=COMMIT)
    assert fingerprint(pinned) != fingerprint(DataConfig(source=CORPUS))
    assert source_revision(DataConfig()) is None  # the offline corpus ships with the package


def test_the_prepared_manifest_names_the_commit_the_corpus_was_read_at(tmp_path, monkeypatch):
    import json

    from raybiphase.data.prepare import prepare
    from raybiphase.data.stream import MANIFEST

    repo = tmp_path / "hub" / CORPUS  # a snapshot downloaded at COMMIT, in the hub's data/ layout
    (repo / "data").mkdir(parents=True)
    documents = [f"document {i} tells of gardens, rivers and markets in town number {i % 7}" for i in range(240)]
    pq.write_table(pa.table({"text": documents}), repo / "data" / "train-00000-of-00001.parquet")
    record_commit(repo, COMMIT)
    monkeypatch.setenv(DATASETS_DIR_ENV, str(tmp_path / "hub"))
    data = DataConfig(source=CORPUS, hf_revision=COMMIT, vocab_size=512, seq_len=32, val_blocks=2, shard_rows=64,
                      piece_documents=60, decontaminate=False, dir=str(tmp_path / "shards"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnpinnedDatasetWarning)
        out = prepare(data, quiet=True, on_ray=False)
    manifest = json.loads((tmp_path / "shards" / MANIFEST).read_text())
    assert out == str(tmp_path / "shards") and manifest["source_revision"] == COMMIT and manifest["source"] == CORPUS
