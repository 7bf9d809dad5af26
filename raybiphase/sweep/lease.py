"""One driver per sweep folder: a lease in `<sweep>/lease/`, taken before Ray starts, renewed while the driver
lives, given back when it exits.

A second driver on the same folder stops with one line naming the holder (host, pid, since when, last renewal)
before it starts anything; a dry run takes no lease. A lease not renewed for `sweep.lease_timeout_s` (its driver
was killed, its node lost) is taken over, with a line saying so; so is at once one whose driver ran on this machine
and whose process is gone (a driver killed and run again on the same machine need not wait). The holder renews it five
times per timeout (FailurePolicy.lease_renewals) from a daemon thread, so a long blocking call in the driver does not
let it lapse; a holder that finds its lease taken over says so and interrupts its main thread (KeyboardInterrupt: the
driver ends its segments and stops); a driver still running STOP_GRACE_S later (SIGINT ignored, as under `nohup ... &`
and many job runners, or the main thread blocked in a call) exits at once, and with it the Ray job it drives, so its
workers commit nothing more. A holder is its host, its pid and its pid namespace: a lease from another container
on a host of the same name is never taken for one whose process has ended. A lease this code cannot read (damaged,
or from an incompatible version) is taken over only once it has been left unchanged for the timeout.

How the lease is claimed, and what that guarantees:

- On a local disk (or NFS) the lease is one file, `lease/holder.json`, created only if absent
  (`locks.create_exclusive`: of two drivers exactly one creates it). Renewal, take-over and release hold an fcntl
  lock beside it and re-read it under the lock: a stale lease is replaced only if it is still the one found stale,
  and a driver renews or removes only its own.
- On S3, when boto3 is installed and the store honours conditional writes (`locks.ConditionalS3`), the lease is
  the one object `lease/holder.json`, created with `If-None-Match: *` (of two drivers exactly one creates it);
  renewal and take-over replace it with `If-Match: <the ETag read>`, so a stale lease is replaced only if it is
  still the one found stale (of two takers one succeeds), and a holder whose renewal is refused has lost it.
- Elsewhere (gs://, S3 without boto3 or with a store that ignores the conditions) each driver writes a claim of its
  own, `lease/<token>.json`, then lists the folder: it holds the lease only if its claim is the only one there,
  else it removes its claim, waits a random moment and looks again (a live claim found then is a holder: refused).
  pyarrow.fs, the one way this project otherwise reaches buckets, sends no conditional write, so the claim relies
  on what S3, GCS and MinIO promise instead: a list made after a write has finished shows it. Of two drivers that
  claim at once, the one that lists last sees the other's claim, so at most one holds the lease; both may step
  back, and after a few rounds one says the folder is busy. A taker first removes the stale claims and names the
  lease it took over in its claim; a holder whose claim is gone, or named so, has lost it. A claim and a
  conditional `holder.json` see each other: each protocol lists the folder's leases before it takes one.

Fencing: while `hold` holds the lease, every write and removal in the sweep folder, by the driver and by its Ray
workers (the lease's token reaches them in raybiphase.locks.FENCE_ENV), first checks that the lease is still this
driver's (raybiphase.locks.fence: read again at most every FENCE_RECHECK_S, and always after a pause longer than
that) and raises LeaseLost, naming the file, once another driver took it over: a holder paused past the timeout (a
frozen VM, SIGSTOP) writes nothing once resumed, whatever its signal dispositions, and its workers commit no
checkpoint, record or row. Limits: staleness is judged on the taker's clock against the holder's (clocks must agree
to well within the timeout); the check and the write are two requests (no store takes a token with a plain
write), so a write already past its check when the holder was paused lands; and a holder that kept running but
could not renew for the whole timeout may write for up to FENCE_RECHECK_S after the takeover.
"""

from __future__ import annotations

import _thread
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator

from raybiphase import locks, storage
from raybiphase.errors import UserError
from raybiphase.failures import FailurePolicy
from raybiphase.locks import LEASE_HOLDER as HOLDER  # the lease file (a local disk, S3 with conditional writes)
from raybiphase.telemetry.console import STDOUT, Console

STOP_GRACE_S = 10.0
"""Seconds a driver that lost its lease has to stop after its main thread is interrupted, before it exits at once."""
LOST_EXIT = 3
"""The exit code of a driver that lost its lease and did not stop when interrupted."""


def _pid_namespace() -> str:
    """This process's pid namespace (Linux: `pid:[4026531836]`; "" where there is none to read)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
ROUNDS = 4  # how often a bucket claim that met another is tried again before the folder is called busy
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Holder:
    """What a lease records: who holds it, since when, when it was last renewed (UTC, ISO 8601)."""

    host: str
    pid: int
    since: str
    renewed_at: str
    token: str
    took_over: str = ""
    """The token of the stale lease this one replaced (bucket claims: its holder then knows it lost)."""
    pid_ns: str = ""
    """The holder's pid namespace: its pid means that process only there ("" in a lease that does not say)."""

    @classmethod
    def me(cls, took_over: str = "") -> Holder:
        now = _now()
        return cls(socket.gethostname(), os.getpid(), now, now, uuid.uuid4().hex[:16], took_over, _pid_namespace())

    @classmethod
    def of(cls, document: object) -> Holder | None:
        """The holder a lease document names (fields it does not know, from a newer version, are passed over);
        None for anything else (a damaged file)."""
        if not isinstance(document, dict):
            return None
        known = {field.name for field in dataclasses.fields(cls)}
        try:
            holder = cls(**{key: value for key, value in document.items() if key in known})
            holder.idle_s()
        except (TypeError, ValueError):
            return None
        return holder

    def idle_s(self) -> float:
        """Seconds since the last renewal, on this machine's clock (a time without a zone is UTC's, as written)."""
        renewed = datetime.datetime.fromisoformat(self.renewed_at)
        if renewed.tzinfo is None:
            renewed = renewed.replace(tzinfo=datetime.UTC)
        return (datetime.datetime.now(datetime.UTC) - renewed).total_seconds()

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, since {self.since}, renewed {self.idle_s():.0f} s ago"

    def ended_here(self) -> bool:
        """Its driver ran on this machine and its process is gone (killed, crashed): no need to wait it out. A
        pid reused since reads as alive, which only makes the wait the timeout's. A pid of another pid namespace
        (another container on a host of the same name), or of a lease that does not name its namespace, says
        nothing here."""
        if self.host != socket.gethostname() or not self.pid_ns or self.pid_ns != _pid_namespace():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class Lease:
    """The lease of the sweep at `folder` (SweepPaths.lease), held by this process once `acquire` returns; on a
    bucket by a conditional create where the store allows one (`conditional`, module docstring), else by claims."""

    def __init__(self, folder: str, timeout_s: float, console: Console = STDOUT, *, conditional: bool = True):
        self.folder, self.timeout_s, self.console, self.conditional = folder, timeout_s, console, conditional
        self.holder = Holder.me()
        self.local = not storage.is_uri(folder)
        self.s3: locks.ConditionalS3 | None = None  # S3 with conditional writes, found by `acquire`
        self.etag = ""  # the ETag of this driver's holder.json on S3
        self.lost = False
        self._stop = threading.Event()
        self._released = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------------------------- acquire

    def acquire(self) -> None:
        """Hold the lease, taking over a stale one; a UserError naming the holder when another driver has it."""
        try:
            if self.local:
                self._acquire_file()
            elif self.conditional and (s3 := locks.ConditionalS3.of(self.folder)):
                self.s3 = s3
                self._acquire_conditional()
            else:
                self._acquire_claim()
        except OSError as err:
            reason = " ".join(str(err).split())[:300]
            raise UserError(f"sweep.storage: cannot take the sweep's lease at {self.folder}: {reason}") from None

    def check_free(self) -> None:
        """A UserError naming the holder when another driver holds the lease now; writes nothing. Only a first
        look (the commands' fast refusal, before the training stack loads): `acquire` decides."""
        try:
            if self.local:
                where = storage.join(self.folder, HOLDER)
                found = [(where, Holder.of(_read(where)))]
            else:
                found = [(storage.join(self.folder, name), h) for name, h in self._claims().items()]
        except OSError:  # an unreachable bucket: the sweep's own checks say so in their words
            return
        self._refuse_live(found)

    def _refuse_live(self, found: Iterable[tuple[str, Holder | None]]) -> None:
        """`found`: (location, holder) of each lease seen; the first live one refuses this driver."""
        live = [(where, h) for where, h in found if not self._stale(h, where)]
        if live:
            raise self._refuse(*min(live, key=lambda pair: pair[1].since if pair[1] else ""))

    def _refuse(self, where: str, other: Holder | None) -> UserError:
        if other is None:
            return UserError(f"sweep.storage: {where} is a lease this code cannot read; it is taken over once left "
                             f"unchanged for sweep.lease_timeout_s={self.timeout_s:g} s (delete it if no driver runs "
                             "this sweep)")
        return UserError(f"sweep.storage: {storage.parent(self.folder)} is held by another driver ({other.describe()});"
                         f" a lease not renewed for sweep.lease_timeout_s={self.timeout_s:g} s is taken over")

    def _taking_over(self, other: Holder | None) -> None:
        who = other.describe() if other else "a lease it cannot read"
        why = ("its process on this machine has ended" if other and other.ended_here() else
               f"not renewed for sweep.lease_timeout_s={self.timeout_s:g} s")
        self.console.say(f"lease: taking over {storage.parent(self.folder)} from {who} ({why})")

    def _stale(self, other: Holder | None, where: str) -> bool:
        """A holder not renewed for the timeout or whose process here has ended; a lease that cannot be read, once
        left unchanged for the timeout (or gone since it was read)."""
        if other is not None:
            return other.idle_s() > self.timeout_s or other.ended_here()
        age = storage.unchanged_s(where)
        return age is None or age > self.timeout_s

    def _acquire_file(self) -> None:
        path = storage.join(self.folder, HOLDER)
        while not locks.create_exclusive(path, self._document()):
            with locks.local_lock(path):
                if not storage.exists(path):  # released since: try the exclusive create again
                    continue
                other = Holder.of(_read(path))
                if not self._stale(other, path):
                    raise self._refuse(path, other)
                self._taking_over(other)
                self.holder = dataclasses.replace(self.holder, took_over=other.token if other else "")
                storage.write_json(path, dataclasses.asdict(self.holder))  # the stale one, checked under the lock
                return

    def _acquire_conditional(self) -> None:
        s3 = self.s3
        self._refuse_live((storage.join(self.folder, name), h)  # a claiming driver's
                          for name, h in self._claims().items() if name != HOLDER)
        for _ in range(ROUNDS):
            if etag := s3.create(HOLDER, self._document()):
                self.etag = etag
                return
            found = s3.read(HOLDER)
            if found is None:  # released since: create again
                continue
            other = Holder.of(_parse(found[0]))
            if not self._stale(other, storage.join(self.folder, HOLDER)):
                raise self._refuse(storage.join(self.folder, HOLDER), other)
            self._taking_over(other)
            self.holder = dataclasses.replace(self.holder, took_over=other.token if other else "")
            if etag := s3.replace(HOLDER, self._document(), found[1]):  # only if still the stale one
                self.etag = etag
                return
        raise self._busy()

    def _busy(self) -> UserError:
        return UserError(f"sweep.storage: {storage.parent(self.folder)} is being claimed by another driver at this "
                         "moment; run again in a minute")

    def _acquire_claim(self) -> None:
        for round_ in range(ROUNDS):
            claims = self._claims()
            self._refuse_live((storage.join(self.folder, name), h) for name, h in claims.items())
            for name, other in claims.items():
                self._taking_over(other)
                self.holder = dataclasses.replace(self.holder, took_over=other.token if other else "")
                storage.delete_file(storage.join(self.folder, name))
            storage.write_json(self._claim(), dataclasses.asdict(self.holder))
            if set(self._claims()) == {self._name()}:
                return
            storage.delete_file(self._claim())  # another driver claimed at the same moment: step back, look again
            time.sleep(random.uniform(0.2, 1.0) * (round_ + 1))
        raise self._busy()

    # ---------------------------------------------------------------------------------------------- renew

    def renew(self) -> bool:
        """Record a renewal; False (and `lost`) when another driver has taken the lease over."""
        self.holder = dataclasses.replace(self.holder, renewed_at=_now())
        if self.local:
            path = storage.join(self.folder, HOLDER)
            with locks.local_lock(path):
                current = Holder.of(_read(path))
                self.lost = current is None or current.token != self.holder.token
                if not self.lost:
                    storage.write_json(path, dataclasses.asdict(self.holder))
            return not self.lost
        if self.s3:
            etag = self.s3.replace(HOLDER, self._document(), self.etag)
            self.lost, self.etag = etag is None, etag or self.etag
            return not self.lost
        claims = self._claims()
        self.lost = self._name() not in claims or any(
            other is not None and other.took_over == self.holder.token for other in claims.values())
        if self.lost:
            storage.delete_file(self._claim())
        else:
            storage.write_json(self._claim(), dataclasses.asdict(self.holder))
        return not self.lost

    def start(self) -> None:
        """Renew FailurePolicy.lease_renewals times per timeout from a daemon thread until `release`."""
        self._thread = threading.Thread(target=self._renewing, name="sweep-lease", daemon=True)
        self._thread.start()

    def _renewing(self) -> None:
        while not self._stop.wait(self.timeout_s / FailurePolicy().lease_renewals):
            try:
                if self.renew():
                    continue
            except OSError as err:  # a bucket down past storage's retries: try again at the next tick
                log.warning("lease: cannot renew %s (%s)", self.folder, " ".join(str(err).split())[:200])
                continue
            self.console.say(f"lease: {storage.parent(self.folder)} was taken over by another driver; stopping")
            _thread.interrupt_main()
            if not self._released.wait(STOP_GRACE_S):  # SIGINT ignored, or the main thread blocked
                self.console.say(f"lease: still running {STOP_GRACE_S:g} s after losing the lease; exiting now")
                os._exit(LOST_EXIT)
            return

    # ---------------------------------------------------------------------------------------------- release

    def release(self) -> None:
        """Stop renewing and remove this driver's lease (not another's that took it over)."""
        self._released.set()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self.lost:
            return
        if self.s3:
            found = self.s3.read(HOLDER)
            if found is not None and found[1] == self.etag:  # its own, not one that took it over
                self.s3.delete(HOLDER)
            return
        if not self.local:
            storage.delete_file(self._claim())
            return
        path = storage.join(self.folder, HOLDER)
        if not storage.exists(path):  # the sweep folder was removed (a start refused with bad input)
            return
        with locks.local_lock(path):
            current = Holder.of(_read(path))
            if current is not None and current.token == self.holder.token:
                storage.delete_file(path)

    # ---------------------------------------------------------------------------------------------- claims

    def _name(self) -> str:
        return f"{self.holder.token}.json"

    def _claim(self) -> str:
        return storage.join(self.folder, self._name())

    def _claims(self) -> dict[str, Holder | None]:
        """The bucket's claims, name -> holder (None: damaged, or gone while listed)."""
        return {name: Holder.of(_read(storage.join(self.folder, name)))
                for name in storage.list_files(self.folder) if name.endswith(".json")}

    def _document(self) -> bytes:
        return json.dumps(dataclasses.asdict(self.holder)).encode()


def _read(location: str) -> object:
    try:
        return storage.read_json(location)
    except (ValueError, FileNotFoundError):  # not JSON (a damaged lease), or removed since it was listed
        return None


def _parse(data: bytes) -> object:
    try:
        return json.loads(data)
    except ValueError:  # a damaged lease
        return None


@contextlib.contextmanager
def hold(folder: str, timeout_s: float, console: Console = STDOUT) -> Iterator[Lease]:
    """Hold the sweep's lease for the block: acquired (or refused) on entry, renewed throughout, released on exit."""
    lease = Lease(folder, timeout_s, console)
    lease.acquire()
    lift = locks.fence(folder, lease.holder.token)  # this process's writes; its Ray workers get the variable
    saved = os.environ.get(locks.FENCE_ENV)
    os.environ[locks.FENCE_ENV] = json.dumps({"lease": folder, "token": lease.holder.token})
    lease.start()
    try:
        yield lease
    finally:
        lease.release()
        lift()
        if saved is None:
            os.environ.pop(locks.FENCE_ENV, None)
        else:
            os.environ[locks.FENCE_ENV] = saved
