"""Deterministic CLM labels and MLM masking for packed token blocks (pure numpy).

The masking of global sample ``g`` is a pure function of ``(seed, stream, g,
position, spec)``: no generator state is carried between batches, so the worker
count, batch composition, order, restarts and branch points (CLM -> MLM) cannot
change a single bit of the output.

Counter-based generator. ``_mix`` is the splitmix64 finaliser (a bijective
64-bit avalanche hash). Scalars are chained through it into a per-draw key
``k = mix(mix(mix(mix(seed) ^ stream) ^ draw) ^ 0)``; each row then gets its own
splitmix64 state ``r_g = mix(k ^ g)`` and position ``t`` yields
``mix(r_g + (t + 1) * 0x9E3779B97F4A7C15)``, i.e. exactly the t-th output of a
splitmix64 sequence seeded with ``r_g``. Everything runs on uint64 arrays with
wrapping arithmetic. ``stream`` is a caller-chosen phase salt (two phases with
different settings pass different streams); ``draw`` separates the selection
draw (0) from the replacement draw (1) and a row's own masking rate (2, `ratio_range`: one draw per row).

Uses of the 64-bit outputs:
* selection: ``u = (h >> 11) * 2**-53`` is uniform on [0, 1); a position is
  selected iff ``u < mask_ratio``, evaluated exactly as the integer test
  ``h >> 11 < ceil(mask_ratio * 2**53)``.
* replacement: the high 32 bits give the mask/random/keep category, the
  disjoint low 32 bits the random token via multiply-shift (bias < n / 2**32).

Selection is an independent Bernoulli(mask_ratio) per non-special token (not a
fixed count per row): the expected masked share equals the ratio, and each
token's fate depends on (seed, g, t) only, never on how many specials its row
holds. Random replacements are drawn uniformly from the non-special ids in
[0, vocab_size), so a "random" token is never a pad/bos/eos/mask id.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable

import numpy as np

from raybiphase.config.run import MASKED

IGNORE_INDEX = -100  # torch cross_entropy's default ignore_index
_M64 = (1 << 64) - 1
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_SELECT, _REPLACE, _RATE = 0, 1, 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaskingSpec:
    """MLM corruption settings: selected share, then mask/random/keep split. The selected share is `mask_ratio`, or
    per row: linear from `mask_ratio` to `ratio_end` over a phase's steps (`ramp`: the phase's first sample id, rows
    per step, steps), or drawn uniformly from `ratio_range` by the row's sample id."""

    mask_ratio: float
    mask_prob: float = 1.0
    random_prob: float = 0.0
    ratio_end: float | None = None
    ramp: tuple[int, int, int] | None = None
    ratio_range: tuple[float, float] | None = None

    def row_ratios(self, seed: int, stream: int, sample_ids: np.ndarray) -> np.ndarray | None:
        """Each row's selected share, or None when every row takes `mask_ratio`."""
        ids = np.asarray(sample_ids, dtype=np.int64)
        if self.ratio_range is not None:
            low, high = self.ratio_range
            u = (random_bits(seed, stream, _RATE, ids, 1)[:, 0] >> np.uint64(11)).astype(np.float64) * 2.0**-53
            return low + (high - low) * u
        if self.ratio_end is not None:
            first, rows_per_step, steps = self.ramp
            index = np.clip((ids - first) // rows_per_step, 0, steps - 1)
            return self.mask_ratio + (self.ratio_end - self.mask_ratio) * index / max(steps - 1, 1)
        return None

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_ratio < 1.0:
            raise ValueError(f"mask_ratio must be in (0, 1), got {self.mask_ratio}")
        for name in ("mask_prob", "random_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.mask_prob + self.random_prob > 1.0 + 1e-12:
            raise ValueError(
                f"mask_prob + random_prob must be <= 1, got {self.mask_prob} + {self.random_prob}"
            )
        if self.ratio_end is not None and self.ramp is None:
            raise ValueError("a ratio schedule (ratio_end) needs its ramp: (first sample id, rows per step, steps)")


def _mix_int(x: int) -> int:
    """splitmix64 finaliser on a Python int (for the scalar part of the key)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix_(x: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser in place on a uint64 array (``tmp``: same-shape scratch)."""
    # In-place ufuncs with a reused scratch buffer avoid allocating per step.
    np.right_shift(x, np.uint64(30), out=tmp)
    x ^= tmp
    x *= _C1
    np.right_shift(x, np.uint64(27), out=tmp)
    x ^= tmp
    x *= _C2
    np.right_shift(x, np.uint64(31), out=tmp)
    x ^= tmp
    return x


def random_bits(seed: int, stream: int, draw: int, sample_ids: np.ndarray, length: int) -> np.ndarray:
    """Counter-based uint64 hash for every (sample, position): shape (len(sample_ids), length)."""
    key = _mix_int(_mix_int(_mix_int(_mix_int(seed) ^ (stream & _M64)) ^ draw))
    g = np.asarray(sample_ids).astype(np.int64).view(np.uint64)  # two's complement wrap
    with np.errstate(over="ignore"):
        rows = g ^ np.uint64(key)
        _mix_(rows, np.empty_like(rows))
        steps = np.arange(1, length + 1, dtype=np.uint64) * _GAMMA
        x = rows[:, None] + steps[None, :]
        return _mix_(x, np.empty_like(x))


@functools.lru_cache(maxsize=16)
def _allowed_tokens(vocab_size: int, specials: tuple[int, ...]) -> np.ndarray:
    """Non-special ids in [0, vocab_size), the support of random replacements."""
    return np.setdiff1d(np.arange(vocab_size, dtype=np.int64), np.asarray(specials, dtype=np.int64))


def mlm_mask(
    input_ids: np.ndarray,
    sample_ids: np.ndarray,
    *,
    seed: int,
    spec: MaskingSpec,
    mask_token_id: int,
    vocab_size: int,
    special_ids: Iterable[int],
    stream: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Mask a (B, L) block deterministically per sample id; returns int64 (inputs, labels)."""
    ids = np.asarray(input_ids)
    sample_ids = np.asarray(sample_ids)
    if ids.ndim != 2 or sample_ids.shape != (ids.shape[0],):
        raise ValueError(f"need input_ids (B, L) and sample_ids (B,), got {ids.shape} and {sample_ids.shape}")
    # The mask id is always special: a [MASK] already in the input must never become a target.
    specials = tuple(sorted({int(s) for s in special_ids} | {int(mask_token_id)}))
    ids64 = ids.astype(np.int64)  # always a fresh copy: the caller's array is never touched
    _, length = ids.shape

    h = random_bits(seed, stream, _SELECT, sample_ids, length)
    ratios = spec.row_ratios(seed, stream, sample_ids)
    if ratios is None:
        selected = (h >> np.uint64(11)) < np.uint64(math.ceil(spec.mask_ratio * 2.0**53))
    else:  # the same test, one threshold per row
        selected = (h >> np.uint64(11)) < np.ceil(ratios * 2.0**53).astype(np.uint64)[:, None]
    selected &= ~np.isin(ids64, specials)

    labels = np.where(selected, ids64, IGNORE_INDEX)
    if spec.mask_prob >= 1.0:  # skip the replacement draw: its outcome would be ignored
        np.copyto(ids64, mask_token_id, where=selected)
        return ids64, labels

    r = random_bits(seed, stream, _REPLACE, sample_ids, length)
    category = r >> np.uint64(32)
    to_mask = selected & (category < np.uint64(math.ceil(spec.mask_prob * 2.0**32)))
    cut = math.ceil(min(spec.mask_prob + spec.random_prob, 1.0) * 2.0**32)
    to_random = selected & ~to_mask & (category < np.uint64(cut))
    np.copyto(ids64, mask_token_id, where=to_mask)
    if to_random.any():
        allowed = _allowed_tokens(int(vocab_size), specials)
        if allowed.size == 0:
            raise ValueError(f"vocab_size={vocab_size} leaves no non-special token to sample")
        low = r[to_random] & np.uint64(0xFFFFFFFF)
        ids64[to_random] = allowed[(low * np.uint64(allowed.size)) >> np.uint64(32)]
    return ids64, labels


def clm_labels(input_ids: np.ndarray, pad_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Next-token labels, already shifted: the model's loss must NOT shift again."""
    ids64 = np.asarray(input_ids).astype(np.int64)
    if ids64.ndim != 2:
        raise ValueError(f"need input_ids (B, L), got shape {ids64.shape}")
    labels = np.full_like(ids64, IGNORE_INDEX)
    labels[:, :-1] = ids64[:, 1:]  # labels[t] = input_ids[t + 1]; last position has no target
    if pad_id is not None:
        labels[labels == pad_id] = IGNORE_INDEX  # never train to predict padding
    return ids64, labels


def mntp_labels(mlm_labels: np.ndarray) -> np.ndarray:
    """MNTP's labels from MLM's: the masked token at position i becomes the label of position i - 1 (its hidden
    state predicts the next token, as the decoder it came from did); a token masked at position 0 has no position
    before it and goes unpredicted."""
    labels = np.full_like(mlm_labels, IGNORE_INDEX)
    labels[:, :-1] = mlm_labels[:, 1:]
    return labels


def mask_batch(
    batch: dict[str, np.ndarray],
    *,
    objective: str,
    seed: int = 0,
    spec: MaskingSpec | None = None,
    mask_token_id: int | None = None,
    vocab_size: int | None = None,
    special_ids: Iterable[int] | None = None,
    pad_id: int | None = None,
    stream: int = 0,
) -> dict[str, np.ndarray]:
    """Labels (and MLM's masked inputs) for one numpy batch of blocks: what every Train worker's Ray Data stream
    runs on its batches (raybiphase.data.stream.PhaseBatches)."""
    sample_id = np.asarray(batch["sample_id"])
    if objective == "clm":
        inputs, labels = clm_labels(batch["input_ids"], pad_id=pad_id)
    elif objective in MASKED:
        missing = [n for n, v in (("spec", spec), ("mask_token_id", mask_token_id),
                                  ("vocab_size", vocab_size), ("special_ids", special_ids)) if v is None]
        if missing:
            raise ValueError(f"objective {objective!r} needs {', '.join(missing)}")
        specials = list(special_ids) + ([pad_id] if pad_id is not None else [])
        inputs, labels = mlm_mask(batch["input_ids"], sample_id, seed=seed, spec=spec,
                                  mask_token_id=mask_token_id, vocab_size=vocab_size,
                                  special_ids=specials, stream=stream)
        if objective == "mntp":
            labels = mntp_labels(labels)
    else:
        raise ValueError(f"unknown objective {objective!r}; expected 'clm', 'mlm' or 'mntp'")
    return {"input_ids": inputs, "labels": labels, "sample_id": sample_id}
