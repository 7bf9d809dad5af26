"""The one contract between whoever starts pretraining (`raybiphase pretrain`, the sweep driver) and the Ray Train
workers: a `SegmentJob` is a worker's whole input, typed, and crosses the worker's door as it is."""

from __future__ import annotations

import dataclasses

from raybiphase import storage
from raybiphase.config import RunConfig
from raybiphase.pretrain.policy import CheckpointPolicy


@dataclasses.dataclass(frozen=True, kw_only=True)
class SegmentJob:
    """One run, or one segment of a sweep's tree of shared prefixes, as its workers receive it."""

    run: RunConfig
    """The run's config (a segment passes the config of one run through it: they agree up to `stop_at`)."""
    name: str
    """The run's or segment's name: its folder under <sweep>/runs/ and Ray Train's run name."""
    run_dir: str
    """<sweep>/runs/<name>: checkpoints, history.json, progress.json."""
    data_dir: str
    """The prepared shards (raybiphase.data.prepare)."""
    resume_from: str | None = None
    """A parent segment's checkpoint to continue from (same schedule); the segment's own newest committed one wins."""
    stop_at: int | None = None
    """The segment's last step; None: the run's end."""
    exports: tuple[int, ...] | None = None
    """Steps exported as HF folders; None: train.export_steps and the run's end (a segment passes the union of what
    its runs fine-tune)."""
    serves: tuple[str, ...] = ()
    """The runs whose weights these checkpoints are, recorded in their meta."""
    wandb: dict | None = None
    """W&B settings ({"project", "group", "mode", "sync_to"}: raybiphase.telemetry.wandb; a sweep's segment adds
    "kind" and "lineage": raybiphase.telemetry.wandb_live) or None."""
    progress_every: float = 0.0
    """Seconds between rank 0's progress beats (raybiphase.telemetry.progress); 0: none."""

    @property
    def progress(self) -> str:
        return storage.join(self.run_dir, storage.PROGRESS_FILE)

    def policy(self) -> CheckpointPolicy:
        """What the workers evaluate and save; the sweep's driver prunes by the same (CheckpointPolicy.of)."""
        return CheckpointPolicy.of(self.run, stop_at=self.stop_at, exports=self.exports)
