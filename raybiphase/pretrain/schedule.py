"""Phases as data plus one warmup-stable-decay (WSD) learning rate over the whole run.

A run is a list of phases (CLM for N steps, MLM at ratio r for M steps, any number, in order) and one schedule:
linear warmup from 0 to the peak over `warmup_steps`, constant, then linear decay to 0 over the last
`decay_steps` (the paper: 2k/2k around a 42k run). `schedule.at(step)` gives the phase and the LR of step `step`
(0-based, the LR applied by that step's optimizer update). Until the decay starts the LR does not depend on the
run's length, which is what lets the sweep share prefixes between budgets.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from raybiphase.config import Phase, RunConfig
from raybiphase.optim import wsd_lr


@dataclass(frozen=True)
class Schedule:
    phases: tuple[Phase, ...]
    peak_lr: float
    warmup_steps: int
    decay_steps: int

    @classmethod
    def from_config(cls, cfg: RunConfig) -> "Schedule":
        return cls(cfg.phases.resolved(), cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.decay_steps)

    @property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.phases)

    @property
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

    def lr(self, step: int) -> float:
        """The run's WSD rate at `step`, times a phase's re-warmup ramp after an optimizer reset."""
        rate = wsd_lr(step, peak=self.peak_lr, total=self.total_steps, warmup=self.warmup_steps,
                      decay=self.decay_steps)
        index = self.phase_index(step)
        phase = self.phases[min(index, len(self.phases) - 1)]
        if phase.rewarmup_steps:
            rate *= min(1.0, (step - self.boundaries[index] + 1) / phase.rewarmup_steps)
        return rate

    def resets_optimizer(self, step: int) -> bool:
        """Whether AdamW's moments are reset before `step` (the first step of a phase with `optimizer: reset`)."""
        index = self.phase_index(step)
        return step == self.boundaries[index] and self.phases[index].optimizer == "reset"

    def at(self, step: int) -> tuple[Phase, float]:
        """(phase, learning rate) of optimizer step `step`."""
        if not 0 <= step < self.total_steps:
            raise IndexError(f"step {step} is outside the run's {self.total_steps} steps")
        return self.phases[self.phase_index(step)], self.lr(step)
