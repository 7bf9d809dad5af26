"""Every location is a local path or a URI, served by one filesystem layer: the same calls work on a folder and on a
bucket (a real S3-compatible server on 127.0.0.1)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from raybiphase import storage, transfer


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
    local = transfer.local_copy(folder, tmp_path / "cache")
    assert (local / "config.json").read_text() == '"{}"' and (local / "sub" / "weights.bin").read_text() == '"abc"'
    fs, path = storage.filesystem(folder)
    fs.delete_dir(path)  # the second call does not download: it finds the copy
    assert transfer.local_copy(folder, tmp_path / "cache") == local and (local / "config.json").is_file()
    assert not list((tmp_path / "cache" / "remote").glob(".*"))  # no staging folder left behind


def test_a_local_folder_is_used_in_place(tmp_path):
    assert transfer.local_copy(tmp_path, tmp_path / "cache") == tmp_path
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


class LocalBoard:
    """The sweep's OutageBoard in this process, called as a process of the sweep calls the actor (SharedBoard)."""

    def __init__(self):
        from raybiphase.outages import OutageBoard

        self.board = OutageBoard()

    def began(self, bucket, now):
        return self.board.failed(bucket, now)

    def report(self, bucket, now):
        self.board.failed(bucket, now)

    def reached(self, bucket):
        self.board.reached(bucket)


def failing(seconds: float, calls: list):
    """A bucket call that always fails as an unreachable server does, waited out for `seconds`."""

    @storage.retrying(seconds)
    def read(location):
        calls.append(time.monotonic())
        raise OSError("When reading information for key 'k' in bucket 'b': AWS Error NETWORK_CONNECTION: "
                      "curlCode: 7, Couldn't connect to server")

    return read


def test_a_process_that_joins_an_outage_counts_from_its_start_not_its_own(monkeypatch, caplog):
    """A worker Ray Train starts again after its predecessor gave up on an unreachable bucket finds the outage on
    the sweep's board: its wait counts from when the first process saw it, so the sweep waits one
    sweep.storage_outage_s in all. It makes one call, says how long the bucket has been down, and stops with the
    one-line StorageOutage; a process on its own (no board) waits its whole budget."""
    from raybiphase import outages

    board = LocalBoard()
    board.report("s3://b", time.time() - 60)  # the outage's first process saw it 60 s ago, and gave up
    joined = outages.Outages()
    joined.board = lambda: board
    monkeypatch.setattr(storage, "OUTAGES", joined)
    calls: list[float] = []
    with caplog.at_level(logging.WARNING, logger="raybiphase.storage"), pytest.raises(outages.StorageOutage):
        failing(30.0, calls)("s3://b/k")
    assert len(calls) == 1
    said = [r.getMessage() for r in caplog.records]
    assert "unreachable for 60 s already, retrying for up to 30 s" in said[0], said

    alone = outages.Outages()
    alone.board = lambda: None
    monkeypatch.setattr(storage, "OUTAGES", alone)
    calls.clear()
    with pytest.raises(outages.StorageOutage):
        failing(1.2, calls)("s3://b/k")
    assert len(calls) >= 2  # 0.5 s, then what is left of the budget


def test_the_outage_board_ends_an_outage_when_the_bucket_answers_or_nothing_failed_for_a_while():
    """Reported failures keep one outage going from its first; a process reaching the bucket ends it; a failure
    after GAP_S without one is a new outage."""
    from raybiphase.outages import GAP_S, OutageBoard

    board = OutageBoard()
    assert board.failed("b", 1000.0) == 1000.0
    assert board.failed("b", 1100.0) == 1000.0 and board.failed("c", 1100.0) == 1100.0  # one outage per bucket
    assert board.failed("b", 1100.0 + GAP_S) == 1000.0  # within GAP_S of the last report
    assert board.failed("b", 1101.0 + 2 * GAP_S) == 1101.0 + 2 * GAP_S  # nothing failed for longer: a new outage
    board.reached("b")
    assert board.failed("b", 2000.0 + 2 * GAP_S) == 2000.0 + 2 * GAP_S


@pytest.mark.ray
@pytest.mark.slow
def test_the_processes_of_a_sweep_on_ray_wait_out_one_outage_budget_between_them(ray_cluster):
    """Through the board a sweep starts once Ray is up (`outages.share`, within `outages.sharing`): a process
    started after another gave up on a bucket (as Ray Train's restarted worker is) makes one call and stops, where
    the first waited its budget; the board ends with the sweep."""
    import ray

    from raybiphase import outages

    @ray.remote(num_cpus=0, max_calls=1)  # a fresh process per call, as a restarted worker is
    def wait_out(seconds: float) -> int:
        import time as clock

        from raybiphase import outages as shared
        from raybiphase import storage as store

        calls = []

        @store.retrying(seconds)
        def read(location):
            calls.append(clock.monotonic())
            raise OSError("AWS Error NETWORK_CONNECTION: curlCode: 7, Couldn't connect to server")

        try:
            read("s3://shared-outage/k")
        except shared.StorageOutage:
            return len(calls)
        return -1

    with outages.sharing():
        outages.share()
        # 5 s: the first process's own question to the board counts as outage, and on two busy cores it may take
        # a second or two
        first = ray.get(wait_out.remote(5.0))
        second = ray.get(wait_out.remote(5.0))
    assert first >= 2 and second == 1, (first, second)
    assert outages._board() is None


def test_a_bucket_key_that_reaches_outside_the_local_copy_is_refused_before_anything_is_copied(s3_bucket, tmp_path,
                                                                                              monkeypatch, capsys):
    """A bucket's keys are opaque: `tree/../../escaped` is a key like any other. Copying a folder to this node
    (a checkpoint, an HF folder, a results tree to import) refuses it in one line and copies nothing."""
    import boto3

    from raybiphase.commands import import_results, run_main
    from raybiphase.errors import UserError

    client = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    for key in ("evil/hf/config.json", "evil/hf/../../../../escaped/owned.txt"):
        client.put_object(Bucket=bucket, Key=key, Body=b"{}")
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match=r"^s3://raybiphase-test/evil/hf: refused: its key "
                                        r"'\.\./\.\./\.\./\.\./escaped/owned\.txt' would be copied outside "):
        transfer.local_copy(f"{s3_bucket}/evil/hf", cache)
    assert not list(tmp_path.rglob("owned.txt")) and not list((cache / "remote").iterdir())
    monkeypatch.setattr(sys, "argv", ["import", f"{s3_bucket}/evil", str(tmp_path / "results")])
    with pytest.raises(SystemExit) as exit_info:
        run_main(import_results.main)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "refused: its key" in err
    assert not list(tmp_path.rglob("owned.txt")) and not (tmp_path / "results").exists()


@pytest.mark.slow  # a subprocess that imports the CLI
def test_a_sweep_pointed_at_a_bucket_never_reached_stops_in_seconds_not_after_the_outage_budget(tmp_path):
    """An endpoint nothing answers on: a wrong address or missing credentials, not an outage. One line, exit 2,
    within storage's fast probe (10 s), never after its retry budget (set to 10 minutes here)."""
    import os
    import subprocess

    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1", "RAYBIPHASE_STORAGE_RETRY_S": "600"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "raybiphase.sweep", "sweeps/quickstart.yaml", "--set",
                           "sweep.storage=s3://nowhere/results"], cwd=Path(__file__).resolve().parents[1], env=env,
                          capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1].startswith("error: sweep.storage: cannot reach s3://nowhere/results")
    assert took < 300, took  # the budget was not waited out
