"""Local disk space, checked before a sweep writes anything (no torch, no Ray): what its plan writes on this machine
against what the disk holds free (shutil.disk_usage), refused in one line naming the folder, its free bytes and
the need. Two places are counted, and added up when they share a disk:

- `sweep.storage`, when it is a local folder: every checkpoint the plan keeps (its policy's milestones and last
  `train.keep_checkpoints`, raybiphase.pretrain.policy), plus the periodic ones of the largest segment until it is
  pruned, less what an earlier invocation already wrote there;
- the temp folder (TMPDIR), when the workers run on this machine: the checkpoint each running segment writes there
  before its upload (`resources.max_concurrent` at once).

A checkpoint holds 12 bytes per parameter (fp32 weights and AdamW's two moments; the dry run's stall uses the
same), an export step's HF folder 4 more (fp32 weights). A bucket is never counted: its space is the provider's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from raybiphase import storage
from raybiphase.config import RunConfig, SweepSpec
from raybiphase.config.estimates import CHECKPOINT_BYTES_PER_PARAM, vocab_size
from raybiphase.config.sizes import SIZES
from raybiphase.errors import UserError
from raybiphase.planning.plan import Plan, Segment
from raybiphase.pretrain.policy import CheckpointPolicy

HF_BYTES_PER_PARAM = 4
"""An HF export (save_pretrained of the trained fp32 weights)."""


@dataclass(frozen=True)
class Need:
    """Bytes the plan writes under `path`, the setting that puts them there, and what they are."""

    setting: str
    path: str
    bytes: int
    what: str


def checkpoint_bytes(config: RunConfig, *, export: bool) -> int:
    params = SIZES[config.model.size].params(vocab_size(config))
    return params * (CHECKPOINT_BYTES_PER_PARAM + (HF_BYTES_PER_PARAM if export else 0))


def saved_steps(segment: Segment) -> tuple[CheckpointPolicy, list[int]]:
    """The segment's policy and the steps in (start, end] it saves a checkpoint at."""
    policy = CheckpointPolicy.of(segment.config, stop_at=segment.end, exports=segment.exports)
    every = policy.checkpoint_every
    periodic = range((segment.start // every + 1) * every, segment.end + 1, every)
    return policy, sorted({*periodic, *(m for m in policy.milestones if segment.start < m <= segment.end)})


def storage_bytes(plan: Plan) -> tuple[int, int]:
    """(checkpoints the sweep's folder holds at most, in bytes; their count): every segment's kept ones and the
    largest segment's periodic ones before pruning."""
    kept_bytes, kept_count, unpruned = 0, 0, 0
    for segment in plan.segments.values():
        policy, steps = saved_steps(segment)
        kept = policy.kept(steps)
        sizes = {step: checkpoint_bytes(segment.config, export=step in policy.exports) for step in steps}
        kept_bytes, kept_count = kept_bytes + sum(sizes[s] for s in kept), kept_count + len(kept)
        unpruned = max(unpruned, sum(size for step, size in sizes.items() if step not in kept))
    return kept_bytes + unpruned, kept_count


def needs(plan: Plan, spec: SweepSpec) -> list[Need]:
    """What the plan writes on this machine: under a local sweep.storage (less what is already there) and, when
    the workers run here (no RAY_ADDRESS), in the temp folder."""
    out = []
    if not storage.is_uri(spec.sweep.storage):
        total, count = storage_bytes(plan)
        root = Path(storage.SweepPaths.of(spec.sweep.storage, spec.sweep.name).runs)
        written = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0
        out.append(Need("sweep.storage", spec.sweep.storage, max(0, total - written),
                        f"{count:,} checkpoints kept at 12 bytes a parameter, 16 with an HF export"
                        + (f", less {_size(written)} already written" if written else "")))
    if not os.environ.get("RAY_ADDRESS"):
        largest = max(checkpoint_bytes(s.config, export=True) for s in plan.segments.values())
        at_once = min(spec.run.resources.max_concurrent, len(plan.segments))
        out.append(Need("TMPDIR", tempfile.gettempdir(), largest * at_once,
                        f"{at_once} segment(s) at once staging a checkpoint before its upload"))
    return out


def check_space(plan: Plan, spec: SweepSpec) -> None:
    """A UserError naming the folder, its free bytes and the plan's need when a disk holds less than the plan
    writes on it (the needs of folders on one disk added up)."""
    disks: dict[int, list[Need]] = {}
    for need in needs(plan, spec):
        disks.setdefault(os.stat(_existing(need.path)).st_dev, []).append(need)
    for shared in disks.values():
        total, free = sum(n.bytes for n in shared), shutil.disk_usage(_existing(shared[0].path)).free
        if total > free:
            where = " and ".join(f"{n.setting} ({n.path})" for n in shared)
            what = "; ".join(f"{_size(n.bytes)} for {n.what}" for n in shared)
            raise UserError(f"{where}: {_size(free)} free ({free:,} bytes), the plan needs {_size(total)} "
                            f"({total:,} bytes): {what}; free space, keep fewer checkpoints "
                            "(train.keep_checkpoints, train.checkpoint_every) or write to a bucket")


def _existing(path: str) -> str:
    """`path` or its nearest folder that exists (a sweep folder not made yet is on its parent's disk)."""
    found = Path(path).absolute()
    while not found.exists():
        found = found.parent
    return str(found)


def _size(count: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 1e3:.1f} kB"
