"""One driver per sweep folder: the lease is taken once, refused with the holder's line, taken over when stale,
given back at exit; on a local disk and on a bucket (the local S3 server); and the command stops before Ray."""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raybiphase import storage
from raybiphase.errors import UserError
from raybiphase.sweep.lease import HOLDER, Holder, Lease, _pid_namespace, hold
from raybiphase.telemetry.console import Console

REPO = Path(__file__).resolve().parents[2]


def _lease(folder: str, timeout_s: float = 300.0, **kwargs) -> tuple[Lease, io.StringIO]:
    lines = io.StringIO()
    return Lease(folder, timeout_s, Console(lines), **kwargs), lines


def _left_by_a_dead_driver(seconds_ago: float, host: str = "gone-node", pid: int = 4242, pid_ns: str = "") -> dict:
    """What a driver killed `seconds_ago` left: its last renewal is that old."""
    then = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)).isoformat()
    return dataclasses.asdict(Holder(host, pid, then, then, f"{pid:016d}", pid_ns=pid_ns))


def test_a_lease_records_its_holder_and_a_second_driver_is_refused_naming_it(tmp_path) -> None:
    folder = str(tmp_path / "sweep" / "lease")
    first, _ = _lease(folder)
    first.acquire()
    record = json.loads((Path(folder) / HOLDER).read_text())
    assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
    assert record["since"] == record["renewed_at"]
    second, _ = _lease(folder)
    with pytest.raises(UserError) as err:
        second.acquire()
    line = str(err.value)
    assert "\n" not in line and "held by another driver" in line
    assert f"host {socket.gethostname()}, pid {os.getpid()}, since {record['since']}" in line
    assert json.loads((Path(folder) / HOLDER).read_text()) == record  # the holder's lease untouched


def test_a_released_lease_is_free_at_once_and_renewal_moves_its_time(tmp_path) -> None:
    folder = str(tmp_path / "lease")
    first, _ = _lease(folder)
    first.acquire()
    since = first.holder.renewed_at
    time.sleep(0.01)
    assert first.renew() and json.loads((Path(folder) / HOLDER).read_text())["renewed_at"] > since
    first.release()
    assert not (Path(folder) / HOLDER).exists()
    second, _ = _lease(folder)
    second.acquire()
    second.release()


def test_a_lease_not_renewed_for_the_timeout_is_taken_over_with_a_line(tmp_path) -> None:
    folder = tmp_path / "lease"
    folder.mkdir()
    (folder / HOLDER).write_text(json.dumps(_left_by_a_dead_driver(301)))
    with pytest.raises(UserError, match="host gone-node, pid 4242"):  # not stale under a longer timeout
        Lease(str(folder), 600.0).acquire()
    taker, lines = _lease(str(folder))
    taker.acquire()
    assert "lease: taking over" in lines.getvalue() and "host gone-node, pid 4242" in lines.getvalue()
    record = json.loads((folder / HOLDER).read_text())
    assert record["pid"] == os.getpid() and record["took_over"] == f"{4242:016d}"
    taker.release()


def test_a_holder_taken_over_knows_it_lost_and_leaves_the_new_lease(tmp_path) -> None:
    folder = str(tmp_path / "lease")
    old, _ = _lease(folder, timeout_s=0.05)
    old.acquire()
    time.sleep(0.1)  # the old holder stalled past its timeout
    new, _ = _lease(folder, timeout_s=0.05)
    new.acquire()
    assert not old.renew() and old.lost
    old.release()
    assert json.loads((Path(folder) / HOLDER).read_text())["token"] == new.holder.token


def test_the_holder_renews_from_a_thread_while_it_lives(tmp_path) -> None:
    folder = str(tmp_path / "lease")
    with hold(folder, 0.25, Console(io.StringIO())):
        first = json.loads((Path(folder) / HOLDER).read_text())["renewed_at"]
        time.sleep(0.4)  # longer than the timeout: only renewals keep it
        assert json.loads((Path(folder) / HOLDER).read_text())["renewed_at"] > first
        with pytest.raises(UserError, match="held by another driver"):
            Lease(folder, 0.25).acquire()
    assert not (Path(folder) / HOLDER).exists()


def test_drivers_starting_at_once_on_a_disk_get_one_lease(tmp_path) -> None:
    folder = str(tmp_path / "lease")
    assert _race([Lease(folder, 300.0, Console(io.StringIO())) for _ in range(4)]) == 1


def _race(leases: list[Lease]) -> int:
    """Acquire every lease at once, each on its own thread; how many got it."""
    start, won = threading.Barrier(len(leases)), []

    def attempt(lease: Lease) -> None:
        start.wait()
        try:
            lease.acquire()
            won.append(lease)
        except UserError:
            pass

    threads = [threading.Thread(target=attempt, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return len(won)


def test_two_drivers_on_one_bucket_the_second_refuses_and_a_stale_claim_is_taken_over(s3_bucket) -> None:
    """The claim protocol, as a gs:// bucket takes it (pyarrow.fs sends no conditional write), on the S3 server."""
    folder = storage.SweepPaths(f"{s3_bucket}/lease-two").lease
    first, _ = _lease(folder, conditional=False)
    first.acquire()
    second, _ = _lease(folder, conditional=False)
    with pytest.raises(UserError, match=f"host {socket.gethostname()}, pid {os.getpid()}, since "):
        second.acquire()
    assert list(storage.list_files(folder)) == [f"{first.holder.token}.json"]
    storage.write_json(storage.join(folder, f"{first.holder.token}.json"),
                       {**dataclasses.asdict(first.holder), "renewed_at": _left_by_a_dead_driver(400)["renewed_at"]})
    taker, lines = _lease(folder, conditional=False)
    taker.acquire()
    assert "lease: taking over" in lines.getvalue()
    assert not first.renew() and first.lost  # its claim is gone: it knows it lost
    assert list(storage.list_files(folder)) == [f"{taker.holder.token}.json"]
    taker.release()
    assert storage.list_files(folder) == {}


def test_drivers_claiming_one_bucket_at_once_get_at_most_one_lease(s3_bucket) -> None:
    folder = storage.SweepPaths(f"{s3_bucket}/lease-race").lease
    leases = [Lease(folder, 300.0, Console(io.StringIO()), conditional=False) for _ in range(3)]
    assert _race(leases) <= 1
    holders = [lease for lease in leases if storage.exists(storage.join(folder, f"{lease.holder.token}.json"))]
    assert len(holders) <= 1


def test_on_s3_the_lease_is_one_object_created_only_if_absent_and_replaced_only_if_unchanged(s3_bucket) -> None:
    """boto3 sends S3's conditional writes: the lease is lease/holder.json, which a second driver cannot create
    (412), a stale one is replaced only while it is the one read, and a holder whose renewal is refused lost it."""
    from raybiphase.locks import ConditionalS3

    folder = storage.SweepPaths(f"{s3_bucket}/lease-conditional").lease
    first, _ = _lease(folder)
    first.acquire()
    assert first.s3 is not None and list(storage.list_files(folder)) == [HOLDER]
    store = ConditionalS3.of(folder)
    assert store.create(HOLDER, b"{}") is None  # the server refuses a second create
    second, _ = _lease(folder)
    with pytest.raises(UserError, match=f"host {socket.gethostname()}, pid {os.getpid()}, since "):
        second.acquire()
    assert first.renew() and not first.lost
    (_, etag) = store.read(HOLDER)
    stale = {**dataclasses.asdict(first.holder), "renewed_at": _left_by_a_dead_driver(400)["renewed_at"]}
    etag = store.replace(HOLDER, json.dumps(stale).encode(), etag)  # as a frozen holder leaves it
    assert etag and store.replace(HOLDER, b"{}", first.etag) is None  # an ETag read before is refused
    taker, lines = _lease(folder)
    taker.acquire()
    assert "lease: taking over" in lines.getvalue() and taker.etag != etag
    assert not first.renew() and first.lost  # its If-Match fails: it knows it lost
    first.release()
    assert Holder.of(json.loads(store.read(HOLDER)[0])).token == taker.holder.token  # the taker's, left in place
    taker.release()
    assert storage.list_files(folder) == {}


def test_a_claiming_driver_and_a_conditional_one_see_each_others_lease(s3_bucket) -> None:
    """Drivers of either protocol on one S3 folder (one without boto3, one with): each is refused by the other."""
    folder = storage.SweepPaths(f"{s3_bucket}/lease-mixed").lease
    for holds, asks in ((False, True), (True, False)):
        holder, _ = _lease(folder, conditional=holds)
        holder.acquire()
        other, _ = _lease(folder, conditional=asks)
        with pytest.raises(UserError, match="is held by another driver"):
            other.acquire()
        holder.release()
        assert storage.list_files(folder) == {}


def _sweep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raybiphase", "sweep", "sweeps/quickstart.yaml",
                           "--set", f"sweep.storage={tmp_path}", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_the_sweep_command_stops_in_one_line_while_another_driver_holds_the_folder(tmp_path) -> None:
    lease = tmp_path / "quickstart" / "lease" / HOLDER
    lease.parent.mkdir(parents=True)
    lease.write_text(json.dumps(_left_by_a_dead_driver(1, host="node-7", pid=99)))  # renewed a second ago
    proc = _sweep(tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: sweep.storage: ") and "held by another driver (host node-7, pid 99, since " in line
    assert proc.stdout == ""  # not even the plan: nothing ran, Ray least of all
    assert sorted(p.name for p in (tmp_path / "quickstart").iterdir()) == ["lease"]
    dry = _sweep(tmp_path, "--dry-run")  # the plan takes no lease and needs none
    assert dry.returncode == 0 and "steps:" in dry.stdout
    assert json.loads(lease.read_text())["pid"] == 99
    assert sorted(p.name for p in lease.parent.iterdir()) == [HOLDER]


def test_a_dry_run_takes_no_lease(tmp_path) -> None:
    assert _sweep(tmp_path, "--dry-run").returncode == 0
    assert not (tmp_path / "quickstart" / "lease").exists()


@pytest.mark.slow  # imports the driver (the training stack): seconds
def test_the_driver_refuses_a_held_folder_before_ray_starts(tmp_path) -> None:
    """The lease `run_sweep` takes after planning is the one that decides; Ray (refused in this unit test) and
    the sweep's files come after it."""
    from raybiphase.config import SweepSpec, load
    from raybiphase.sweep.driver import run_sweep

    spec = load(SweepSpec, str(REPO / "sweeps" / "quickstart.yaml"), [f"sweep.storage={tmp_path}"])
    with hold(storage.SweepPaths.of(str(tmp_path), spec.sweep.name).lease, 300.0, Console(io.StringIO())):
        with pytest.raises(UserError, match="held by another driver"):
            run_sweep(spec, console=Console(io.StringIO()))
        assert sorted(p.name for p in (tmp_path / spec.sweep.name).iterdir()) == ["lease"]


def test_the_lease_timeout_must_be_positive() -> None:
    from raybiphase.config import ConfigError, SweepSpec, load

    with pytest.raises(ConfigError, match="sweep.lease_timeout_s"):
        load(SweepSpec, str(REPO / "sweeps" / "quickstart.yaml"), ["sweep.lease_timeout_s=0"])


def test_a_lease_whose_process_on_this_machine_has_ended_is_taken_over_at_once(tmp_path) -> None:
    """A driver killed (kill -9) and run again on the same machine does not wait out the timeout."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder = tmp_path / "lease"
    folder.mkdir()
    record = _left_by_a_dead_driver(1, host=socket.gethostname(), pid=int(ended.stdout), pid_ns=_pid_namespace())
    (folder / HOLDER).write_text(json.dumps(record))
    taker, lines = _lease(str(folder))
    taker.acquire()
    assert "its process on this machine has ended" in lines.getvalue()
    taker.release()


def test_a_fresh_lease_naming_a_pid_of_another_pid_namespace_is_not_taken(tmp_path) -> None:
    """Two containers on hosts of one name: the other's pid means nothing here, so its lease is waited out, as is
    one that does not say its namespace."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder = tmp_path / "lease"
    folder.mkdir()
    for namespace in ("pid:[1]", ""):
        record = _left_by_a_dead_driver(1, host=socket.gethostname(), pid=int(ended.stdout), pid_ns=namespace)
        (folder / HOLDER).write_text(json.dumps(record))
        with pytest.raises(UserError, match="held by another driver"):
            _lease(str(folder))[0].acquire()


def test_a_lease_with_a_field_this_version_does_not_know_or_a_time_without_a_zone_is_still_a_holder(tmp_path):
    folder = tmp_path / "lease"
    folder.mkdir()
    record = {**_left_by_a_dead_driver(1), "region": "eu-west-1"}  # a newer version's field
    (folder / HOLDER).write_text(json.dumps(record))
    with pytest.raises(UserError, match="host gone-node, pid 4242"):
        _lease(str(folder))[0].acquire()
    naive = datetime.datetime.now(datetime.UTC).replace(tzinfo=None).isoformat()
    (folder / HOLDER).write_text(json.dumps({**record, "renewed_at": naive}))
    with pytest.raises(UserError, match=r"host gone-node, pid 4242, .*renewed [01] s ago"):
        _lease(str(folder))[0].acquire()


def test_a_lease_that_cannot_be_read_is_taken_over_only_once_left_for_the_timeout(tmp_path) -> None:
    folder = tmp_path / "lease"
    folder.mkdir()
    (folder / HOLDER).write_text('{"host": "node-a", "pid"')  # cut short
    with pytest.raises(UserError) as err:
        _lease(str(folder))[0].acquire()
    assert str(err.value) == (f"sweep.storage: {folder / HOLDER} is a lease this code cannot read; it is taken over "
                              "once left unchanged for sweep.lease_timeout_s=300 s (delete it if no driver runs this "
                              "sweep)")
    old = time.time() - 301
    os.utime(folder / HOLDER, (old, old))
    taker, lines = _lease(str(folder))
    taker.acquire()
    assert "lease: taking over" in lines.getvalue() and "a lease it cannot read" in lines.getvalue()
    taker.release()


HOLDING = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under `nohup ... &` and many job runners
from raybiphase.sweep import lease
from raybiphase.telemetry.console import Console
lease.STOP_GRACE_S = 1.0
with lease.hold(sys.argv[1], float(sys.argv[2]), Console(sys.stdout)):
    while True:  # the driver's writes
        with open(sys.argv[3], "a") as out:
            out.write(f"{time.time()}\\n")
        time.sleep(0.05)
"""


def _paused_and_taken_over(script: str, folder: str, timeout: float, writes: Path):
    """Run `script` holding the lease at `folder`, pause it (SIGSTOP) once it wrote `writes`, take the lease over
    once stale, resume it (SIGCONT): its exit code, output, when it was resumed, how long it ran on, the taker."""
    import signal

    driver = subprocess.Popen([sys.executable, "-c", script, folder, str(timeout), str(writes)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 30
        while not writes.exists() and time.time() < deadline:
            time.sleep(0.05)
        driver.send_signal(signal.SIGSTOP)
        time.sleep(timeout + 0.5)
        taker, _ = _lease(folder, timeout)
        taker.acquire()
        resumed = time.time()
        driver.send_signal(signal.SIGCONT)
        code = driver.wait(timeout=30)
        return code, driver.stdout.read(), resumed, time.time() - resumed, taker
    finally:
        driver.kill()


@pytest.mark.slow  # a driver process paused, taken over and resumed: seconds
def test_a_paused_driver_that_lost_its_lease_exits_within_a_renewal_whatever_its_signals(tmp_path) -> None:
    """A holder paused (SIGSTOP) past the timeout is taken over; resumed, it would write on: it ignores SIGINT, so
    the interrupt does not stop it. It exits (LOST_EXIT) within one renewal interval and STOP_GRACE_S."""
    from raybiphase.sweep.lease import LOST_EXIT

    folder, writes, timeout = str(tmp_path / "lease"), tmp_path / "writes", 2.0
    code, output, resumed, took, taker = _paused_and_taken_over(HOLDING, folder, timeout, writes)
    assert code == LOST_EXIT, output
    assert "was taken over by another driver; stopping" in output and "exiting now" in output
    assert took < timeout / 5 + 1.0 + 3.0, took  # a renewal tick, the grace, the machine's slack
    last = float(writes.read_text().split()[-1])
    assert last < resumed + timeout / 5 + 1.0 + 3.0  # no write after it exited
    taker.release()


@pytest.mark.parametrize("where", ["disk", "bucket"])
def test_once_the_lease_is_taken_over_every_write_to_the_sweep_folder_is_refused(tmp_path, s3_bucket, monkeypatch,
                                                                                where) -> None:
    """The fence a driver (`hold`) and its Ray workers (`fence_from_env`) put up: writes and removals in the sweep
    folder pass while the lease is theirs and raise LeaseLost, naming the file, once another driver took it over;
    the lease folder itself and other folders stay writable; on a disk (holder.json) and on a bucket (claims)."""
    from raybiphase import locks
    from raybiphase.errors import LeaseLost

    monkeypatch.setattr(locks, "FENCE_RECHECK_S", 0.0)  # read the lease at every write
    root = str(tmp_path / "sweep") if where == "disk" else f"{s3_bucket}/fence-{os.getpid()}"
    folder = storage.join(root, "lease")
    holder, _ = _lease(folder, 0.2, conditional=False)
    holder.acquire()
    monkeypatch.setenv(locks.FENCE_ENV, json.dumps({"lease": folder, "token": holder.holder.token}))
    locks.fence_from_env()
    try:
        storage.write_json(storage.join(root, "rows.json"), [1])
        time.sleep(0.3)  # not renewed for the timeout: stale
        taker, _ = _lease(folder, 0.2, conditional=False)
        taker.acquire()
        for write in (lambda: storage.write_json(storage.join(root, "rows.json"), [2]),
                      lambda: storage.delete_file(storage.join(root, "rows.json")),
                      lambda: storage.delete(storage.join(root, "runs"))):
            with pytest.raises(LeaseLost, match="rows.json|runs") as refused:
                write()
            assert "was taken over by another driver" in str(refused.value)
        assert storage.read_json(storage.join(root, "rows.json")) == [1]
        storage.write_json(storage.join(str(tmp_path), "elsewhere.json"), [3])  # outside the sweep: no fence
        taker.release()
    finally:
        storage.FENCES.clear()
        locks._FENCES.clear()


FENCED = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under `nohup ... &` and many job runners
from raybiphase import storage
from raybiphase.errors import LeaseLost
from raybiphase.sweep import lease
from raybiphase.telemetry.console import Console
lease.STOP_GRACE_S = 60.0  # the exit comes late: only the fence stops the writes
with lease.hold(sys.argv[1], float(sys.argv[2]), Console(sys.stdout)):
    while True:  # the driver's writes, each the time it was made
        try:
            storage.write_json(sys.argv[3], time.time())
        except LeaseLost as err:
            print(f"refused: {err}", flush=True)  # one write: the lease thread's own line may come beside it
            sys.exit(0)
        time.sleep(0.05)
"""


@pytest.mark.slow  # a driver process paused, taken over and resumed: seconds
def test_a_paused_driver_that_lost_its_lease_writes_nothing_once_resumed(tmp_path) -> None:
    """A holder paused (SIGSTOP) past the timeout is taken over; resumed, its very next write to the sweep folder
    is refused (the fence reads the lease again after any pause), long before it would exit."""
    root = tmp_path / "sweep"
    folder, rows, timeout = str(root / "lease"), root / "rows.json", 2.0
    code, output, resumed, _, taker = _paused_and_taken_over(FENCED, folder, timeout, rows)
    assert code == 0 and f"refused: {rows}: not written" in output, output
    assert json.loads(rows.read_text()) < resumed  # its last write was made before the pause
    taker.release()
