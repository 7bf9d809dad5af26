"""Copies between a bucket (or a folder) and this node's disk, through the storage layer (raybiphase.storage):
a bucket folder downloaded once into a node-local cache (`local_copy`), a local folder uploaded (`upload`).

A bucket's keys are opaque strings: a key that would land outside the local copy (a `..`, `.` or empty part) is
refused in one line before anything is copied (`download`), so whoever can write the bucket cannot write this
node's disk outside the copy.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import pyarrow.fs as pafs

from raybiphase import storage
from raybiphase.errors import UserError


def download(location: storage.Location, dest: Path) -> None:
    """Copy every file under the bucket folder `location` into the local folder `dest`, keeping their relative
    paths. A bucket's keys are opaque strings: one whose relative path has an empty, `.` or `..` part, or a
    backslash, would land outside `dest` or somewhere else than it says; it is refused in one line (UserError),
    before anything is copied."""
    fs, path = storage.filesystem(location)
    infos = _listing(location, recursive=True)
    root = path.rstrip("/") + "/"
    files = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(root):] if info.path.startswith(root) else info.path
        if "\\" in relative or any(part in ("", ".", "..") for part in relative.split("/")):
            raise UserError(f"{location}: refused: its key {relative!r} would be copied outside {dest}; nothing was "
                            "copied")
        files.append((info.path, relative))
    for source, relative in files:
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        _copy_file(location, fs, source, target)


@storage.retrying()
def _listing(location: storage.Location, *, recursive: bool) -> list:
    fs, path = storage.filesystem(location)
    return fs.get_file_info(pafs.FileSelector(path, recursive=recursive))


@storage.retrying()
def _copy_file(location: storage.Location, fs, source: str, target: Path) -> None:
    with fs.open_input_stream(source) as stream, open(target, "wb") as out:
        shutil.copyfileobj(stream, out, 1 << 20)


@storage.retrying()
def upload(folder: Path, location: storage.Location) -> None:
    """Copy a local folder to `location` (a path or a URI), file by file."""
    fs, path = storage.filesystem(location)
    fs.create_dir(path, recursive=True)
    pafs.copy_files(str(folder), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


@storage.retrying()
def local_copy(location: storage.Location, cache: Path, version: str = "") -> Path:
    """A local folder holding `location`: the folder itself when it is local, else a copy under `cache` (this
    node's), downloaded once: into a staging folder, then renamed into place, keyed by the URI (and `version`,
    for a location whose content may be replaced)."""
    if not storage.is_uri(location):
        return Path(location).expanduser()
    target = cache / "remote" / hashlib.sha256(f"{location}#{version}".encode()).hexdigest()[:16]
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        download(location, staging)
        staging.rename(target)
    except OSError:
        if not target.is_dir():  # not merely another process that finished the same copy first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
