"""Storage hiccups, against a real S3-compatible server on 127.0.0.1 that goes down and comes
back: bucket operations retry with backoff and succeed once it is back; a checkpoint whose upload was cut short
has no meta (it is written last) and is never the one a resume or a child segment starts from; a committed
checkpoint whose files were damaged afterwards refuses to load. A longer outage (the rehearsal) is waited out for
sweep.storage_outage_s with a line every so often, not one per retry; past that budget a call stops with one line.

The rehearsal stops the server for RAYBIPHASE_REHEARSAL_OUTAGE_S seconds (default 14, to keep the suite short);
docs/troubleshooting.md gives the command that rehearses a 3-minute outage."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import pytest

from raybiphase import storage, transfer
from raybiphase.errors import UserError
from raybiphase.outages import NOTICE_ENV, StorageOutage, outage_budget


class Server:
    """moto's S3 server on a fixed port, stopped and started again as a restarting object store is (moto keeps its
    buckets in the process, so they survive the restart)."""

    def __init__(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server = None

    def start(self):
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self):
        self.server.stop()

    def restart_after(self, seconds: float) -> threading.Thread:
        thread = threading.Thread(target=lambda: (time.sleep(seconds), self.start()), daemon=True)
        thread.start()
        return thread


@pytest.fixture
def server(monkeypatch):
    import boto3

    server = Server()
    server.start()
    settings = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.port}", "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=settings["AWS_ENDPOINT_URL"]).create_bucket(Bucket="hiccups")
    yield server
    server.stop()


DOWN_S = 2.0
"""An object store restarting (our filesystems make each request once: `storage.retrying` waits it out)."""


@pytest.mark.slow  # waits out a restart
def test_a_write_and_a_read_wait_out_a_server_restart(server, monkeypatch):
    location = "s3://hiccups/runs/seg/history.json"
    storage.write_json(location, [{"step": 1}])
    retries = []
    monkeypatch.setattr(storage.log, "warning", lambda *args: retries.append(args[1]))
    server.stop()
    restarted = server.restart_after(DOWN_S)
    storage.write_json(location, [{"step": 1}, {"step": 2}])  # the server is down when this starts
    restarted.join()
    assert storage.read_json(location) == [{"step": 1}, {"step": 2}]
    assert retries and retries[0] == "write_bytes"  # it failed first, then got through

    server.stop()
    server.restart_after(DOWN_S)
    assert storage.read_json(location) == [{"step": 1}, {"step": 2}]  # reads wait too


@pytest.mark.slow
def test_without_retries_the_same_hiccup_fails(server, monkeypatch):
    """The check above can fail: with the retry budget at 0 the outage outlasts pyarrow's own retries."""
    monkeypatch.setattr(storage, "RETRY_SECONDS", 0.0)
    server.stop()
    restarted = server.restart_after(DOWN_S)
    with pytest.raises(OSError):
        storage.write_json("s3://hiccups/x.json", {})
    restarted.join()


def test_permanent_errors_are_not_retried(server):
    started = time.monotonic()
    with pytest.raises(OSError):
        storage.write_json("s3://no-such-bucket-here/x.json", {})
    assert not storage.transient(FileNotFoundError("s3://hiccups/x"))
    assert storage.transient(OSError("AWS Error NETWORK_CONNECTION during PutObject: curlCode: 7"))
    assert not storage.transient(OSError("AWS Error NO_SUCH_BUCKET ... NoSuchBucket"))
    assert time.monotonic() - started < storage.retry_seconds()  # it did not wait out the budget


def _restored_step(run_dir: str, *, registered: str | None, model, optimizer) -> int:
    """The step a restarted worker group resumes from when Ray Train's latest registered checkpoint is
    `registered` (Ray hands it over without the bucket's scheme; None: none registered)."""
    import ray.train

    from raybiphase.config import RunConfig
    from raybiphase.pretrain import loop

    latest = registered and ray.train.Checkpoint(storage.join(run_dir, registered))
    assert not latest or "://" not in latest.path
    original = ray.train.get_checkpoint
    ray.train.get_checkpoint = lambda: latest
    try:
        step, _ = loop.restore(RunConfig(), model, optimizer, None, run_dir)
    finally:
        ray.train.get_checkpoint = original
    return step


def _tiny_checkpoint(local, step: int = 3):
    from raybiphase.checkpoint_meta import CheckpointMeta
    from raybiphase.config import RunConfig, from_dict, to_dict
    from raybiphase.optim import adamw
    from raybiphase.pretrain import checkpoint
    from raybiphase.pretrain.model import build_model

    run = from_dict(RunConfig, {"phases": {"steps": 10, "clm_share": 0.5}, "optim": {"warmup_steps": 2,
                                                                                      "decay_steps": 2}})
    model = build_model("tiny", vocab_size=97, special_ids={"bos_token": 0, "eos_token": 1, "pad_token": 2,
                                                           "mask_token": 3}, seed=0)
    optimizer = adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    checkpoint.save_shards(local, model, optimizer)
    return model, optimizer, CheckpointMeta(run=to_dict(run), step=step, data_start=0, metrics={"step": step})


@pytest.mark.slow  # seconds: a model, a bucket
def test_a_checkpoint_cut_short_is_never_resumed_and_a_damaged_one_refuses_to_load(server, tmp_path):
    from raybiphase.pretrain import checkpoint

    run_dir = "s3://hiccups/sweep/runs/tiny-clm-0-8-abcd"
    model, optimizer, meta = _tiny_checkpoint(tmp_path / "three", step=3)
    transfer.upload(tmp_path / "three", storage.join(run_dir, "step-00000003"))
    checkpoint.commit(storage.join(run_dir, "step-00000003"), meta, ranks=1)

    _tiny_checkpoint(tmp_path / "five", step=5)  # step 5's upload: the server goes away after the index
    storage.write_bytes(storage.join(run_dir, "step-00000005", ".metadata"),
                        (tmp_path / "five" / ".metadata").read_bytes())
    five = storage.join(run_dir, "step-00000005")
    with pytest.raises(RuntimeError, match=r"__0_0.distcp.*never arrived; not committed"):
        checkpoint.commit(five, meta, ranks=1, wait_s=0.5)
    assert not storage.is_checkpoint(five)  # no meta: the driver's segment_done and restore skip it
    assert checkpoint.latest_committed(run_dir) == storage.join(run_dir, "step-00000003")

    assert _restored_step(run_dir, registered="step-00000005", model=model, optimizer=optimizer) == 3
    # a node lost after the meta was written but before Ray Train registered the checkpoint: still resumed from it
    assert _restored_step(run_dir, registered=None, model=model, optimizer=optimizer) == 3
    three = storage.join(run_dir, "step-00000003")
    committed = checkpoint.read_meta(three)
    assert committed.files[".metadata"] > 0 and committed.files["__0_0.distcp"] > 0
    local = transfer.local_copy(three, tmp_path / "cache")
    assert checkpoint.load(local, model, optimizer).step == 3
    shard = local / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])  # a truncated shard
    with pytest.raises(UserError, match="is incomplete: __0_0.distcp missing or of another size"):
        checkpoint.load(local, model, optimizer)


@pytest.mark.slow  # seconds: a model saved twice
def test_a_checkpoint_changed_since_its_commit_is_passed_over_for_the_one_before(tmp_path, capsys):
    """Damage that keeps every file's size (a flipped byte on a disk or in a bucket) is caught by the SHA-256 each
    rank recorded before its upload: loading it is refused, naming the file, and a restart resumes from the
    previous committed checkpoint with a line saying so, rather than failing every restart."""
    from raybiphase.pretrain import checkpoint

    run_dir = tmp_path / "runs" / "tiny-clm-0-8-abcd"
    for step in (3, 5):
        model, optimizer, meta = _tiny_checkpoint(run_dir / f"step-{step:08d}", step=step)
        checkpoint.commit(str(run_dir / f"step-{step:08d}"), meta, ranks=1)
    five = run_dir / "step-00000005"
    recorded = checkpoint.read_meta(five).checksums
    assert set(recorded) == {".metadata", "__0_0.distcp"} and all(len(d) == 64 for d in recorded.values())
    shard = five / "__0_0.distcp"
    body = bytearray(shard.read_bytes())
    body[len(body) // 2] ^= 0xFF  # one bit pattern changed, the size kept
    shard.write_bytes(bytes(body))
    with pytest.raises(checkpoint.Damaged, match=r"is damaged: __0_0.distcp changed since it was committed"):
        checkpoint.load(five, model, optimizer)
    capsys.readouterr()
    assert _restored_step(str(run_dir), registered=None, model=model, optimizer=optimizer) == 3
    said = capsys.readouterr().out
    assert "step-00000005 is damaged" in said and "resuming from the committed checkpoint before it" in said


OUTAGE_S = float(os.environ.get("RAYBIPHASE_REHEARSAL_OUTAGE_S") or 14)
"""How long the rehearsal's server stays down (the suite: 14 s; docs/troubleshooting.md: 180)."""


@pytest.mark.slow  # waits out OUTAGE_S, and up to one backoff (16 s) after it
def test_rehearsal_a_checkpoint_and_a_table_append_wait_out_an_outage_with_a_line_now_and_then(server, tmp_path,
                                                                                                monkeypatch, caplog):
    """The server goes down before a committed checkpoint's upload and a results append start, in two threads, and
    comes back OUTAGE_S later, longer than the old two-minute budget when rehearsed at full length. Both finish with
    exactly the objects and rows an uninterrupted run leaves; the outage is said once as it begins, once per notice
    interval (RAYBIPHASE_STORAGE_NOTICE_S, here a quarter of the outage) for both threads together, and once when
    the bucket answers again."""
    import pandas as pd

    from raybiphase.pretrain import checkpoint
    from raybiphase.results import store

    monkeypatch.setenv(NOTICE_ENV, f"{OUTAGE_S / 4:g}")
    model, optimizer, meta = _tiny_checkpoint(tmp_path / "local", step=3)
    location, table = "s3://hiccups/sweep/runs/seg/step-00000003", "s3://hiccups/sweep/finetune.parquet"
    row = {"run": "seg", "task": "sst2", "seed": 0, "score": 0.5}
    errors: list[BaseException] = []

    def save():
        transfer.upload(tmp_path / "local", location)
        checkpoint.commit(location, meta, ranks=1)

    def append():
        store.append_rows(table, [row], key=("run", "task", "seed"))

    def run(work):
        try:
            work()
        except BaseException as err:  # said by the assertion below
            errors.append(err)

    caplog.set_level(logging.WARNING, logger="raybiphase.storage")
    with outage_budget(OUTAGE_S + 120):
        server.stop()
        began = time.monotonic()
        restarted = server.restart_after(OUTAGE_S)
        threads = [threading.Thread(target=run, args=(work,)) for work in (save, append)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        restarted.join()
    took = time.monotonic() - began
    assert not errors, errors
    assert OUTAGE_S <= took < OUTAGE_S + 20  # waited the outage out, noticing its end within one backoff

    local = {p.relative_to(tmp_path / "local").as_posix() for p in (tmp_path / "local").rglob("*") if p.is_file()}
    assert set(storage.list_tree(location)) == local | {storage.META}  # the same keys, the meta last
    assert checkpoint.load(transfer.local_copy(location, tmp_path / "cache"), model, optimizer).step == 3
    assert store.read_rows(table).to_dict("records") == [row]
    assert store.append_rows(table, pd.DataFrame([row]), key=("run", "task", "seed")) == 1  # a rerun adds nothing

    said = [r.getMessage() for r in caplog.records if r.name == "raybiphase.storage"]  # not torch's debug lines
    assert len([m for m in said if "retrying for up to" in m]) == 1, said  # one bucket, one outage: said once
    assert "(sweep.storage_outage_s)" in said[0]
    waiting = [m for m in said if m.startswith("storage: s3://hiccups unreachable for")]
    assert 1 <= len(waiting) <= 5, said  # a line per notice interval, not per retry of each thread
    assert all("waiting up to" in m and "(sweep.storage_outage_s)" in m for m in waiting)
    assert [m for m in said if "reachable again" in m] == [said[-1]]


@pytest.mark.slow  # waits out a 1-second budget
def test_past_the_outage_budget_a_call_stops_with_one_line_and_writes_nothing(server, tmp_path):
    """The line names the location and the setting; nothing half-written is left, so a rerun starts clean."""
    location = "s3://hiccups/sweep/pretrain.json"
    storage.write_json(location, {"rows": 1})
    server.stop()
    try:
        with outage_budget(1.0), pytest.raises(StorageOutage) as raised:
            storage.write_json(location, {"rows": 2})
    finally:
        server.start()
    line = str(raised.value)
    assert line.startswith("storage: s3://hiccups/sweep/pretrain.json unreachable for 1 s (sweep.storage_outage_s "
                           "= 1 s; raise it to wait longer): ") and "\n" not in line
    assert isinstance(raised.value, UserError)  # a command says it in one line, exit code 2
    assert storage.read_json(location) == {"rows": 1}  # the old document, whole
    assert not storage.transient(raised.value)  # an enclosing retry does not wait the outage out again
