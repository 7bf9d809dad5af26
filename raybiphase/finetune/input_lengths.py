"""How long fine-tuning inputs are, in tokens: what the dry run prices a step's width by (no torch, no data).

    width("squad", "train", max_len=2048)       # 384: the measured p98 (350), padded up to a multiple of 64
    width("record", "train", max_len=2048)      # 2048: not measured, priced at max_len

MEASURED holds, per offline task, the mean and the 98th percentile of its inputs' token lengths under EuroBERT's
Llama-3 tokenizer, built as its head builds them and untrimmed: "train" and "eval" inputs (retrieval: queries and
passages apart, "train_query", "train_passage", "eval_query", "eval_passage"). Its source is the record
benchmarks/results/input-lengths-2026-11-28.json (`benchmarks/bench_input_lengths.py`); a test holds the two equal.

Why the 98th percentile: fine-tuning batches are drawn at random and padded to their longest input, and the
longest of 32 (a training batch) or 64 (an evaluation batch) random draws lies about at the 97th or 98.5th
percentile; on CUDA that width is rounded up to a multiple of CUDA_PAD_MULTIPLE, never past max_len.

The paper's twelve datasets are on the hub, out of this machine's reach; STAND_INS says which measured task each is
priced by and why. squad is SQuAD v1.1 itself; each other stand-in is about as long as its dataset or longer (by the
dataset's published average lengths), so the price stays near or above the truth; record and mldr have none and are
priced at max_len. A hub task the table does not name is priced at max_len too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from raybiphase.finetune.tasks import get_task

CUDA_PAD_MULTIPLE = 64
"""On CUDA a fine-tuning batch is padded to a multiple of this many tokens (raybiphase.finetune.heads.base)."""
EVAL_BATCH = 64
"""Inputs an evaluation encodes at once, in the split's order."""
QUANTILES = (50, 90, 97, 98, 99)
"""The percentiles the record holds; the dry run reads WIDTH_QUANTILE."""
WIDTH_QUANTILE = 98
RECORD = "benchmarks/results/input-lengths-2026-11-28.json"
BUCKET_BATCHES = 50
"""finetune.bucket_by_length sorts runs of this many batches of the seeded order by length."""

STAND_INS: dict[str, tuple[str | None, str]] = {
    "sst2": ("tweets", "SST-2's single movie-review sentences and phrases are shorter than tweets"),
    "mnli": ("qnli", "an MNLI premise and hypothesis, in their template, run about as long as a SQuAD question "
                     "and a sentence of its paragraph"),
    "qqp": ("qnli", "two Quora questions are shorter than a SQuAD question and a Wikipedia sentence"),
    "conll2003": ("squad_bio", "CoNLL-2003's newswire sentences are shorter than SQuAD's Wikipedia sentences"),
    "ontonotes": ("squad_bio", "OntoNotes' sentences are shorter than SQuAD's Wikipedia sentences"),
    "uner": ("squad_bio", "UNER's English Web Treebank sentences are shorter than SQuAD's Wikipedia sentences"),
    "squad": ("squad", "SQuAD v1.1 itself: the official files the offline task reads"),
    "squad_v2": ("squad", "SQuAD v2 adds unanswerable questions on the same kind of Wikipedia paragraphs"),
    "record": (None, "ReCoRD's news passages are longer than SQuAD's paragraphs and no stand-in is here"),
    "msmarco": ("squad_retrieval", "MS MARCO's queries and passages are shorter than SQuAD's questions and "
                                   "paragraphs"),
    "nq": ("squad_retrieval", "NQ's corpus is 100-word Wikipedia passages, about SQuAD paragraphs' length"),
    "mldr": (None, "MLDR's documents run past the context: every passage is max_len"),
}
"""Paper task -> (the measured task it is priced by, or None: max_len; why)."""

MEASURED: dict[str, dict[str, tuple[float, int]]] = {
    "tweets": {"train": (31.9, 55), "eval": (31.8, 55)},
    "wiki_topics": {"train": (104.8, 219), "eval": (106.8, 221)},
    "qnli": {"train": (50.8, 100), "eval": (51.6, 103)},
    "squad_shuffle": {"train": (34.8, 81), "eval": (36.1, 86)},
    "squad_bio": {"train": (34.3, 81), "eval": (35.4, 87)},
    "squad_commas": {"train": (32.8, 77), "eval": (33.9, 83)},
    "squad": {"train": (174.8, 350), "eval": (176.1, 352)},
    "squad_sentence": {"train": (54.2, 115), "eval": (55.6, 132)},
    "squad_retrieval": {"train_query": (16.4, 27), "train_passage": (163.2, 338),
                        "eval_query": (16.6, 28), "eval_passage": (163.1, 337)},
    "wiki_retrieval": {"train_query": (12.1, 20), "train_passage": (106.5, 222),
                       "eval_query": (12.1, 20), "eval_passage": (107.4, 221)},
}
"""Offline task -> part -> (mean, WIDTH_QUANTILE percentile) of its inputs' lengths, from RECORD."""


def lengths(name: str, part: str) -> tuple[float, int] | None:
    """(mean, high quantile) of task `name`'s `part` inputs, read from its stand-in for a hub task; None when
    neither it nor a stand-in was measured. A non-retrieval task's part is "train" or "eval"; a retrieval task's
    "train_query", "train_passage", "eval_query" or "eval_passage"."""
    measured_on = STAND_INS[name][0] if name in STAND_INS else name
    return MEASURED.get(measured_on, {}).get(part) if measured_on else None


def width(name: str, part: str, max_len: int, *, bucketed: bool = False) -> int:
    """The padded width a batch of task `name`'s `part` inputs is priced at: the measured high quantile rounded up
    to CUDA_PAD_MULTIPLE, at most max_len; max_len where nothing was measured. `bucketed` (training under
    finetune.bucket_by_length): a batch holds inputs of about one length, so the widths average about the inputs'
    mean plus the rounding, at most CUDA_PAD_MULTIPLE more."""
    found = lengths(name, part)
    if found is None:
        return max_len
    padded = math.ceil(found[1] / CUDA_PAD_MULTIPLE) * CUDA_PAD_MULTIPLE
    if bucketed:
        padded = min(padded, math.ceil(found[0]) + CUDA_PAD_MULTIPLE)
    return min(padded, max_len)


def training_order(unit_lengths: Sequence[int], batch_size: int, seed: int, *, bucket: bool = False) -> np.ndarray:
    """The order a trial reads its training units in, batch after batch of `batch_size`: a permutation seeded by
    `seed`; with `bucket` (finetune.bucket_by_length), each run of BUCKET_BATCHES batches of it sorted by length
    and cut into batches, the whole batches then shuffled (seeded) and a short last batch kept last. Every unit is
    read once an epoch either way, and the seed alone fixes the order."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(unit_lengths))
    if not bucket or not len(order):
        return order
    values, run = np.asarray(unit_lengths), BUCKET_BATCHES * batch_size
    ordered = np.concatenate([chunk[np.argsort(values[chunk], kind="stable")]
                              for chunk in np.split(order, range(run, len(order), run))])
    batches = np.split(ordered, range(batch_size, len(ordered), batch_size))
    short = [batches.pop()] if len(batches[-1]) < batch_size else []
    return np.concatenate([batches[i] for i in rng.permutation(len(batches))] + short)


def is_measured(name: str) -> bool:
    """Whether task `name`'s widths come from measured lengths (its own or a stand-in's), not max_len."""
    return lengths(name, "train_query" if get_task(name).family == "IR" else "train") is not None
