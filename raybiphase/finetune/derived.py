"""The offline tasks SQuAD's paragraphs are turned into, as pure functions of its records: answer spans as BIO tags
(`bio_sentences`, `tag_sentence`), comma restoration (`sentence_records`, `tag_commas`), word-order detection
(`shuffle_sentences`, `shuffle_words`) and QA cut to the answer's sentence (`answer_sentences`). Light records are
made for a whole split; the `tag_*` and `shuffle_words` finishers run only on the examples a run keeps
(raybiphase.finetune.tasks registers them)."""

from __future__ import annotations

import hashlib
import random
import re

from raybiphase.data import sources

BIO_TAGS = ("O", "B-ANS", "I-ANS")
COMMA_TAGS = ("O", "B-COMMA")
_CLOSERS = "\"'\u201d\u2019)]"  # what may follow a word's comma: closing quotes and brackets
_TRAILING_COMMA = re.compile(f",(?=[{re.escape(_CLOSERS)}]*$)")
SHUFFLE_LABELS = ("original", "shuffled")
SHUFFLE_MIN_WORDS = 8


def bio_sentences(records: list[dict]) -> list[dict]:
    """SQuAD answers as spans over their paragraph, one light record per sentence: {context, start, end, spans}.

    Each question's first answer is a span of its paragraph; overlapping spans are resolved earliest start first
    (the longer at equal starts). Sentences come from `sources.split_sentences`. Words and tags are made by
    `tag_sentence` only for the examples a run keeps (tagging all 90k SQuAD train sentences takes seconds).
    """
    spans_by_context: dict[str, set[tuple[int, int]]] = {}
    for rec in records:
        if rec["answers"]["text"]:
            start = rec["answers"]["answer_start"][0]
            spans_by_context.setdefault(rec["context"], set()).add((start, start + len(rec["answers"]["text"][0])))
    sentences = []
    for context, spans in spans_by_context.items():
        kept: list[tuple[int, int]] = []
        for start, end in sorted(spans, key=lambda span: (span[0], -span[1])):
            if not kept or start >= kept[-1][1]:
                kept.append((start, end))
        sentences += [{"context": context, "start": s, "end": e, "spans": kept}
                      for s, e in sources.split_sentences(context)]
    return sentences


def tag_sentence(sentence: dict) -> dict:
    """{words, tags}: whitespace-separated words of the sentence, BIO-tagged; a word is inside an answer span when
    their characters overlap."""
    context, spans = sentence["context"], sentence["spans"]
    words, tags, previous = [], [], None
    for match in re.finditer(r"\S+", context[sentence["start"]:sentence["end"]]):
        start, end = match.start() + sentence["start"], match.end() + sentence["start"]
        span = next((k for k, (s, e) in enumerate(spans) if s < end and start < e), None)
        words.append(match.group())
        tags.append("O" if span is None else "I-ANS" if span == previous else "B-ANS")
        previous = span
    return {"words": words, "tags": tags}


def sentence_records(contexts: list[str]) -> list[dict]:
    """Light records, one {"sentence"} per sentence of the paragraphs (`sources.split_sentences`): comma restoration
    and word order start from these, and `tag_commas` or `shuffle_words` finishes the examples a run keeps."""
    return [{"sentence": context[s:e]} for context in contexts for s, e in sources.split_sentences(context)]


def tag_commas(record: dict) -> dict:
    """{words, tags}: the sentence's whitespace-separated words with the comma that ended a word removed (closing
    quotes after it stay), that word tagged B-COMMA, every other word O. The labels are the authors' own punctuation;
    a model must place it from the words alone (a token task that rewards knowing the language's syntax)."""
    words, tags = [], []
    for word in record["sentence"].split():
        bare = _TRAILING_COMMA.sub("", word)
        comma = bare != word and bool(bare.strip(_CLOSERS))
        words.append(bare if comma else word)
        tags.append("B-COMMA" if comma else "O")
    return {"words": words, "tags": tags}


def shuffle_sentences(contexts: list[str]) -> list[dict]:
    """Word-order detection: the `sentence_records` with at least SHUFFLE_MIN_WORDS words."""
    return [r for r in sentence_records(contexts) if len(r["sentence"].split()) >= SHUFFLE_MIN_WORDS]


def shuffle_words(record: dict) -> dict:
    """{text, text_pair, label}: half the sentences (by a hash of the sentence) with the words between the first and
    the last shuffled (seeded by that hash; rotated by one when the shuffle left them in place), label "shuffled";
    the rest as written, "original". Both have the same bag of words, the same first word (its capital) and the same
    last (its full stop): only a model that knows the language's word order tells them apart."""
    words = record["sentence"].split()
    digest = hashlib.sha256(f"raybiphase-shuffle:{record['sentence']}".encode()).digest()
    inner = words[1:-1]
    if digest[0] % 2:
        random.Random(digest[1:9]).shuffle(inner)
        if inner == words[1:-1]:
            inner = inner[1:] + inner[:1]
    shuffled = inner != words[1:-1]
    return {"text": " ".join([words[0], *inner, words[-1]]), "text_pair": None,
            "label": SHUFFLE_LABELS.index("shuffled" if shuffled else "original")}


def answer_sentences(records: list[dict]) -> list[dict]:
    """SQuAD with each context cut to the sentence that holds the question's first answer (`sources.split_sentences`),
    keeping the answers that lie inside that sentence, their starts shifted; a question whose first answer crosses a
    sentence boundary is dropped, as are unanswerable ones. The question still has to be matched to a span, in ~25
    words instead of ~120: extractive QA that a small model learns within minutes."""
    out, bounds = [], {}
    for rec in records:
        answers = rec["answers"]
        if not answers["text"]:
            continue
        context = rec["context"]
        if context not in bounds:
            bounds[context] = sources.split_sentences(context)
        first = answers["answer_start"][0]
        start, end = next(((s, e) for s, e in bounds[context] if s <= first < e), (0, 0))
        kept = [(text, at - start) for text, at in zip(answers["text"], answers["answer_start"])
                if start <= at and at + len(text) <= end]
        if kept and kept[0][1] == first - start:
            out.append({"id": rec["id"], "question": rec["question"], "context": context[start:end],
                        "answers": {"text": [t for t, _ in kept], "answer_start": [a for _, a in kept]}})
    return out
