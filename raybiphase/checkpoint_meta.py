"""A checkpoint's typed meta, read and checked without torch: what the planner, the data budget and the dry run need
of a checkpoint (where its data stopped, the depth of a decoder to continue from), apart from the tensors
(raybiphase.pretrain.checkpoint writes and loads those).

    meta = read_meta("results/quickstart/runs/tiny-clm-0-400-8f7d5072/step-00000200")
    meta.data_end, meta.objective, meta.decayed
    source_end(run.model.init_from)   # the sample a run continuing that checkpoint starts at
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from raybiphase import storage
from raybiphase.config import RunConfig, from_dict
from raybiphase.config.run import check_frozen_layers
from raybiphase.config.sizes import SIZES
from raybiphase.errors import UserError
from raybiphase.phases import Schedule


@dataclass(frozen=True)
class CheckpointMeta:
    """What a checkpoint records besides its tensors; everything else (tokens seen, phase, decayed) follows."""

    run: dict[str, Any]
    """The run config (raybiphase.config.to_dict of a RunConfig)."""
    step: int
    """Optimizer steps done."""
    data_start: int
    """Global sample index of the run's first sample (a continued run carries on its source's stream)."""
    metrics: dict[str, Any]
    """The metrics reported at this step."""
    code_version: str = ""
    """raybiphase version and git commit that wrote it."""
    serves: list[str] = dataclasses.field(default_factory=list)
    """The sweep runs whose weights these are at `step` (a shared segment serves several; `run` is the first's
    config); empty outside a sweep."""
    files: dict[str, int] = dataclasses.field(default_factory=dict)
    """Every file of the checkpoint (relative path -> bytes) when it was committed; loading checks them (empty in
    checkpoints from before this check)."""
    notice: str = ""
    """Why it was written ahead of its schedule: "drain" (Ray drained a worker's node: a spot notice) or "signal"
    (a worker got SIGTERM); empty for a checkpoint its policy was due to write."""
    checksums: dict[str, str] = dataclasses.field(default_factory=dict)
    """SHA-256 of the shards and DCP's index (relative path -> hex digest), each computed by the rank that wrote the
    file before its upload; loading checks them, so damage that keeps a file's size is caught (empty in checkpoints
    from before this check)."""

    @functools.cached_property
    def config(self) -> RunConfig:
        """The run config, validated once (the derived properties below all read it)."""
        return from_dict(RunConfig, self.run)

    @property
    def tokens_seen(self) -> int:
        return self.step * self.config.train.global_batch_tokens

    @property
    def data_end(self) -> int:
        """The next unread sample: where a run continued from this checkpoint starts its stream."""
        return self.config.data_end(self.data_start, self.step)

    @property
    def objective(self) -> str:
        """The objective of the last step taken."""
        schedule = Schedule.from_config(self.config)
        return schedule.phases[schedule.phase_index(max(self.step - 1, 0))].objective

    @property
    def decayed(self) -> bool:
        """Taken after the learning rate started to decay (the paper continues from decayed checkpoints)."""
        return self.step > Schedule.from_config(self.config).decay_start


def read_meta(path: storage.Location) -> CheckpointMeta:
    """The meta of a checkpoint, local or in a bucket; UserError when `path` is not a raybiphase checkpoint."""
    try:
        document = storage.read_json(storage.meta_path(path))
    except ValueError:  # not JSON (storage.DamagedFile)
        raise UserError(f"checkpoint: {storage.meta_path(path)} is corrupt (not JSON)") from None
    if document is None:
        raise UserError(f"checkpoint: {path} is not a raybiphase checkpoint (no {storage.META})")
    fields = {f.name: f for f in dataclasses.fields(CheckpointMeta)}
    required = [name for name, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if not isinstance(document, dict) or name not in document]
    if missing:
        raise UserError(f"checkpoint: {storage.meta_path(path)} is incomplete (no {', '.join(missing)})")
    return CheckpointMeta(**{k: v for k, v in document.items() if k in fields})


def source_end(init_from: str) -> int:
    """model.init_from, checked before anything runs: the sample a run continuing it starts at (a raybiphase
    checkpoint's data end; 0 for an HF decoder's weights); a UserError when it is neither, or cannot be read."""
    try:
        if storage.is_checkpoint(init_from):
            return read_meta(init_from).data_end
        if storage.is_file(storage.join(init_from, "config.json")):
            return 0
    except OSError as err:
        raise UserError(f"model.init_from: cannot read {init_from}: {' '.join(str(err).split())[:200]}") from None
    raise UserError(f"model.init_from: {init_from} is neither a raybiphase checkpoint (no {storage.META}) nor an HF "
                    f"model folder (no config.json)")


def check_blocks(run: RunConfig) -> None:
    """The phases' frozen_layers against the depth of the model the run trains, before anything runs: a decoder's
    in model.init_from (its config's num_hidden_layers) when it starts from one, else model.size's (a raybiphase
    checkpoint holds a model of that size); a ConfigError naming the key."""
    source = run.model.init_from
    if not source or source.startswith("@") or storage.is_checkpoint(source):
        check_frozen_layers(run.phases, SIZES[run.model.size].layers, run.model.size)
        return
    layers = (storage.read_json(storage.join(source, "config.json")) or {}).get("num_hidden_layers")
    if layers is not None:  # no config, or not a decoder's: model.init_from's own check says so (`source_end`)
        check_frozen_layers(run.phases, int(layers), f"the decoder in model.init_from ({source})")
