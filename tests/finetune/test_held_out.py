"""No offline task validates or tests on text a model pretrained on: every validation and test text of every
offline task is looked for in the whole offline pretraining corpus, and validation stays about 5% of training, drawn
the same way in every process. No model, no Ray."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from raybiphase.data import sources
from raybiphase.finetune import tasks

ANCHOR = 16
"""Bytes of a text looked up before it is compared in full; shorter texts ("It rained.") recur by chance and are not
looked for."""
_WORD_BYTE = np.zeros(256, dtype=bool)
_WORD_BYTE[[*range(ord("0"), ord("9") + 1), *range(ord("A"), ord("Z") + 1), *range(ord("a"), ord("z") + 1)]] = True
_MIX = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F], dtype=np.uint64)


def normalise(text: str) -> str:
    """Whitespace collapsed and commas dropped, in the corpus and in the texts alike: a text still occurs where it
    did, and comma restoration's comma-less sentences are found where the corpus has them with their commas."""
    return " ".join(text.replace(",", "").split())


def _hash(heads: np.ndarray) -> np.ndarray:
    return (heads.view("<u8") * _MIX).sum(axis=1, dtype=np.uint64)


class PretrainingIndex:
    """Exact search of texts in a corpus, wherever they occur except starting inside a word ("He left." is not found
    in "She left."): a text is looked up by a hash of its first ANCHOR bytes among every such place in the corpus, then
    compared in full at each place found."""

    def __init__(self, documents):
        self.blob = "\n".join(normalise(d) for d in documents).encode()
        data = np.frombuffer(self.blob + b"\n" * ANCHOR, dtype=np.uint8)
        starts = np.concatenate([[0], np.flatnonzero(~_WORD_BYTE[data[: len(self.blob) - 1]]) + 1])
        starts = starts[data[starts] != ord(" ")]
        heads = as_strided(data, shape=(len(self.blob), ANCHOR), strides=(1, 1))[starts]
        keys = _hash(np.ascontiguousarray(heads))
        order = np.argsort(keys)
        self.keys, self.starts = keys[order], starts[order]

    def found(self, texts: list[str]) -> list[str]:
        """The texts (normalised, ANCHOR bytes or longer) that occur in the corpus."""
        queries = [q for q in (normalise(t).encode() for t in texts) if len(q) >= ANCHOR]
        heads = np.frombuffer(b"".join(q[:ANCHOR] for q in queries), dtype=np.uint8).reshape(-1, ANCHOR)
        keys = _hash(heads)
        lo, hi = np.searchsorted(self.keys, keys, "left"), np.searchsorted(self.keys, keys, "right")
        return [q.decode() for q, a, b in zip(queries, lo, hi)
                if any(self.blob.startswith(q, self.starts[i]) for i in range(a, b))]


@pytest.fixture(scope="module")
def pretraining_index(offline_cache):
    return PretrainingIndex(sources.pretraining_texts())


def evaluated_texts(task: tasks.Task, part) -> list[str]:
    """What a task reads of a paragraph: passages, contexts, sentences, leads or tweets (SQuAD questions and Wikidata
    descriptions are written about a text, not taken from any)."""
    if task.family == "IR":
        return [p["text"] for p in part["passages"]]
    if task.family == "QA":
        return [r["context"] for r in part]
    if task.family == "TC":
        return [" ".join(r["words"]) for r in part]
    return [r["text_pair"] or r["text"] for r in part]


def test_the_index_finds_a_sentence_of_a_document_and_not_a_word_cut_in_two():
    index = PretrainingIndex(["The river, which crosses the old city, floods every spring.", "Another document."])
    found = index.found(["which crosses the old city floods", "the old city, floods every spring.",
                         "he river which crosses the old city",
                         "Another document.", "The river, which crosses the new city", "short one"])
    assert found == ["which crosses the old city floods", "the old city floods every spring.", "Another document."]


@pytest.mark.slow  # every offline task's evaluation text searched in the corpus: seconds each
@pytest.mark.parametrize("name", tasks.OFFLINE_TASKS)
def test_validation_is_about_5_percent_and_no_evaluated_text_is_pretraining_text(name, pretraining_index):
    task = tasks.get_task(name)
    parts = task.offline()
    rows = (lambda split: split["queries"]) if task.family == "IR" else (lambda split: split)
    train, val = (rows(parts[0]), rows(parts[1])) if len(parts) == 3 else tasks.split_validation(rows(parts[0]))
    assert 0.04 < len(val) / (len(train) + len(val)) < 0.06
    splits = tasks.make_splits(task, parts, max_examples=1)  # validation and test whole, as a run evaluates them
    for part_name, part in (("validation", splits.val), ("test", splits.test)):
        texts = evaluated_texts(task, part)
        assert len(texts) > 100
        leaked = pretraining_index.found(texts)
        assert not leaked, f"{name}: {len(leaked)} {part_name} texts are pretraining text, e.g. {leaked[0][:100]!r}"


@pytest.mark.slow  # every SQuAD task's splits loaded
def test_squad_tasks_hold_out_whole_articles(offline_cache):
    validation = set(sources.squad_contexts("validation"))
    squad_train, squad_val, _ = tasks.get_task("squad").offline()
    assert {r["context"] for r in squad_val} == validation and not {r["context"] for r in squad_train} & validation
    assert not {r["title"] for r in squad_train} & {r["title"] for r in squad_val}  # by article
    retrieval = tasks.load_splits(tasks.get_task("squad_retrieval"), max_examples=40)
    assert {p["text"] for p in retrieval.val["passages"]} <= validation  # the validation corpus too, not only queries
    assert {q["qid"] for q in retrieval.val["queries"]} <= {r["id"] for r in squad_val}
    assert not {pair["passage"] for pair in retrieval.train} & validation


def test_validation_is_drawn_the_same_way_every_time(offline_cache):
    # sha256 of the article's title, not Python's salted hash(): the same 886 paragraphs in every process
    assert len(sources.squad_contexts("validation")) == 886
    squad = tasks.get_task("squad")
    drawn = tasks.make_splits(squad, squad.offline(), max_examples=50, max_eval=50)
    again = tasks.load_splits(squad, max_examples=50)
    assert drawn.val == again.val and drawn.train == again.train and drawn.test == again.test
