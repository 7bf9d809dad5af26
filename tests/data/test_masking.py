"""Tests for raybiphase.data.masking: statistics, special tokens, labels, determinism, CLM shift."""

from __future__ import annotations

import numpy as np
import pytest

from raybiphase.data.masking import IGNORE_INDEX, MaskingSpec, clm_labels, mask_batch, mlm_mask, random_bits

PAD, BOS, EOS, MASK = 0, 1, 2, 3
SPECIALS = [PAD, BOS, EOS, MASK]
VOCAB = 1000


def make_block(b: int, length: int, seed: int = 0) -> np.ndarray:
    """Token ids over non-special ids, with bos/eos inside rows and right padding on some rows."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, VOCAB, size=(b, length)).astype(np.int32)
    ids[:, 0] = BOS
    ids[:, length // 2] = EOS  # packed documents: eos/bos in the middle of a block
    ids[:, length // 2 + 1] = BOS
    ids[::3, -length // 8:] = PAD
    return ids


def run_mlm(ids, sample_ids, spec, seed=0, stream=0):
    return mlm_mask(ids, sample_ids, seed=seed, spec=spec, mask_token_id=MASK,
                    vocab_size=VOCAB, special_ids=[PAD, BOS, EOS], stream=stream)


@pytest.mark.parametrize("ratio", [0.15, 0.3, 0.4, 0.5])
def test_masked_share_matches_ratio(ratio):
    ids = make_block(512, 2048)  # ~1M tokens
    _, labels = run_mlm(ids, np.arange(512), MaskingSpec(mask_ratio=ratio), seed=7)
    non_special = ~np.isin(ids, SPECIALS)
    share = (labels != IGNORE_INDEX).sum() / non_special.sum()
    assert abs(share - ratio) < 0.005


def test_default_spec_replaces_every_selected_token_with_mask():
    ids = make_block(64, 512)
    inputs, labels = run_mlm(ids, np.arange(64), MaskingSpec(mask_ratio=0.4))
    selected = labels != IGNORE_INDEX
    assert selected.any()
    assert np.all(inputs[selected] == MASK)


def test_80_10_10_split():
    ids = make_block(512, 2048)
    spec = MaskingSpec(mask_ratio=0.3, mask_prob=0.8, random_prob=0.1)
    inputs, labels = run_mlm(ids, np.arange(512), spec, seed=3)
    selected = labels != IGNORE_INDEX
    sel_in, sel_orig = inputs[selected], ids[selected]
    masked = sel_in == MASK
    kept = sel_in == sel_orig
    randomised = ~masked & ~kept  # a random draw equal to the original counts as "kept" here
    n = selected.sum()
    assert abs(masked.mean() - 0.8) < 0.005
    assert abs(randomised.mean() - 0.1 * (1 - 1 / (VOCAB - 4))) < 0.005
    assert abs(kept.mean() - (0.1 + 0.1 / (VOCAB - 4))) < 0.005
    assert n > 250_000
    # random replacements are never special tokens and stay inside the vocabulary
    rand_tokens = sel_in[randomised]
    assert not np.isin(rand_tokens, SPECIALS).any()
    assert rand_tokens.min() >= 0 and rand_tokens.max() < VOCAB
    # uniform over the 996 allowed ids: chi-square within 5 sd of its dof
    counts = np.bincount(rand_tokens, minlength=VOCAB)[4:]
    expected = counts.sum() / counts.size
    chi2 = ((counts - expected) ** 2 / expected).sum()
    dof = counts.size - 1
    assert abs(chi2 - dof) < 5 * np.sqrt(2 * dof)


def test_special_tokens_never_selected():
    ids = make_block(128, 1024)
    spec = MaskingSpec(mask_ratio=0.9, mask_prob=0.5, random_prob=0.5)
    inputs, labels = run_mlm(ids, np.arange(128), spec)
    special = np.isin(ids, SPECIALS)
    assert special.sum() > 5_000
    assert np.all(labels[special] == IGNORE_INDEX)
    assert np.all(inputs[special] == ids[special])


def test_labels_and_unselected_inputs():
    ids = make_block(32, 256)
    original = ids.copy()
    spec = MaskingSpec(mask_ratio=0.4, mask_prob=0.8, random_prob=0.1)
    inputs, labels = run_mlm(ids, np.arange(32), spec)
    np.testing.assert_array_equal(ids, original)  # input never mutated
    assert labels.dtype == np.int64 and inputs.dtype == np.int64
    assert inputs.shape == labels.shape == ids.shape
    selected = labels != IGNORE_INDEX
    np.testing.assert_array_equal(labels[selected], ids[selected])
    np.testing.assert_array_equal(inputs[~selected], ids[~selected])


@pytest.mark.parametrize("spec", [MaskingSpec(mask_ratio=0.4),
                                  MaskingSpec(mask_ratio=0.15, mask_prob=0.8, random_prob=0.1)])
def test_independent_of_batch_composition(spec):
    ids = make_block(8, 512)
    sample_ids = np.array([10, 11, 12, 13, 1_000_000, 15, 2**40, 17], dtype=np.int64)
    full_in, full_lab = run_mlm(ids, sample_ids, spec, seed=5)
    # two batches of 4
    halves = [run_mlm(ids[s], sample_ids[s], spec, seed=5) for s in (slice(0, 4), slice(4, 8))]
    np.testing.assert_array_equal(np.concatenate([h[0] for h in halves]), full_in)
    np.testing.assert_array_equal(np.concatenate([h[1] for h in halves]), full_lab)
    # reversed order, and one sample at a time
    rev_in, rev_lab = run_mlm(ids[::-1], sample_ids[::-1], spec, seed=5)
    np.testing.assert_array_equal(rev_in[::-1], full_in)
    np.testing.assert_array_equal(rev_lab[::-1], full_lab)
    for i in range(8):
        one_in, one_lab = run_mlm(ids[i:i + 1], sample_ids[i:i + 1], spec, seed=5)
        np.testing.assert_array_equal(one_in[0], full_in[i])
        np.testing.assert_array_equal(one_lab[0], full_lab[i])
    # through the Ray batch entry point, with int32 input
    out = mask_batch({"input_ids": ids, "sample_id": sample_ids}, objective="mlm", seed=5, spec=spec,
                     mask_token_id=MASK, vocab_size=VOCAB, special_ids=[BOS, EOS], pad_id=PAD)
    np.testing.assert_array_equal(out["input_ids"], full_in)
    np.testing.assert_array_equal(out["labels"], full_lab)
    np.testing.assert_array_equal(out["sample_id"], sample_ids)


def test_seed_sample_id_and_stream_change_the_mask():
    ids = np.tile(make_block(1, 2048), (2, 1))  # identical content in both rows
    spec = MaskingSpec(mask_ratio=0.4)
    _, lab = run_mlm(ids, np.array([0, 1]), spec, seed=0)
    assert not np.array_equal(lab[0] != IGNORE_INDEX, lab[1] != IGNORE_INDEX)
    _, lab_seed = run_mlm(ids, np.array([0, 1]), spec, seed=1)
    assert not np.array_equal(lab_seed != IGNORE_INDEX, lab != IGNORE_INDEX)
    _, lab_stream = run_mlm(ids, np.array([0, 1]), spec, seed=0, stream=1)
    assert not np.array_equal(lab_stream != IGNORE_INDEX, lab != IGNORE_INDEX)
    _, lab_again = run_mlm(ids, np.array([0, 1]), spec, seed=0)
    np.testing.assert_array_equal(lab_again, lab)


def test_random_bits_uniform_and_uncorrelated():
    h = random_bits(0, 0, 0, np.arange(256), 4096)
    u = (h >> np.uint64(11)).astype(np.float64) * 2.0**-53
    assert abs(u.mean() - 0.5) < 0.002 and abs(u.var() - 1 / 12) < 0.001
    # adjacent positions and adjacent samples are uncorrelated
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.01
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.01
    # each of the 64 bits is set about half the time
    bits = (h[:16, :1024, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    assert np.all(np.abs(bits.mean(axis=(0, 1)) - 0.5) < 0.02)


def test_clm_labels_shift():
    ids = np.array([[1, 5, 6, 7, 2, 0, 0], [1, 8, 9, 2, 1, 10, 2]], dtype=np.int32)
    inputs, labels = clm_labels(ids)
    np.testing.assert_array_equal(inputs, ids)
    np.testing.assert_array_equal(labels[:, :-1], ids[:, 1:])
    assert np.all(labels[:, -1] == IGNORE_INDEX) and labels.dtype == np.int64
    _, labels_pad = clm_labels(ids, pad_id=0)
    np.testing.assert_array_equal(labels_pad[0], [5, 6, 7, 2, -100, -100, -100])
    np.testing.assert_array_equal(labels_pad[1], [8, 9, 2, 1, 10, 2, -100])
    out = mask_batch({"input_ids": ids, "sample_id": np.arange(2)}, objective="clm", pad_id=0)
    np.testing.assert_array_equal(out["labels"], labels_pad)
    assert set(out) == {"input_ids", "labels", "sample_id"}


@pytest.mark.parametrize("kwargs, field", [
    ({"mask_ratio": 0.0}, "mask_ratio"),
    ({"mask_ratio": 1.0}, "mask_ratio"),
    ({"mask_ratio": 1.5}, "mask_ratio"),
    ({"mask_ratio": float("nan")}, "mask_ratio"),
    ({"mask_ratio": 0.3, "mask_prob": -0.1}, "mask_prob"),
    ({"mask_ratio": 0.3, "random_prob": 1.2}, "random_prob"),
    ({"mask_ratio": 0.3, "mask_prob": 0.8, "random_prob": 0.3}, "mask_prob \\+ random_prob"),
])
def test_bad_specs_raise(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MaskingSpec(**kwargs)


def test_spec_is_frozen_keyword_only():
    spec = MaskingSpec(mask_ratio=0.3, mask_prob=0.7, random_prob=0.3)  # sums to exactly 1: allowed
    with pytest.raises(Exception):
        spec.mask_ratio = 0.5
    with pytest.raises(TypeError):
        MaskingSpec(0.3)


def test_mask_batch_errors():
    batch = {"input_ids": np.ones((2, 4), np.int32), "sample_id": np.arange(2)}
    with pytest.raises(ValueError, match="'nsp'"):
        mask_batch(batch, objective="nsp")
    with pytest.raises(ValueError, match="spec"):
        mask_batch(batch, objective="mlm", mask_token_id=MASK, vocab_size=VOCAB, special_ids=[])
    with pytest.raises(ValueError, match="sample_ids"):
        mlm_mask(np.ones((2, 4)), np.arange(3), seed=0, spec=MaskingSpec(mask_ratio=0.2),
                 mask_token_id=MASK, vocab_size=VOCAB, special_ids=[])
