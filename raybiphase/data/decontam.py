"""Decontamination: which pretraining documents overlap the evaluation text of the tasks fine-tuned on.

The rule: a document is dropped when it shares any word n-gram (`data.decontam_ngram`, 13 by default) with a
validation or test text of a held-out task. It is GPT-3's (Brown et al. 2020, appendix C: 13-gram overlap against
every benchmark's dev and test sets), which cut a window around each match and kept the pieces; here the whole
document goes, which needs no second pass, and a cut document would keep the context a model could use to recall
the rest. Exact paragraph matching (Dolma's Bloom-filter decontamination for OLMo) would miss a copied sentence
inside a reworded page; n-grams catch it. Words are maximal runs of letters and digits after NFKC normalisation and
lowercasing, so case, punctuation and whitespace never hide an overlap ("U.S." is the words "u s" on both sides).
An evaluation text shorter than n words but of at least SHORT_MIN_WORDS is matched whole: a document containing its
words in a row is dropped (a short SST-2 sentence pasted into a web page is still found); a text under
SHORT_MIN_WORDS words is not looked for, since phrases that short ("a gripping film") recur in unrelated text by
chance: dropping on them would remove innocent documents without removing a leak. Any overlap drops the document
(no threshold): one copied sentence is already a leak. Templated prose still matches (census paragraphs of
different towns share 13-grams), which costs a few documents, never a leak.

Why 13: shorter n-grams (8) start matching phrases that unrelated pages share; much longer ones miss a sentence
copied in part. 13 words is long enough that a match is almost never chance and short enough to catch a copied
sentence.

Memory: the evaluation side is built once into `HeldOut`: every distinct n-gram hashed to 64 bits, sorted, with a
64-bit mask of the tasks it belongs to: 16 bytes per distinct n-gram (about one per evaluation word), so ten million
words of evaluation text take about 160 MB (about twice that while it is built, in a task of its own), whatever
the corpus size. Documents stream past it a window at a time (`overlaps`): nothing of the corpus is held. With 64-bit hashes a chance collision drops a document with
probability about (n-grams in the document) x (n-grams held) / 2^64: below 1e-9 per document for a million held
n-grams.
"""

from __future__ import annotations

import functools
import hashlib
import io
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from raybiphase import storage
from raybiphase.config import DataConfig
from raybiphase.errors import UserError

RULE_VERSION = 1
"""Bumped whenever the rule changes what it drops; prepared shards' fingerprints include it."""
HELD_OUT_FILE = "held_out.npz"
"""The index, stored beside the shards it decontaminated (every node's pieces read it from there)."""
SHORT_MIN_WORDS = 8
"""Evaluation texts of this many words up to n - 1 are matched whole; shorter ones are not looked for."""
MAX_TASKS = 64
"""Tasks one index holds (a bit each in a 64-bit mask)."""
_WORD = re.compile(r"[^\W_]+")
_BASE = np.uint64(0x9E3779B97F4A7C15)  # an odd 64-bit multiplier for the rolling n-gram hash

EvaluationTexts = Callable[[str], Iterable[str]]
"""task name -> the validation and test texts of that task (raybiphase.finetune.heldout gives them)."""


def words(text: str) -> list[str]:
    """The words the rule compares: runs of letters and digits, NFKC-normalised and lowercased."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).lower())


@functools.lru_cache(maxsize=1 << 18)
def _word_hash(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")


def word_hashes(text: str) -> np.ndarray:
    """A stable 64-bit hash per word (the same in every process, unlike Python's salted `hash`)."""
    return np.fromiter((_word_hash(w) for w in words(text)), dtype=np.uint64)


def gram_hashes(hashes: np.ndarray, k: int) -> np.ndarray:
    """A 64-bit hash of every run of k consecutive words (none when there are fewer than k); k seeds the hash, so a
    whole short text and an n-gram that starts with the same words hash apart."""
    count = len(hashes) - k + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    acc = np.full(count, k, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):
            acc = acc * _BASE + hashes[j:j + count]
    return acc


@dataclass(frozen=True, eq=False)
class HeldOut:
    """The evaluation side of the rule: sorted distinct hashes, each with the mask of the tasks it came from."""

    tasks: tuple[str, ...]
    n: int
    hashes: np.ndarray
    """Sorted distinct uint64 hashes of every held-out n-gram and whole short text."""
    masks: np.ndarray
    """uint64 per hash: bit i set when it occurs in tasks[i]'s evaluation text."""
    short_lengths: tuple[int, ...]
    """The word counts of the whole short texts held (each a gram length documents are also cut into)."""

    @classmethod
    def build(cls, tasks: Sequence[str], n: int, texts: EvaluationTexts) -> HeldOut:
        """The index of every task's evaluation text, read one task at a time."""
        if len(tasks) > MAX_TASKS:
            raise ValueError(f"at most {MAX_TASKS} tasks in one index, got {len(tasks)}")
        parts, masks, lengths = [], [], set()
        for bit, task in enumerate(tasks):
            grams = []
            for text in texts(task):
                hashes = word_hashes(text)
                if len(hashes) >= n:
                    grams.append(gram_hashes(hashes, n))
                elif len(hashes) >= SHORT_MIN_WORDS:  # matched whole
                    grams.append(gram_hashes(hashes, len(hashes)))
                    lengths.add(len(hashes))
            unique = np.unique(np.concatenate(grams)) if grams else np.empty(0, dtype=np.uint64)
            parts.append(unique)
            masks.append(np.full(len(unique), 1 << bit, dtype=np.uint64))
        every = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
        hashes, where = np.unique(every, return_inverse=True)
        merged = np.zeros(len(hashes), dtype=np.uint64)
        np.bitwise_or.at(merged, where, np.concatenate(masks) if masks else merged)
        return cls(tuple(tasks), n, hashes, merged, tuple(sorted(lengths)))

    def overlaps(self, documents: Sequence[str]) -> np.ndarray:
        """A uint64 task mask per document: bit i set when it overlaps tasks[i]'s evaluation text (0: kept)."""
        found = np.zeros(len(documents), dtype=np.uint64)
        if not len(self.hashes):
            return found
        for i, document in enumerate(documents):
            hashes = word_hashes(document)
            grams = np.concatenate([gram_hashes(hashes, k) for k in (self.n, *self.short_lengths)])
            at = np.minimum(np.searchsorted(self.hashes, grams), len(self.hashes) - 1)
            hit = self.hashes[at] == grams
            if hit.any():
                found[i] = np.bitwise_or.reduce(self.masks[at[hit]])
        return found

    def task_names(self, mask: int) -> list[str]:
        return [task for bit, task in enumerate(self.tasks) if int(mask) >> bit & 1]

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez(buffer, hashes=self.hashes, masks=self.masks, n=np.int64(self.n),
                 tasks=np.array(self.tasks, dtype=str), short_lengths=np.array(self.short_lengths, dtype=np.int64))
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, body: bytes) -> HeldOut:
        with np.load(io.BytesIO(body)) as saved:
            return cls(tuple(str(t) for t in saved["tasks"]), int(saved["n"]), saved["hashes"], saved["masks"],
                       tuple(int(k) for k in saved["short_lengths"]))


@dataclass
class DropCounts:
    """Documents and tokens dropped, in all and per task (a document overlapping two tasks counts under each)."""

    documents: int = 0
    tokens: int = 0
    per_task: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, tasks: list[str], tokens: int) -> None:
        self.documents += 1
        self.tokens += tokens
        for task in tasks:
            entry = self.per_task.setdefault(task, {"documents": 0, "tokens": 0})
            entry["documents"] += 1
            entry["tokens"] += tokens

    def as_record(self) -> dict:
        return {"documents": self.documents, "tokens": self.tokens, "per_task": dict(sorted(self.per_task.items()))}


def manifest_record(data: DataConfig, pieces: Iterable[dict | None]) -> dict | None:
    """The manifest's account: the rule's settings and what it dropped, in all (each document once) and per task
    (a document overlapping two tasks counted under each; every held-out task listed, zeros included), summed
    over the pieces' records; None when the data holds nothing out."""
    settings = data.decontamination()
    if not settings:
        return None
    total = {"documents": 0, "tokens": 0, "per_task": {t: {"documents": 0, "tokens": 0} for t in settings["tasks"]}}
    for record in pieces:
        total["documents"] += record["documents"]
        total["tokens"] += record["tokens"]
        for task, entry in record["per_task"].items():
            for key in ("documents", "tokens"):
                total["per_task"][task][key] += entry[key]
    return {**settings, "dropped": total}


def check_prepared(data: DataConfig, manifest: dict, location: str) -> None:
    """UserError naming data.decontam_tasks when prepared shards (found at a given data.dir, whose name the settings
    do not choose) were decontaminated otherwise than `data` asks: they are never reused silently."""
    made = manifest.get("decontamination") or None
    made = made and {"tasks": made["tasks"], "ngram": made["ngram"]}
    if made != data.decontamination():
        raise UserError(f"data.decontam_tasks: the shards at {location} were made with {summary_settings(made)}, "
                        f"unlike this config ({summary_settings(data.decontamination())}); leave data.dir empty "
                        "or prepare the data elsewhere")


def summary_settings(settings: dict | None) -> str:
    if not settings:
        return "nothing held out"
    return f"{len(settings['tasks'])} task(s) held out by {settings['ngram']}-grams ({', '.join(settings['tasks'])})"


def summary_line(record: dict) -> str:
    """A manifest's decontamination account in one line (prepare's output and the dry run both say it)."""
    dropped = record["dropped"]
    tasks = ", ".join(f"{task} {entry['documents']:,} ({entry['tokens']:,} tokens)"
                      for task, entry in dropped["per_task"].items())
    return (f"decontamination: {summary_settings(record)}: dropped {dropped['documents']:,} documents "
            f"({dropped['tokens']:,} tokens); per task: {tasks}")


def drop_overlapping(held: HeldOut, documents: Sequence[str], encoded: list, dropped: DropCounts) -> list:
    """The encoded documents that overlap no held-out task, in order; the others counted in `dropped` (their tokens
    with bos and eos, as the manifest counts tokens)."""
    kept = []
    for ids, mask in zip(encoded, held.overlaps(documents)):
        if mask:
            dropped.add(held.task_names(mask), len(ids) + 2)
        else:
            kept.append(ids)
    return kept


def write_held_out(tasks: Sequence[str], n: int, texts: EvaluationTexts, location: str) -> str:
    """Build the index of `tasks` and store it at `location` (a path or a URI); returns its digest."""
    body = HeldOut.build(tasks, n, texts).to_bytes()
    storage.write_bytes(location, body)
    return hashlib.sha256(body).hexdigest()[:16]


def held_out_digest(location: str) -> str:
    return hashlib.sha256(storage.read_bytes(location)).hexdigest()[:16]


@functools.lru_cache(maxsize=2)
def load_held_out(location: str, digest: str) -> HeldOut:
    """The stored index, read once per process and digest (every piece a worker writes shares it)."""
    return HeldOut.from_bytes(storage.read_bytes(location))
