"""When a run evaluates, saves and keeps a checkpoint: one policy, read by the workers that train (which steps
they evaluate and save) and by the sweep's driver (which checkpoints it deletes once a segment is done).

A *milestone* is a step that ends a phase, starts the learning-rate decay, ends the run or segment, or is exported
as an HF folder: it is always evaluated and saved, and its checkpoint is never deleted (a child segment or a
resume starts there, fine-tuning reads the exports, and the report compares runs at the phase boundaries).
Between milestones a step is evaluated every `train.eval_every` and saved every `train.checkpoint_every`; once a
segment is done, its periodic checkpoints other than the last `train.keep_checkpoints` are deleted (None keeps
them all). Pure: planning and pruning import no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from raybiphase.config import RunConfig
from raybiphase.phases import Schedule


@dataclasses.dataclass(frozen=True)
class CheckpointPolicy:
    """The steps of one run (or one segment: up to `stop_at`) that are evaluated, saved and kept."""

    stop_at: int
    """The last step trained: the run's end, or the segment's."""
    eval_every: int
    checkpoint_every: int
    keep_last: int | None
    """Periodic checkpoints kept once the segment is done (train.keep_checkpoints; None: all)."""
    exports: frozenset[int]
    """Steps exported as HF folders (train.export_steps and the run's end, or what a segment's runs fine-tune)."""
    milestones: frozenset[int]
    """Always evaluated, saved and kept (module docstring)."""

    @classmethod
    def of(cls, run: RunConfig, *, stop_at: int | None = None,
           exports: Iterable[int] | None = None) -> CheckpointPolicy:
        """The policy of `run`, trained up to `stop_at` (None: its end), exporting `exports` (None: its
        train.export_steps and its end). `train.checkpoint_every` must be resolved (not 'auto')."""
        train, schedule = run.train, Schedule.from_config(run)
        if not isinstance(train.checkpoint_every, int):
            raise ValueError(f"train.checkpoint_every={train.checkpoint_every!r}: resolve 'auto' first")
        stop = min(stop_at or schedule.total_steps, schedule.total_steps)
        exported = frozenset(exports) if exports is not None else frozenset({*train.export_steps,
                                                                            schedule.total_steps})
        milestones = {*schedule.boundaries[1:], schedule.decay_start, stop, *exported}
        return cls(stop_at=stop, eval_every=train.eval_every, checkpoint_every=train.checkpoint_every,
                   keep_last=train.keep_checkpoints, exports=exported,
                   milestones=frozenset(step for step in milestones if 0 < step <= stop))

    def evaluates(self, step: int) -> bool:
        return step % self.eval_every == 0 or step in self.milestones

    def saves(self, step: int) -> bool:
        return step % self.checkpoint_every == 0 or step in self.milestones

    def kept(self, steps: Iterable[int]) -> set[int]:
        """Of the checkpoint `steps` a finished segment holds, those kept: its milestones and its last
        `keep_last` (all of them when keep_last is None)."""
        steps = sorted(steps)
        if self.keep_last is None:
            return set(steps)
        last = steps[len(steps) - self.keep_last:] if self.keep_last else []
        return {step for step in steps if step in self.milestones} | set(last)
