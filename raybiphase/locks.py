"""What the processes of one machine take turns with: a local file created only if absent, and a lock beside a
local file (raybiphase.sweep.lease holds a sweep folder with them; raybiphase.results.store appends under the lock).
An object store offers neither through pyarrow.fs: a bucket's lease is a claim protocol of its own (the lease)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from raybiphase.storage import Location, is_uri


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
