"""What the planner asks of two runs' steps (pure, no torch): where they first differ, what a step is, and the bytes a
segment's id hashes, all read from the runs' schedule pieces (raybiphase.phases), so the work grows with the
pieces two runs pass through, not with their steps.

Two runs of one base take the same step t when its `StepKind` (objective, optimizer reset, frozen blocks, masking
range) is equal, and so are its masking ratio and learning rate as numbers: a fixed ratio of 0.4 and a ratio
schedule's first step at 0.4 are the same step, as the masking of a sample depends only on its ratio. Within two
pieces whose rules are equal every step is equal; where the rules differ, the rates are compared over those two
pieces only.

A segment's id hashes a per-step table (`id_rows`: an objective code, the masking ratio, the learning rate), so the
same steps keep the same id, and the checkpoints a sweep wrote are found again: the objective code is 0 for CLM, 1
for MLM, 2 for MNTP, plus RESET on a step after an optimizer reset, plus a fraction naming the frozen blocks; the
ratio is 0 for CLM and a code above 1 naming a per-sequence range. A `StepKind` field outside that table hashes as
its name and value where it is set (`_extra_bytes`), so a new setting of a step changes ids as it changes sharing.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from raybiphase.config.identity import digest
from raybiphase.naming import phase_tag
from raybiphase.phases import Piece, Schedule, StepKind

OBJECTIVE_CODE = {"clm": 0.0, "mlm": 1.0, "mntp": 2.0}
RESET = 10.0
"""Added to the objective code of a step that starts with AdamW's moments reset."""
TABLED = ("objective", "reset", "frozen_layers", "mask_ratio_range")
"""The StepKind fields `id_rows` encodes; any other hashes apart (`_extra_bytes`)."""


def frozen_code(layers: tuple[int, ...]) -> float:
    """The fraction added to the objective code of a step that leaves `layers` untouched: 0 for none, else a
    number in (0, 1) two different sets never share."""
    if not layers:
        return 0.0
    return (1 + int(digest({"frozen_layers": list(layers)}, 12), 16)) / (16**12 + 2)


@functools.cache
def _objective_code(kind: StepKind) -> float:
    code = OBJECTIVE_CODE[kind.objective] + frozen_code(kind.frozen_layers)
    return code + RESET if kind.reset else code


@functools.cache
def _range_code(bounds: tuple[float, float]) -> float:
    return 1.0 + int(digest({"mask_ratio_range": list(bounds)}, 12), 16) / 16**12


def _ratios(piece: Piece, steps):
    """The masking column at `steps` (a step or a numpy range) of one piece: the ratio, 0 for CLM, a code above 1
    for a per-sequence range."""
    if piece.kind.mask_ratio_range is not None:
        return _range_code(piece.kind.mask_ratio_range)
    return 0.0 if piece.mask_ratio is None else piece.mask_ratio.at(steps)


def _overlapping(schedule: Schedule, start: int, end: int):
    """(piece, its steps within [start, end)) for each piece that overlaps [start, end), in order."""
    pieces = schedule.pieces()
    index = schedule.piece_index(start)
    while index < len(pieces) and pieces[index].start < end:
        piece = pieces[index]
        yield piece, np.arange(max(piece.start, start), min(piece.end, end))
        index += 1


def id_rows(schedule: Schedule, start: int, end: int) -> np.ndarray:
    """The (end - start, 3) table of steps [start, end) a segment id hashes (module docstring)."""
    rows = np.zeros((end - start, 3))
    for piece, steps in _overlapping(schedule, start, end):
        block = rows[steps[0] - start:steps[-1] + 1 - start]
        block[:, 0] = _objective_code(piece.kind)
        block[:, 1] = _ratios(piece, steps)
        block[:, 2] = piece.lr.at(steps)
    return rows


def _extra_bytes(kind: StepKind) -> bytes:
    """The StepKind fields outside the table that are set, as bytes; empty when there are none."""
    extra = {f.name: getattr(kind, f.name) for f in dataclasses.fields(kind)
             if f.name not in TABLED and getattr(kind, f.name) != f.default}
    return repr(sorted(extra.items())).encode() if extra else b""


def id_bytes(schedule: Schedule, start: int, end: int) -> bytes:
    """What a segment id hashes for steps [start, end): their table rows, each step whose kind differs from the
    step before it preceded by that kind's `_extra_bytes`. A function of the steps alone, so hashing [0, a) then
    [a, b) equals hashing [0, b), and runs that share steps hash them alike."""
    if all(not _extra_bytes(piece.kind) for piece, _ in _overlapping(schedule, start, end)):
        return id_rows(schedule, start, end).tobytes()
    out, before = [], step_kind(schedule, start - 1) if start else None
    for piece, steps in _overlapping(schedule, start, end):
        if piece.kind != before:
            out.append(_extra_bytes(piece.kind))
        out.append(id_rows(schedule, int(steps[0]), int(steps[-1]) + 1).tobytes())
        before = piece.kind
    return b"".join(out)


def step_kind(schedule: Schedule, step: int) -> StepKind:
    return schedule.piece_at(step).kind


def step_value(schedule: Schedule, step: int) -> tuple:
    """What step `step` is, as a hashable value: (kind, masking ratio or None, learning rate)."""
    piece = schedule.piece_at(step)
    ratio = None if piece.mask_ratio is None else float(piece.mask_ratio.at(step))
    return piece.kind, ratio, float(piece.lr.at(step))


def step_order(value: tuple) -> tuple[float, float, float]:
    """The order the planner lists runs that part at a step in, from the step's `step_value`: the step's row of
    `id_rows`, with the same float operations."""
    kind, ratio, lr = value
    if kind.mask_ratio_range is not None:
        ratio = _range_code(kind.mask_ratio_range)
    return _objective_code(kind), 0.0 if ratio is None else ratio, lr


def step_tag(schedule: Schedule, step: int) -> str:
    """The phase tag of step `step`: `clm`, `mlm40` (its ratio at that step), or `mlmu` for a per-sequence range."""
    piece = schedule.piece_at(step)
    if piece.kind.objective == "clm":
        return "clm"
    if piece.mask_ratio is None:
        return f"{piece.kind.objective}u"
    return phase_tag(piece.kind.objective, float(piece.mask_ratio.at(step)))


def first_difference(a: Schedule, b: Schedule, start: int, end: int) -> int:
    """The first step in [start, end) that `a` and `b` take differently (module docstring), or `end`: pieces with
    equal kinds and rules are skipped whole; rates and ratios are compared step by step only over two pieces whose
    rules differ."""
    pieces_a, pieces_b = a.pieces(), b.pieces()
    i, j, step = a.piece_index(start), b.piece_index(start), start
    while step < end:
        x, y = pieces_a[i], pieces_b[j]
        high = min(x.end, y.end, end)
        if x.kind != y.kind:
            return step
        if (x.lr, x.mask_ratio) != (y.lr, y.mask_ratio):
            steps = np.arange(step, high)
            differ = np.broadcast_to(x.lr.at(steps) != y.lr.at(steps), steps.shape)
            if x.mask_ratio is not None:
                differ = differ | (x.mask_ratio.at(steps) != y.mask_ratio.at(steps))
            if differ.any():
                return step + int(np.argmax(differ))
        step = high
        i, j = i + (x.end == high), j + (y.end == high)
    return end
