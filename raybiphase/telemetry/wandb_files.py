"""What an offline W&B run wrote: the records of its run-<id>.wandb file (a log of wandb's protobuf records in
32 KiB blocks, as `wandb sync` reads it), to copy a run's folder only once it is whole and to check what it holds.

    wait_whole(folder)          # True once the run's exit record is written (wandb writes after finish() returns)
    logged(folder)["history"]   # [{"_step": 1, "tokens_seen": 512, "train/mlm_loss": 6.0}, ...]
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32768
HEADER = 7  # ":W&B", magic, version


def records(path: Path) -> list:
    """Every complete record of a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2  # lazy: wandb loads only where a project is set

    data, out, chunks, pos = path.read_bytes(), [], b"", HEADER
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data) or (length == 0 and kind == 0):
            break
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            out.append(record)
            chunks = b""
        elif kind == 2:  # FIRST
            chunks = data[pos - length:pos]
    return out


def run_file(folder: Path) -> Path | None:
    return next(folder.glob("run-*.wandb"), None)


def wait_whole(folder: Path, timeout: float = 60.0) -> bool:
    """Wait until the run's log ends with its exit record (the last one wandb writes); False after `timeout`."""
    deadline = time.time() + timeout
    while True:
        path = run_file(folder)
        if path is not None and any(r.WhichOneof("record_type") == "exit" for r in records(path)):
            return True
        if time.time() > deadline:
            return False
        time.sleep(0.2)


def logged(folder: Path, timeout: float = 60.0) -> dict:
    """What a finished offline run holds: {"config", "history" (list of dicts), "summary", "metrics" (the
    define_metric records), "artifacts" (type, name, references), "exit"}; waits for wandb's service to write the
    run's exit record (it may come after finish() returns on a loaded machine)."""
    wait_whole(folder, timeout)
    return _parse(records(run_file(folder)))


def _parse(recs: list) -> dict:
    out = {"config": {}, "history": [], "summary": {}, "metrics": [], "artifacts": [], "exit": False, "run": None}
    for rec in recs:
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"] = rec.run
            out["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "history":
            out["history"].append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            out["summary"].update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                   for i in rec.summary.update})
        elif kind == "metric":
            out["metrics"].append(rec.metric)
        elif kind == "artifact":
            art = rec.artifact
            out["artifacts"].append({"type": art.type, "name": art.name,
                                     "refs": [e.ref for e in art.manifest.contents],
                                     "metadata": json.loads(art.metadata or "{}")})
        elif kind == "exit":
            out["exit"] = True
    return out
