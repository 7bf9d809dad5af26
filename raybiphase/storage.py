"""Every location the platform writes or reads, and the one filesystem layer behind them (pyarrow.fs).

A location is a local path or a URI (`s3://`, `gs://`, `file://`); code never joins paths by hand or opens files
by name outside this module. The layout of a sweep, under `<sweep.storage>/<sweep.name>/`:

    runs/<segment>/history.json             every metrics report of a segment            SweepPaths.history
    runs/<segment>/step-00000040/           a checkpoint (Ray Train's folder name)        SweepPaths.checkpoint
        meta.json                           typed meta (raybiphase.checkpoint_meta)       meta_path(ckpt)
        hf/                                 save_pretrained export                        hf_dir(ckpt)
    finetune/records/<trial>.json           one record per finished fine-tuning trial    SweepPaths.finetune
    pretrain.parquet/, finetune.parquet/    part-<ns>-<id>.parquet files, one per append  SweepPaths.table(name)
    summary.parquet (one file)              (raybiphase.results.store)                    part_name()
    lease/                                  the driver that holds the sweep (raybiphase.sweep.lease)  SweepPaths.lease
    wandb-logged.json                       the pretraining runs logged to W&B            SweepPaths.wandb_logged
    report/report.md and its PNGs                                                         SweepPaths.report

Ray Tune's experiment folders are not among them: they stay on the driver's own disk (raybiphase.finetune.tuner).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow.fs as pafs

from raybiphase.errors import DamagedFile, UserError, env_number
from raybiphase.failures import final
from raybiphase.outages import OUTAGE_ENV, OUTAGES, StorageOutage, minutes

META = "meta.json"
HF_DIR = "hf"
HISTORY = "history.json"
PROGRESS_FILE = "progress.json"  # a run's latest progress beat (raybiphase.telemetry.progress)
CHECKPOINT_DIR = "step-{:08d}"
PRETRAIN_FILE, FINETUNE_FILE, SUMMARY_FILE = "pretrain.parquet", "finetune.parquet", "summary.parquet"
STAGES_FILE = "stages.parquet"  # sweep.stages by_size: each size's arms launched or skipped, decided once
PART_PREFIX, PART_SUFFIX, LEASE_DIR = "part-", ".parquet", "lease"  # an appended table's parts; a sweep's lease
RUN_INFO = "sweep.json"  # the report's header: spec, code, hardware, protocol (raybiphase.results.html)
WANDB_LOGGED = "wandb-logged.json"  # the pretraining runs a sweep has logged to W&B, each once
REPORT_DIR, REPORT_MD, REPORT_HTML = "report", "report.md", "report.html"
DAMAGED_DIR = "damaged"  # files `raybiphase repair` could not read, moved aside, never deleted
RECORDS = "records"  # one JSON record per finished fine-tuning trial, under the fan-out's experiment folder
CONTROLS, EXPORTED = "controls", "exported.json"  # the untrained controls' exports, and the mark of a finished one

Location = str | os.PathLike
T = TypeVar("T")
RETRY_SECONDS: float | None = None
"""How long a bucket operation keeps retrying a transient failure (a dropped connection, a server restarting, a
5xx), with exponential backoff from 0.5 s: RAYBIPHASE_STORAGE_RETRY_S (default 120; 0: no retry) unless set here,
or, within a sweep, sweep.storage_outage_s (`outage_budget`)."""
_PERMANENT = ("NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchKey",
              "Path does not exist", "not found", "HTTP status 403", "HTTP status 404", "HTTP status 400",
              "Could not create a OAuth2 access token")  # GCS without credentials
log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ retries


def retry_seconds() -> float:
    if RETRY_SECONDS is not None:
        return RETRY_SECONDS
    if os.environ.get(OUTAGE_ENV):
        return env_number(OUTAGE_ENV, 900.0)
    return env_number("RAYBIPHASE_STORAGE_RETRY_S", 120.0)


def budget_setting() -> str:
    """The name of the setting `retry_seconds` comes from, for the lines that say what bounds a wait."""
    return "sweep.storage_outage_s" if RETRY_SECONDS is None and os.environ.get(OUTAGE_ENV) else \
        "RAYBIPHASE_STORAGE_RETRY_S"


def transient(err: BaseException) -> bool:
    """An object-store error worth retrying: pyarrow's OSError for a connection refused, reset or timed out, or a
    server error; not a missing bucket or key, a denied request, bad credentials, or what the failure policy calls
    final (an outage already waited out: raybiphase.failures.final)."""
    if not isinstance(err, OSError) or isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError,
                                                        NotADirectoryError)) or final(err):
        return False
    text = str(err)
    return not any(marker in text for marker in _PERMANENT)


def retrying(seconds: float | None = None, *, quiet: bool = False) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Retry a function whose first argument is a location, when that is a URI and the failure is `transient`:
    backoff 0.5, 1, 2, 4 ... s (at most 16 s a wait) while the bucket has been unreachable for less than `seconds`
    (default `retry_seconds()`), saying so as `Outages` does; then a StorageOutage naming the location and the
    setting. Local paths are never retried. `quiet`: a check that ends in one line of its own (the pre-flight
    probes): it says nothing, counts from its own start and raises the last error as it is."""

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(location, *args, **kwargs):
            budget = retry_seconds() if seconds is None else seconds
            started, wait = time.monotonic(), 0.5
            remote = next((str(a) for a in (location, *args) if isinstance(a, (str, os.PathLike)) and is_uri(a)),
                          None)
            bucket = remote and bucket_of(remote)
            while True:
                try:
                    result = fn(location, *args, **kwargs)
                except OSError as err:
                    if not (remote and transient(err)) or budget <= 0:
                        raise
                    began = started if quiet else min(started, OUTAGES.failed(bucket, fn.__name__, remote, err,
                                                                              budget, budget_setting()))
                    left = began + budget - time.monotonic()
                    if left <= 0:
                        if quiet:
                            raise
                        reason = " ".join(str(err).split())[:200]
                        raise StorageOutage(f"storage: {remote} unreachable for {minutes(budget)} "
                                            f"({budget_setting()} = {budget:g} s; raise it to wait longer): "
                                            f"{reason}") from None
                    time.sleep(min(wait, left))
                    wait = min(wait * 2, 16.0)
                    continue
                if bucket and not quiet:
                    OUTAGES.reached(bucket)
                return result

        return wrapper

    return decorate


# ------------------------------------------------------------------------------------------------ locations


def is_uri(location: Location) -> bool:
    return "://" in str(location)


def bucket_of(uri: Location) -> str:
    """scheme://bucket of a URI."""
    scheme, rest = str(uri).split("://", 1)
    return f"{scheme}://{rest.split('/', 1)[0]}"


def absolute(location: Location) -> str:
    """A URI as given (no trailing slash), a local path made absolute (Ray refuses relative storage paths, and
    trials run in other working directories)."""
    if is_uri(location):
        return str(location).rstrip("/")
    return str(Path(location).expanduser().resolve())


def join(base: Location, *parts: str) -> str:
    """base / part / ... for a local path or a URI."""
    if is_uri(base):
        return "/".join([str(base).rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(base, *parts))


def filesystem(location: Location) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem serving `location` and the path inside it. An S3 one makes each request once: the
    retries are `retrying`'s (logged, with their own budget), not the AWS SDK's silent ones on top."""
    if not is_uri(location):
        return pafs.LocalFileSystem(), str(Path(location).expanduser().absolute())
    fs, path = pafs.FileSystem.from_uri(str(location))
    if isinstance(fs, pafs.S3FileSystem):
        _, (settings,) = fs.__reduce__()
        fs = pafs.S3FileSystem(**settings, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    elif isinstance(fs, pafs.GcsFileSystem):  # its own default retries for 15 minutes, silently
        _, (settings,) = fs.__reduce__()
        settings = {key: value for key, value in settings.items() if value not in ("", None)}
        fs = pafs.GcsFileSystem(**{**settings, "retry_time_limit": datetime.timedelta(seconds=1)})
    return fs, path


@retrying()
def unchanged_s(location: Location) -> float | None:
    """Seconds since the file at `location` was last written (its modification time, on this machine's clock);
    None when it is gone or its store does not say."""
    fs, path = filesystem(location)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound or info.mtime is None:
        return None
    return (datetime.datetime.now(datetime.UTC) - info.mtime.astimezone(datetime.UTC)).total_seconds()


@retrying()
def exists(location: Location) -> bool:
    fs, path = filesystem(location)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


@retrying()
def is_file(location: Location) -> bool:
    fs, path = filesystem(location)
    return fs.get_file_info(path).type == pafs.FileType.File


@retrying()
def read_json(location: Location) -> Any | None:
    """The JSON document at `location`, or None when there is none; DamagedFile, naming it, when it is not JSON."""
    fs, path = filesystem(location)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as handle:
        data = handle.read()
    try:
        return json.loads(data.decode())
    except ValueError as err:  # not JSON, or not UTF-8
        raise DamagedFile(f"{location}: damaged, not JSON ({' '.join(str(err).split())[:80]}); move it away and run "
                          "the same command again (a sweep rebuilds what it can from its checkpoints and records, "
                          "and trains again only what they do not hold)", str(location)) from None


def write_json(location: Location, document: Any) -> None:
    """Write a whole JSON document (`write_bytes`): a reader sees the old or the new document."""
    write_bytes(location, json.dumps(document).encode())


@retrying()
def read_bytes(location: Location) -> bytes:
    fs, path = filesystem(location)
    with fs.open_input_stream(path) as handle:
        return handle.read()


FENCES: list[Callable[[str], None]] = []
"""Checks every write and removal passes first (raybiphase.locks.fence: a sweep folder whose lease was lost)."""


def check_fence(location: Location) -> None:
    for check in list(FENCES):
        check(str(location))


@retrying()
def write_bytes(location: Location, data: bytes) -> None:
    """Write a whole file (an object store publishes it whole when the stream closes; a local file goes through a
    temporary sibling). Refused in a sweep folder whose lease was lost (`FENCES`)."""
    check_fence(location)
    fs, path = filesystem(location)
    parent, name = path.rsplit("/", 1)
    fs.create_dir(parent, recursive=True)
    target = f"{parent}/.{name}.tmp" if not is_uri(location) else path
    with fs.open_output_stream(target) as handle:
        handle.write(data)
    if target != path:
        fs.move(target, path)


@retrying()
def delete_file(location: Location) -> None:
    """Remove one file if it exists."""
    check_fence(location)
    fs, path = filesystem(location)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


def part_name() -> str:
    """A new part file's name: the writer's clock in ns (parts sort in the order written, give or take clock
    skew) and a random suffix (two writers never pick one name)."""
    return f"{PART_PREFIX}{time.time_ns():020d}-{uuid.uuid4().hex[:12]}{PART_SUFFIX}"


@retrying()
def _entries(location: Location, kind: pafs.FileType) -> dict[str, int]:
    fs, path = filesystem(location)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return {info.base_name: info.size for info in infos if info.type == kind}


def list_files(location: Location) -> dict[str, int]:
    """Files directly under a folder, name -> size in bytes; {} when the folder does not exist."""
    return _entries(location, pafs.FileType.File)


def list_folders(location: Location) -> list[str]:
    """Names of the folders directly under `location`, sorted; [] when it does not exist."""
    return sorted(_entries(location, pafs.FileType.Directory))


def list_tree(location: Location) -> dict[str, int]:
    """Every file under a folder, at any depth: relative path -> size in bytes."""
    out = list_files(location)
    for folder in list_folders(location):
        out.update({f"{folder}/{name}": size for name, size in list_tree(join(location, folder)).items()})
    return out


def check_reachable(location: Location, key: str) -> None:
    """Look up the bucket of a URI once, failing fast as `check_writable` does; a UserError naming `key` when it
    cannot be reached or does not exist. Writes nothing (what a dry run checks). A local path passes."""
    if not is_uri(location):
        return
    bucket = bucket_of(location)
    try:
        found = retrying(min(retry_seconds(), 10.0), quiet=True)(exists.__wrapped__)(bucket)
    except OSError as err:
        raise UserError(f"{key}: cannot reach {location}: {' '.join(str(err).split())[:300]}") from None
    if not found:
        raise UserError(f"{key}: cannot reach {location}: bucket {bucket} does not exist")


def check_writable(location: Location, key: str) -> None:
    """Write and remove a probe under `location`; a UserError naming `key` when that fails (a bucket that does not
    exist or denies access, missing credentials), before anything else is written."""

    probe = join(location, f".probe-{uuid.uuid4().hex[:8]}")
    try:
        retrying(min(retry_seconds(), 10.0), quiet=True)(write_bytes.__wrapped__)(probe, b"")  # a down endpoint fails fast
        fs, path = filesystem(probe)
        fs.delete_file(path)
    except OSError as err:
        reason = " ".join(str(err).split())[:300]
        raise UserError(f"{key}: cannot write to {location}: {reason}") from None


@retrying()
def delete(location: Location) -> None:
    """Remove a folder and everything under it, if it exists."""
    check_fence(location)
    fs, path = filesystem(location)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir(path)


# ------------------------------------------------------------------------------------------------ checkpoints


def checkpoint_name(step: int) -> str:
    return CHECKPOINT_DIR.format(step)


def checkpoint_steps(run_dir: Location) -> list[int]:
    """The steps of the checkpoint folders under a run's folder, in order (committed or not)."""
    return sorted(s for s in map(step_of, list_folders(run_dir)) if s is not None)


def step_of(folder: str) -> int | None:
    """The step of a checkpoint folder's name (`step-00000800` -> 800); None for any other name."""
    prefix, _, digits = folder.rstrip("/").rsplit("/", 1)[-1].partition("-")
    return int(digits) if prefix == "step" and digits.isdigit() else None


def parent(location: Location) -> str:
    """The folder holding `location` (a path or a URI)."""
    return str(location).rstrip("/").rsplit("/", 1)[0]


def basename(location: Location) -> str:
    """The last part of a path or a URI."""
    return str(location).rstrip("/").rsplit("/", 1)[-1]


def sweep_root(checkpoint: Location) -> str:
    """<storage>/<sweep> of a checkpoint at <storage>/<sweep>/runs/<run or segment>/step-N."""
    return parent(parent(parent(checkpoint)))


def meta_path(checkpoint: Location) -> str:
    return join(checkpoint, META)


def hf_dir(checkpoint: Location) -> str:
    return join(checkpoint, HF_DIR)


def is_checkpoint(location: Location) -> bool:
    """A raybiphase checkpoint (it has meta.json, written last: raybiphase.pretrain.checkpoint.commit), local or in
    a bucket."""
    return is_file(meta_path(location))


# ------------------------------------------------------------------------------------------------ a sweep


@dataclass(frozen=True)
class SweepPaths:
    """The folders and files of one sweep under `root` = <sweep.storage>/<sweep.name> (absolute or a URI)."""

    root: str

    @classmethod
    def of(cls, storage: Location, sweep_name: str) -> SweepPaths:
        return cls(join(absolute(storage), sweep_name))

    @property
    def runs(self) -> str:
        """Ray Train's storage_path: one folder per run or segment."""
        return join(self.root, "runs")

    def run_dir(self, name: str) -> str:
        return join(self.runs, name)

    def history(self, name: str) -> str:
        return join(self.run_dir(name), HISTORY)

    def progress(self, name: str) -> str:
        return join(self.run_dir(name), PROGRESS_FILE)

    def checkpoint_steps(self, name: str) -> list[int]:
        """The steps of a run's checkpoint folders, in order (finished or not)."""
        return checkpoint_steps(self.run_dir(name))

    @property
    def wandb_logged(self) -> str:
        return join(self.root, WANDB_LOGGED)

    def control(self, name: str) -> str:
        """The folder of an untrained control's export (its HF folder is `hf` inside)."""
        return join(self.root, CONTROLS, name)

    def checkpoint(self, name: str, step: int) -> str:
        return join(self.run_dir(name), checkpoint_name(step))

    def finetune(self, experiment: str) -> str:
        return join(self.root, experiment)

    def table(self, file: str) -> str:
        """One of PRETRAIN_FILE, FINETUNE_FILE, SUMMARY_FILE, STAGES_FILE."""
        return join(self.root, file)

    @property
    def damaged(self) -> str:
        """Where `raybiphase repair` moves the files it cannot read, at their paths relative to the root."""
        return join(self.root, DAMAGED_DIR)

    @property
    def lease(self) -> str:
        """The folder of the lease of the driver that holds this sweep (raybiphase.sweep.lease)."""
        return join(self.root, LEASE_DIR)

    @property
    def report(self) -> str:
        return join(self.root, REPORT_DIR)

    @property
    def run_info(self) -> str:
        return join(self.root, RUN_INFO)
