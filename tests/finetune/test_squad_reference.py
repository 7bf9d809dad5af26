"""SQuAD exact match and F1 (raybiphase.finetune.scoring) equal the official evaluation's, question by question.

The reference is `torchmetrics.functional.text.squad` (the dev extra installs torchmetrics): the official SQuAD v1.1
evaluation script's normalisation, token F1 and best-over-gold-answers, as Hugging Face `evaluate`'s `squad` metric
runs it. `evaluate` itself cannot serve here: `evaluate.load("squad")` fetches its metric script from the Hugging
Face Hub at run time, and the tests run offline. For SQuAD v2's unanswerable questions the official v2 script scores
against the single gold answer "" (its `gold_answers = [""]` when a question has none), so the reference is given
that; its token F1 is v2's (1 when prediction and gold are both empty, 0 when only one is).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchmetrics.functional.text import squad as reference_squad

from raybiphase.finetune import scoring


def _reference(prediction: str, gold_answers: list[str]) -> tuple[float, float]:
    """(exact match, F1) in [0, 1] of one question by the reference; no gold answer is the v2 script's [""]."""
    golds = gold_answers or [""]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the official script's Python floats, not float32 tensors
    try:
        scores = reference_squad({"prediction_text": prediction, "id": "q"},
                                 {"answers": {"answer_start": [0] * len(golds), "text": golds}, "id": "q"})
    finally:
        torch.set_default_dtype(default)
    return float(scores["exact_match"]) / 100, float(scores["f1"]) / 100


def _ours(prediction: str, gold_answers: list[str]) -> tuple[float, float]:
    return scoring.squad_exact_match(prediction, gold_answers), scoring.squad_f1(prediction, gold_answers)


CASES = [
    ("Denver Broncos", ["Denver Broncos", "Denver Broncos"]),
    ("the Denver Broncos.", ["Denver Broncos"]),  # article and punctuation dropped
    ("DENVER   broncos", ["Denver Broncos"]),  # case and whitespace
    ("Broncos", ["Denver Broncos", "Broncos"]),  # the best gold answer counts
    ("Denver Broncos defeated the Carolina Panthers", ["Denver Broncos"]),  # partial overlap: F1 only
    ("Santa Clara, California", ["Levi's Stadium", "Santa Clara, California"]),
    ("theatre and an opera", ["the theatre", "opera"]),  # "the" inside a word stays
    ("1,000–2,000", ["1,000-2,000"]),  # an en dash is not ASCII punctuation in either
    ("", ["Denver Broncos"]),  # no answer given to an answerable question
    ("a the an", ["Denver"]),  # normalises to nothing
    ("", []),  # SQuAD v2: unanswerable, no answer given
    ("Denver", []),  # SQuAD v2: unanswerable, an answer given
    ("the", []),  # normalises to the empty answer
    ("Denver Denver Broncos", ["Denver Broncos Broncos"]),  # repeated tokens count as a multiset
]


@pytest.mark.parametrize("prediction, gold_answers", CASES)
def test_exact_match_and_f1_equal_the_official_scripts(prediction, gold_answers):
    assert _ours(prediction, gold_answers) == pytest.approx(_reference(prediction, gold_answers), abs=1e-9)


def _predictions(rng, record: dict) -> list[str]:
    """Spans of the context a QA head could return: the gold answer, the gold answer a few words wider or narrower,
    a span elsewhere, and no answer."""
    context, start = record["context"], record["answers"]["answer_start"][0]
    end = start + len(record["answers"]["text"][0])
    words_before, words_after = context[:start].split(" "), context[end:].split(" ")
    widen = int(rng.integers(1, 4))
    wider = " ".join(words_before[-widen:]) + context[start:end] + " ".join(words_after[:widen])
    gold_words = context[start:end].split()
    narrower = " ".join(gold_words[int(rng.integers(0, len(gold_words))):]) if gold_words else ""
    elsewhere = int(rng.integers(0, max(len(context) - 40, 1)))
    return [context[start:end], wider.strip(), narrower, context[elsewhere:elsewhere + 30].strip(), ""]


@pytest.mark.slow  # reads the offline SQuAD v1.1 dev set
def test_every_score_of_real_dev_questions_equals_the_official_scripts(offline_cache):
    from raybiphase.data import sources

    rng = np.random.default_rng(0)
    records = list(sources.squad("dev"))[::40]  # 265 questions across the dev set's articles
    checked = []
    for i, record in enumerate(records):
        golds = [] if i % 7 == 6 else list(record["answers"]["text"])  # some unanswerable, as in SQuAD v2
        for prediction in _predictions(rng, record):
            ours, reference = _ours(prediction, golds), _reference(prediction, golds)
            assert ours == pytest.approx(reference, abs=1e-9), (prediction, golds)
            checked.append(ours)
    exact, f1 = np.array(checked).T
    assert len(checked) > 1000 and 0.2 < exact.mean() < f1.mean() < 0.9  # wrong, partial and right answers
