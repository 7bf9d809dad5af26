"""Every location is a local path or a URI, served by one filesystem layer: the same calls work on a folder and on a
bucket (a real S3-compatible server on 127.0.0.1)."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from raybiphase import storage


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return f"{bucket}/{request.node.name.replace('[', '-').strip(']')}"


def test_json_documents_round_trip_and_replace_whole(root):
    location = storage.join(root, "runs", "seg", storage.HISTORY)
    assert storage.read_json(location) is None and not storage.exists(location)
    storage.write_json(location, [{"step": 1}])
    storage.write_json(location, [{"step": 1}, {"step": 2}])
    assert storage.read_json(location) == [{"step": 1}, {"step": 2}]
    assert storage.is_file(location) and storage.exists(storage.join(root, "runs"))


def test_sweep_paths_name_every_location_once(root):
    paths = storage.SweepPaths.of(root, "quickstart")
    checkpoint = paths.checkpoint("tiny-clm-0-20-abcd", 20)
    assert checkpoint == storage.join(root, "quickstart", "runs", "tiny-clm-0-20-abcd", "step-00000020")
    assert storage.meta_path(checkpoint).endswith("/step-00000020/meta.json")
    assert storage.hf_dir(checkpoint).endswith("/step-00000020/hf")
    assert paths.table(storage.FINETUNE_FILE) == storage.join(root, "quickstart", "finetune.parquet")
    assert not storage.is_checkpoint(checkpoint)
    storage.write_json(storage.meta_path(checkpoint), {"step": 20})
    assert storage.is_checkpoint(checkpoint)


def test_a_bucket_folder_is_copied_to_the_node_once(s3_bucket, tmp_path):
    folder = f"{s3_bucket}/copy-once/hf"
    for name, text in (("config.json", "{}"), ("sub/weights.bin", "abc")):
        storage.write_json(storage.join(folder, name), text)
    local = storage.local_copy(folder, tmp_path / "cache")
    assert (local / "config.json").read_text() == '"{}"' and (local / "sub" / "weights.bin").read_text() == '"abc"'
    fs, path = storage.filesystem(folder)
    fs.delete_dir(path)  # the second call does not download: it finds the copy
    assert storage.local_copy(folder, tmp_path / "cache") == local and (local / "config.json").is_file()
    assert not list((tmp_path / "cache" / "remote").glob(".*"))  # no staging folder left behind


def test_a_local_folder_is_used_in_place(tmp_path):
    assert storage.local_copy(tmp_path, tmp_path / "cache") == tmp_path
    assert storage.absolute("relative/dir").startswith("/") and storage.absolute("s3://b/x/") == "s3://b/x"
    assert isinstance(storage.filesystem("s3://b/x")[0], pafs.S3FileSystem)


@pytest.mark.slow  # a subprocess that imports the whole CLI: seconds
def test_a_sweep_to_a_missing_bucket_stops_with_one_line_before_any_work(s3_bucket, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "raybiphase", "sweep", "sweeps/quickstart.yaml",
                           "--set", "sweep.storage=s3://no-such-bucket/results"],
                          cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == ("error: sweep.storage: cannot reach s3://no-such-bucket/results: bucket "
                                            "s3://no-such-bucket does not exist")
    assert "pretraining:" not in proc.stdout  # nothing ran


def test_check_writable_names_the_setting(s3_bucket, tmp_path):
    from raybiphase.errors import UserError

    storage.check_writable(f"{s3_bucket}/probe-ok", "data.dir")
    assert storage.list_files(f"{s3_bucket}/probe-ok") == {}  # the probe is gone
    with pytest.raises(UserError, match="data.dir: cannot write to s3://no-such-bucket/x"):
        storage.check_writable("s3://no-such-bucket/x", "data.dir")
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="sweep.storage: cannot write to"):
        storage.check_writable(str(tmp_path / "file" / "below"), "sweep.storage")


def test_check_reachable_says_in_one_line_what_a_dry_run_cannot_reach(s3_bucket, monkeypatch, caplog):
    from raybiphase.errors import UserError

    storage.check_reachable(f"{s3_bucket}/not-yet-written", "sweep.storage")  # the bucket is there: fine
    with pytest.raises(UserError, match="^data.dir: cannot reach s3://no-such-bucket/x: bucket s3://no-such-bucket "
                                        "does not exist$"):
        storage.check_reachable("s3://no-such-bucket/x", "data.dir")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: fails within the short budget
    monkeypatch.setattr(storage, "RETRY_SECONDS", 0.2)
    with pytest.raises(UserError, match="^sweep.storage: cannot reach s3://raybiphase-test/x: .*connect"):
        storage.check_reachable(f"{s3_bucket}/x", "sweep.storage")
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]  # no retry lines before the error


def test_a_sweeps_outage_budget_is_what_it_and_its_ray_workers_wait_and_ends_with_it(tmp_path, monkeypatch):
    """sweep.storage_outage_s bounds the driver's waits and goes to every Ray worker with the environment Ray
    starts with (the sweep starts Ray inside it); the lines name it. Outside a sweep RAYBIPHASE_STORAGE_RETRY_S
    decides again. It must be positive."""
    import io

    from raybiphase.config import ConfigError, SweepSpec, from_dict
    from raybiphase.errors import UserError
    from raybiphase.outages import OUTAGE_ENV
    from raybiphase.raycluster import worker_env
    from raybiphase.sweep import driver
    from raybiphase.telemetry.console import Console
    from tests.conftest import TINY_BASE

    monkeypatch.delenv("RAYBIPHASE_STORAGE_RETRY_S", raising=False)
    seen = {}

    def first_step(ctx, clock, spec_path):  # what the sweep's first step sees; nothing after it is needed here
        seen.update(budget=storage.retry_seconds(), setting=storage.budget_setting(), env=worker_env()[OUTAGE_ENV])
        raise UserError("stopped after the first step")

    monkeypatch.setattr(driver, "start", first_step)
    spec = from_dict(SweepSpec, {**TINY_BASE, "sweep": {"storage": str(tmp_path), "storage_outage_s": 600}})
    with pytest.raises(UserError, match="stopped after the first step"):
        driver.run_sweep(spec, console=Console(io.StringIO()))
    assert seen == {"budget": 600.0, "setting": "sweep.storage_outage_s", "env": "600"}
    assert storage.retry_seconds() == 120.0 and storage.budget_setting() == "RAYBIPHASE_STORAGE_RETRY_S"
    assert OUTAGE_ENV not in worker_env()
    assert SweepSpec().sweep.storage_outage_s == 900.0  # 15 minutes by default
    with pytest.raises(ConfigError, match="^sweep.storage_outage_s: 0.0 is out of range"):
        from_dict(SweepSpec, {"sweep": {"storage_outage_s": 0}})
