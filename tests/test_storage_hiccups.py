"""Storage hiccups, against a real S3-compatible server on 127.0.0.1 that goes down and comes
back: bucket operations retry with backoff and succeed once it is back; a checkpoint whose upload was cut short
has no meta (it is written last) and is never the one a resume or a child segment starts from; a committed
checkpoint whose files were damaged afterwards refuses to load."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from raybiphase import storage
from raybiphase.errors import UserError


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
    from raybiphase.config import RunConfig, from_dict, to_dict
    from raybiphase.optim import adamw
    from raybiphase.pretrain import checkpoint
    from raybiphase.checkpoint_meta import CheckpointMeta
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
    storage.upload(tmp_path / "three", storage.join(run_dir, "step-00000003"))
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
    local = storage.local_copy(three, tmp_path / "cache")
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
