"""What drivers take turns with: a local file created only if absent, a lock beside a local file (the processes of
one machine), and on S3 an object created only if absent or replaced only if unchanged (raybiphase.sweep.lease holds
a sweep folder with them; raybiphase.results.store appends under the lock).

pyarrow.fs sends no conditional write. S3 has taken `If-None-Match: *` and `If-Match: <etag>` on PutObject since
2024 (a second create, or a replace of a changed object, gets 412 Precondition Failed); boto3, when installed (the
clusters' heads have it), sends them: `ConditionalS3.of` gives one for an s3:// folder whose store honours them (a
store that ignores the headers is found by a probe and gets None). Elsewhere (gs://, no boto3) the lease falls back
to a claim protocol of its own."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from raybiphase import storage
from raybiphase.errors import LeaseLost
from raybiphase.storage import Location, is_uri, join

LEASE_HOLDER = "holder.json"
"""A sweep lease's one file, where its protocol has one (raybiphase.sweep.lease)."""
FENCE_ENV = "RAYBIPHASE_FENCE"
"""JSON {"lease": lease folder, "token": holder token}: the lease a driver holds, forwarded to its Ray workers."""
FENCE_RECHECK_S = 1.0
"""A lease found held is trusted for this long before the next write reads it again (monotonic: a paused process
reads it again on resuming)."""


def create_exclusive(location: Location, data: bytes) -> bool:
    """Create a local file holding `data` only if none is there (else False): a temporary sibling hard-linked to
    the name fails, like O_CREAT | O_EXCL, when the name exists (local disks, NFS v3+) and shows the file whole
    the moment it appears. pyarrow.fs has no such create on a bucket: a URI is refused."""
    if is_uri(location):
        raise ValueError(f"{location}: an exclusive create needs a local path")
    path = Path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


@contextlib.contextmanager
def local_lock(location: Location) -> Iterator[None]:
    """An exclusive fcntl lock on a hidden `.<name>.lock` beside a local `location`: processes of one machine
    take turns. A URI is not locked (an object store has none)."""
    if is_uri(location):
        yield
        return
    import fcntl

    path = Path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ConditionalS3:
    """Conditional writes to one s3:// folder through boto3 (module docstring). Each write returns the object's new
    ETag, or None when its condition failed; an unreachable store is an OSError, as pyarrow's are."""

    def __init__(self, folder: str, client):
        self.folder, self.client = folder, client
        self.bucket, _, self.prefix = folder.split("://", 1)[1].partition("/")

    @classmethod
    def of(cls, folder: Location) -> ConditionalS3 | None:
        """One for an s3:// `folder` when boto3 is installed and sends the conditions, and the store refuses a
        second create of one name (a probe object, removed); None otherwise."""
        if not str(folder).startswith("s3://"):
            return None
        try:
            import boto3
        except ImportError:
            return None
        client = boto3.client("s3")  # endpoint, region and credentials as pyarrow finds them: AWS_* and the profile
        members = client.meta.service_model.operation_model("PutObject").input_shape.members
        if not {"IfNoneMatch", "IfMatch"} <= set(members):
            return None
        store = cls(str(folder).rstrip("/"), client)
        probe = f".conditional-probe-{uuid.uuid4().hex[:12]}"
        try:
            honoured = store.create(probe, b"") is not None and store.create(probe, b"") is None
        finally:
            store.delete(probe)
        return store if honoured else None

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _call(self, operation: str, name: str, **kwargs) -> dict | None:
        """The response, or None on 412 (a condition failed) or 404 (no such object)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(Bucket=self.bucket, Key=self._key(name), **kwargs)
        except ClientError as err:
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (404, 412) or err.response.get("Error", {}).get("Code") in ("NoSuchKey", "PreconditionFailed"):
                return None
            raise OSError(f"{join(self.folder, name)}: {err}") from None
        except BotoCoreError as err:
            raise OSError(f"{join(self.folder, name)}: {err}") from None

    def create(self, name: str, data: bytes) -> str | None:
        """Create `name` holding `data` only if no object has that name: its ETag, or None."""
        response = self._call("put_object", name, Body=data, IfNoneMatch="*")
        return response["ETag"] if response else None

    def replace(self, name: str, data: bytes, etag: str) -> str | None:
        """Overwrite `name` only if it is still the object of `etag`: the new ETag, or None (changed or gone)."""
        response = self._call("put_object", name, Body=data, IfMatch=etag)
        return response["ETag"] if response else None

    def read(self, name: str) -> tuple[bytes, str] | None:
        """`name`'s bytes and ETag, or None when there is no such object."""
        response = self._call("get_object", name)
        return (response["Body"].read(), response["ETag"]) if response else None

    def delete(self, name: str) -> None:
        self._call("delete_object", name)


# ------------------------------------------------------------------------------------------------ fencing


def lease_held(folder: Location, token: str) -> bool:
    """Whether the sweep lease at `folder` (raybiphase.sweep.lease) is still the one with `token`: its
    `holder.json` names it, or, where leases are claims, its claim is there and no other claim took it over. A
    lease that cannot be read is not held."""
    try:
        holder = storage.read_json(join(folder, LEASE_HOLDER))
        if holder is not None:
            return isinstance(holder, dict) and holder.get("token") == token
        names = storage.list_files(folder) if storage.exists(folder) else {}
        if f"{token}.json" not in names:
            return False
        others = [storage.read_json(join(folder, name)) for name in names
                  if name.endswith(".json") and name != f"{token}.json"]
    except (ValueError, FileNotFoundError):  # damaged, or removed while listed
        return False
    return not any(isinstance(other, dict) and other.get("took_over") == token for other in others)


def fence(lease_folder: Location, token: str) -> Callable[[], None]:
    """Refuse every write to the sweep folder around `lease_folder` (its parent) once the lease with `token` is
    no longer held (storage.FENCES: LeaseLost, checked before each write, reading the lease at most every
    FENCE_RECHECK_S); returns the function
    that lifts the fence. A fence already up for this lease is not put up twice."""
    key = (str(lease_folder), token)
    if key in _FENCES:
        return lambda: None
    checked = [-math.inf]

    def holds() -> bool:
        if time.monotonic() - checked[0] < FENCE_RECHECK_S:
            return True
        if not lease_held(lease_folder, token):
            return False
        checked[0] = time.monotonic()
        return True

    root, lease = storage.parent(str(lease_folder)).rstrip("/") + "/", str(lease_folder).rstrip("/") + "/"

    def check(where: str) -> None:
        if where.startswith(root) and not where.startswith(lease) and not holds():
            raise LeaseLost(f"{where}: not written: the sweep's lease at {lease_folder} was taken over by another "
                            "driver, which now runs the sweep")

    storage.FENCES.append(check)
    _FENCES.add(key)

    def lift() -> None:
        if check in storage.FENCES:
            storage.FENCES.remove(check)
        _FENCES.discard(key)

    return lift


def fence_from_env() -> None:
    """In a Ray worker: the fence of the lease its driver holds (FENCE_ENV, forwarded by raybiphase.raycluster);
    nothing where the driver set none."""
    if raw := os.environ.get(FENCE_ENV):
        document = json.loads(raw)
        fence(document["lease"], document["token"])


_FENCES: set[tuple[str, str]] = set()
