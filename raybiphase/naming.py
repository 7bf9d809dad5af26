"""Run names in the paper's scheme (the authors' published model names) plus a short hash of the settings that
shape the weights.

    610m-clm-42k                 CLM only, 42k steps
    610m-mlm40-42k               MLM at 40%, 42k steps
    610m-clm-10k-mlm40-42k       10k CLM steps, then MLM 40% up to 42k in total
    610m-clm-dec42k-mlm40-64k    continued from a decayed 42k CLM checkpoint with 22k MLM steps (64k in total)
    610m-mlm40-42k-s1            a pretraining replicate: train.seed 1 (another init and data order)
"""

from __future__ import annotations

import re
from typing import get_args

from raybiphase.config import MASKED, RunConfig, run_hash
from raybiphase.config.run import Objective

_OBJECTIVES = "|".join(get_args(Objective))
PHASE_TAG = re.compile(rf"(?P<objective>{_OBJECTIVES})(?P<percent>\d*)")
LABEL = re.compile(rf"(?P<objective>{_OBJECTIVES})(?P<ratio>u\d+to\d+|\d+)?(?P<end>to\d+)?(?P<reset>r)?"
                   r"(?P<frozen>f\d+(?:to\d+|x)?)?")
"""A phase label with its knobs (`phase_label`): `mlm40to15r` -> ratio 40, end to15, reset; `mlmu15to60`; `clmf6`."""
SOURCE_TAG = re.compile(rf"-(?P<tag>(?:{_OBJECTIVES})\d*)-dec\d")
"""A continued run's source in its name: `610m-clm-dec42k-mlm40-64k` continues a CLM model."""


def phase_tag(objective: str, mask_ratio: float | None = None) -> str:
    """The paper's tag of a phase: `clm`, or `mlm` (`mntp`) and the masking ratio in percent (`mlm40`)."""
    return "clm" if objective == "clm" else f"{objective}{round(mask_ratio * 100)}"


def phase_label(phase) -> str:
    """A resolved phase's tag in a run name: `clm`, `mlm40`, a ratio schedule `mlm40to15`, a per-sequence range
    `mlmu15to60`, masked next-token prediction `mntp40`; an `r` after it when the phase resets the optimizer
    (`mlm40r`); then its frozen blocks (`frozen_tag`)."""
    if phase.objective in MASKED and phase.mask_ratio_range is not None:
        low, high = phase.mask_ratio_range
        tag = f"{phase.objective}u{round(low * 100)}to{round(high * 100)}"
    else:
        tag = phase_tag(phase.objective, phase.mask_ratio)
    if phase.objective in MASKED and phase.mask_ratio_end is not None:
        tag += f"to{round(phase.mask_ratio_end * 100)}"
    if phase.optimizer == "reset":  # Ettin's recipe: the weights only, a fresh optimizer
        tag += "r"
    return tag + frozen_tag(phase.frozen_layers)


def frozen_tag(layers: tuple[int, ...]) -> str:
    """Frozen blocks in a phase tag: `f6` for the lowest six (0 to 5), `f4to7` for another contiguous block,
    `f3x` for three scattered ones (the config columns list them); empty when none."""
    if not layers:
        return ""
    low, high = layers[0], layers[-1]
    if list(layers) != list(range(low, high + 1)):
        return f"f{len(layers)}x"
    return f"f{high + 1}" if low == 0 else f"f{low}to{high}"


def label_parts(label: str) -> dict[str, str] | None:
    """The parts of a phase label (LABEL's groups, absent ones empty), or None when `label` is not one."""
    match = LABEL.fullmatch(label)
    return {k: v or "" for k, v in match.groupdict().items()} if match else None


def join_label(parts: dict[str, str]) -> str:
    """`label_parts` back into a label."""
    return "".join(parts[k] for k in ("objective", "ratio", "end", "reset", "frozen"))


def strip_hash(run: str) -> str:
    """A run's name without its settings hash: `tiny-clm-400-mlm40r-800-a1b2c3` -> `tiny-clm-400-mlm40r-800`."""
    head, _, tail = run.rpartition("-")
    return head if head and re.fullmatch(r"[0-9a-f]{6}", tail) else run


def parse_phase_tag(tag: str) -> tuple[str, float | None] | None:
    """`mlm40` -> ("mlm", 0.4), `mntp40` -> ("mntp", 0.4), `clm` -> ("clm", None), `mlm` -> ("mlm", None); None for
    anything else."""
    match = PHASE_TAG.fullmatch(tag)
    if not match:
        return None
    return match["objective"], int(match["percent"]) / 100 if match["percent"] else None


def source_objective(run: str) -> str | None:
    """The objective ("clm", "mlm" or "mntp") of the model a continued run's name says it started from, else None."""
    match = SOURCE_TAG.search(run)
    return parse_phase_tag(match["tag"])[0] if match else None


def steps_label(steps: int) -> str:
    """42000 -> '42k', 5500 -> '5.5k', 100 -> '100'."""
    if steps >= 1000 and steps % 100 == 0:
        return f"{steps / 1000:g}k"
    return str(steps)


def run_name(cfg: RunConfig, *, source_label: str | None = None, source_steps: int = 0) -> str:
    """The paper's name for the run's phases plus `run_hash` (the settings that shape its weights)."""
    parts = [cfg.model.size]
    if source_label:  # continued pretraining: the source's objective and the decayed step count
        parts.append(f"{source_label}-dec{steps_label(source_steps)}" if source_steps else source_label)
    done = source_steps
    phases = cfg.phases.resolved()
    for phase in phases:
        done += phase.steps
        parts.append(f"{phase_label(phase)}-{steps_label(done)}")
    if cfg.train.seed:  # a replicate: the name says which, so the report's rows tell the replicates apart
        parts.append(f"s{cfg.train.seed}")
    return "-".join(parts) + "-" + run_hash(cfg)
