"""Phases as data plus one warmup-stable-decay (WSD) learning rate over the whole run, as pieces (pure: no torch).

A run is a list of phases (CLM for N steps, MLM at ratio r for M steps, any number, in order) and one schedule:
linear warmup from 0 to the peak over `warmup_steps`, constant, then linear decay to 0 over the last
`decay_steps` (the paper: 2k/2k around a 42k run). `schedule.at(step)` gives the phase and the LR of step `step`
(0-based, the LR applied by that step's optimizer update). Until the decay starts the LR does not depend on the
run's length, which is what lets the sweep share prefixes between budgets.

The schedule is piecewise: `Schedule.pieces()` cuts the run where anything a step does changes its rule (a phase
boundary, an optimizer reset's first step, the end of the warmup or of a re-warmup, the start of the decay). Within
one `Piece` every step has the same `StepKind` (objective, reset, frozen blocks, per-sequence masking range), and its
masking ratio and learning rate are one closed form of the step (`MaskRatio`, `LrRule`), evaluated alike on a step
or a numpy array of steps, so the planner compares runs piece by piece and the loop asks the same rules step by step.

    schedule = Schedule.from_config(run)
    phase, lr = schedule.at(1234)
    schedule.pieces()   # (Piece(start=0, end=2000, kind=StepKind(objective='clm'), ...), ...)
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from dataclasses import dataclass

from raybiphase.config import MASKED, Phase, RunConfig


@dataclass(frozen=True)
class StepKind:
    """What a step does besides its masking ratio and learning rate. Two steps can be the same step only when their
    kinds are equal: a phase setting that changes what a step does is a field here, and sharing follows it."""

    objective: str
    reset: bool = False
    """AdamW's moments are reset before this step (the first step of a phase with `optimizer: reset`)."""
    frozen_layers: tuple[int, ...] = ()
    mask_ratio_range: tuple[float, float] | None = None
    """Each sequence's masking ratio drawn from [low, high] (a masked phase without a fixed ratio)."""


@dataclass(frozen=True)
class LrRule:
    """The learning rate over a piece: peak x (offset + slope x step) / divisor, times (step - start + 1) / steps
    over a re-warmup (`rewarmup` = (start, steps)). Integer arithmetic first, then the same float operations in the
    same order for a step and for a numpy array of steps, so both give bit-identical rates."""

    peak: float
    offset: int = 1
    slope: int = 0
    divisor: int = 1
    rewarmup: tuple[int, int] | None = None

    def at(self, step):
        rate = self.peak * (self.offset + self.slope * step) / self.divisor
        if self.rewarmup is not None:
            start, steps = self.rewarmup
            rate = rate * ((step - start + 1) / steps)
        return rate


def wsd_rule(step: int, *, peak: float, total: int, warmup: int, decay: int) -> LrRule:
    """The WSD rule in force at `step` of a run of `total` updates: warmup, stable or decay."""
    if step < warmup:
        return LrRule(peak, 1, 1, warmup)  # peak x (step + 1) / warmup
    if step >= total - decay:
        return LrRule(peak, total, -1, decay + 1)  # peak x (total - step) / (decay + 1)
    return LrRule(peak)


def wsd_lr(step: int, *, peak: float, total: int, warmup: int, decay: int) -> float:
    """LR of the update with 0-based index `step` in a run of `total` updates.

    Until the decay starts it depends on neither `total` nor `decay`, which lets sweeps share the prefix of runs
    of different lengths; the step after the last would be 0.
    """
    return wsd_rule(step, peak=peak, total=total, warmup=warmup, decay=decay).at(step)


@dataclass(frozen=True)
class MaskRatio:
    """A masked phase's ratio over its steps: `ratio`, or linear from `ratio` at the phase's first step (`start`) to
    `end` at its last (`steps` long), as raybiphase.data.masking.MaskingSpec.row_ratios computes it."""

    ratio: float
    end: float | None = None
    start: int = 0
    steps: int = 1

    def at(self, step):
        if self.end is None:
            return self.ratio
        return self.ratio + (self.end - self.ratio) * (step - self.start) / max(self.steps - 1, 1)


@dataclass(frozen=True)
class Piece:
    """Steps [start, end) of a run that share one kind, one masking rule and one LR rule (module docstring)."""

    start: int
    end: int
    kind: StepKind
    lr: LrRule
    mask_ratio: MaskRatio | None = None
    """None: CLM, or a per-sequence range (kind.mask_ratio_range)."""


@dataclass(frozen=True)
class Schedule:
    phases: tuple[Phase, ...]
    peak_lr: float
    warmup_steps: int
    decay_steps: int

    @classmethod
    def from_config(cls, cfg: RunConfig) -> Schedule:
        return cls(cfg.phases.resolved(), cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.decay_steps)

    @functools.cached_property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.phases)

    @functools.cached_property
    def boundaries(self) -> tuple[int, ...]:
        """First step of each phase, and the end."""
        out = [0]
        for phase in self.phases:
            out.append(out[-1] + phase.steps)
        return tuple(out)

    @property
    def decay_start(self) -> int:
        return self.total_steps - self.decay_steps

    def phase_index(self, step: int) -> int:
        return bisect.bisect_right(self.boundaries, step) - 1

    @functools.cached_property
    def _piece_starts(self) -> list[int]:
        return [piece.start for piece in self.pieces()]

    def piece_index(self, step: int) -> int:
        """The index in `pieces()` of the piece holding `step`, a step of the run."""
        return bisect.bisect_right(self._piece_starts, step) - 1

    def piece_at(self, step: int) -> Piece:
        """The piece holding `step`, a step of the run."""
        return self.pieces()[self.piece_index(step)]

    def lr(self, step: int) -> float:
        """The run's WSD rate at `step` (a step of the run), times a phase's re-warmup ramp after an optimizer
        reset."""
        return self.piece_at(step).lr.at(step)

    def resets_optimizer(self, step: int) -> bool:
        """Whether AdamW's moments are reset before `step` (the first step of a phase with `optimizer: reset`)."""
        index = self.phase_index(step)
        return step == self.boundaries[index] and self.phases[index].optimizer == "reset"

    def at(self, step: int) -> tuple[Phase, float]:
        """(phase, learning rate) of optimizer step `step`."""
        if not 0 <= step < self.total_steps:
            raise IndexError(f"step {step} is outside the run's {self.total_steps} steps")
        return self.phases[self.phase_index(step)], self.lr(step)

    def pieces(self) -> tuple[Piece, ...]:
        """The run's pieces in order, covering [0, total_steps) (module docstring); one per rule, so their number
        grows with the phases, not the steps."""
        return self._pieces

    @functools.cached_property
    def _pieces(self) -> tuple[Piece, ...]:
        total, out = self.total_steps, []
        for phase, start, end in zip(self.phases, self.boundaries, self.boundaries[1:]):
            ramp = (start, phase.rewarmup_steps) if phase.rewarmup_steps else None
            cuts = {start, end, self.warmup_steps, total - self.decay_steps}
            cuts |= {start + 1} if phase.optimizer == "reset" else set()
            cuts |= {start + ramp[1] - 1} if ramp else set()  # from there on the ramp's factor is exactly 1
            cuts = sorted(c for c in cuts if start <= c <= end)
            for low, high in zip(cuts, cuts[1:]):
                rule = wsd_rule(low, peak=self.peak_lr, total=total, warmup=self.warmup_steps,
                                decay=self.decay_steps)
                if ramp and low < start + ramp[1] - 1:
                    rule = dataclasses.replace(rule, rewarmup=ramp)
                out.append(Piece(low, high, _kind(phase, reset=low == start and phase.optimizer == "reset"), rule,
                                 _mask_ratio(phase, start)))
        return tuple(out)


def _kind(phase: Phase, *, reset: bool) -> StepKind:
    masked = phase.objective in MASKED
    return StepKind(phase.objective, reset, tuple(phase.frozen_layers),
                    tuple(phase.mask_ratio_range) if masked and phase.mask_ratio_range is not None else None)


def _mask_ratio(phase: Phase, start: int) -> MaskRatio | None:
    if phase.objective not in MASKED or phase.mask_ratio_range is not None:
        return None
    if phase.mask_ratio_end is None:
        return MaskRatio(phase.mask_ratio)
    return MaskRatio(phase.mask_ratio, phase.mask_ratio_end, start, phase.steps)
