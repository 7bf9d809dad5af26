"""Scores of the fine-tuning tasks, pure Python and numpy (no torch, no Ray), each checked by hand in tests.

* accuracy (SC).
* SQuAD v1.1 exact match and F1 with the official answer normalisation (lower case, punctuation and the articles
  a/an/the removed, whitespace collapsed), the best over the gold answers (QA). An unanswerable question (SQuAD v2)
  has no gold answer: the empty prediction scores 1, anything else 0, as in the official v2 script.
* entity-level F1 over BIO tags (TC), the CoNLL-2000 `conlleval` reading that `seqeval` also uses by default:
  an entity starts at B-X, or at an I-X that does not continue an X entity; it is correct only when its type,
  start and end all match. Micro-averaged over the corpus, so it is not a mean of per-sentence scores: per-example
  entries are [true positives, predicted entities, gold entities] and `corpus_score` sums them back.
* NDCG@10 and MRR@10 (IR), and their expectation under a random ranking (a diverged trial's floor). A query's
  relevant passages are a set (binary relevance: each a gain of 1, as the authors' evaluation code counts them, the
  default) or a mapping passage id -> grade (finetune.ir_relevance "graded": TREC-DL 2019's 1-3 as the gain, as
  trec_eval counts them); MRR's first relevant passage is the first with a grade of 1 or more either way. And BM25
  (`bm25s`, Lucene's variant, k1=0.9 and b=0.4 as in Anserini, lower case, English stopwords removed, Snowball
  English stems): the baseline row of the retrieval tasks, ranked BM25_QUERY_BLOCK queries at a time, so its
  memory is that block's scores against the corpus, never the whole queries x passages matrix.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np

RANK_CUTOFF = 10

# ----------------------------------------------------------------------------------------------- SC


def accuracy_per_example(predictions: Sequence[int], labels: Sequence[int]) -> list[float]:
    return [float(p == y) for p, y in zip(predictions, labels, strict=True)]


# ----------------------------------------------------------------------------------------------- QA

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """The official SQuAD v1.1 normalisation."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact_match(prediction: str, gold_answers: Sequence[str]) -> float:
    if not gold_answers:
        return float(normalize_answer(prediction) == "")
    return max(float(normalize_answer(prediction) == normalize_answer(g)) for g in gold_answers)


def _token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_f1(prediction: str, gold_answers: Sequence[str]) -> float:
    if not gold_answers:
        return float(normalize_answer(prediction) == "")
    return max(_token_f1(prediction, g) for g in gold_answers)


# ----------------------------------------------------------------------------------------------- TC


def bio_entities(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """Entities (type, start, end exclusive) of a BIO sequence, conlleval style."""
    entities, start, kind = set(), None, None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-")
        continues = prefix == "I" and kind == label
        if start is not None and not continues:
            entities.add((kind, start, i))
            start, kind = None, None
        if prefix == "B" or (prefix == "I" and not continues):
            start, kind = i, label
    return entities


def entity_counts(predicted: Sequence[str], gold: Sequence[str]) -> list[int]:
    """[true positives, predicted entities, gold entities] of one sequence."""
    pred, true = bio_entities(predicted), bio_entities(gold)
    return [len(pred & true), len(pred), len(true)]


def entity_f1(counts: Iterable[Sequence[int]]) -> float:
    """Micro F1 from per-example counts; 0 when there is nothing to score (seqeval's convention)."""
    rows = list(counts)
    tp, n_pred, n_gold = (sum(c) for c in zip(*rows)) if rows else (0, 0, 0)
    if tp == 0:
        return 0.0
    precision, recall = tp / n_pred, tp / n_gold
    return 2 * precision * recall / (precision + recall)


# ----------------------------------------------------------------------------------------------- IR


Relevance = set[str] | Mapping[str, float]
"""A query's relevant passages: ids (binary, grade 1 each) or id -> grade (only grades of 1 or more)."""


def _grades(relevant: Relevance) -> Mapping[str, float]:
    return relevant if isinstance(relevant, Mapping) else dict.fromkeys(relevant, 1.0)


def ndcg_at_k(ranked: Sequence[str], relevant: Relevance, k: int = RANK_CUTOFF) -> float:
    """DCG of the top k (gain = grade, discount log2(rank + 1)) over the ideal ordering's."""
    grades = _grades(relevant)
    dcg = sum(grades.get(pid, 0.0) / math.log2(i + 2) for i, pid in enumerate(ranked[:k]))
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(grades.values(), reverse=True)[:k]))
    return dcg / ideal if ideal else 0.0


def mrr_at_k(ranked: Sequence[str], relevant: Relevance, k: int = RANK_CUTOFF) -> float:
    grades = _grades(relevant)
    for i, pid in enumerate(ranked[:k]):
        if grades.get(pid, 0.0) >= 1:
            return 1.0 / (i + 1)
    return 0.0


def rank_by_scores(scores: np.ndarray, pids: Sequence[str], k: int = RANK_CUTOFF) -> list[list[str]]:
    """Top-k passage ids per row of a (queries, passages) score matrix, by score then passage order (the lower
    index first among equal scores). It ranks the rows it is given: `bm25_rankings` hands it a block of queries at
    a time; the bi-encoder ranks in chunks of passages (raybiphase.finetune.heads.ir.top_k), in the same order."""
    k = min(k, scores.shape[1])
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[pids[j] for j in row] for row in top]


def retrieval_scores(rankings: Sequence[Sequence[str]], relevant: Sequence[Relevance]) -> dict[str, list[float]]:
    """Per-query NDCG@10 and MRR@10."""
    return {"ndcg@10": [ndcg_at_k(r, rel) for r, rel in zip(rankings, relevant, strict=True)],
            "mrr@10": [mrr_at_k(r, rel) for r, rel in zip(rankings, relevant, strict=True)]}


def random_ranking_scores(passages: Collection[str], relevant: Relevance,
                          k: int = RANK_CUTOFF) -> tuple[float, float]:
    """(NDCG@k, MRR@k) a uniformly random ranking of the corpus `passages` scores in expectation for a query with
    relevance `relevant` (some of its passages may lie outside the corpus: they still set the ideal DCG, as in
    `ndcg_at_k`): the floor of a retrieval model that learned nothing. Each rank holds any given passage with
    probability 1 / len(passages), so its expected gain is the corpus's relevant gains' mean over the corpus; the
    first relevant passage is at rank r with the hypergeometric probability of r - 1 misses, then a hit."""
    grades = _grades(relevant)
    found = [grade for pid, grade in grades.items() if pid in passages]
    n_passages, n_found = len(passages), len(found)
    if not n_passages or not n_found:
        return 0.0, 0.0
    shown = min(k, n_passages)
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(grades.values(), reverse=True)[:k]))
    ndcg = sum(found) / n_passages * sum(1.0 / math.log2(i + 2) for i in range(shown)) / ideal
    mrr, misses = 0.0, 1.0  # misses: the chance that the ranks before this one hold no relevant passage
    for rank in range(1, shown + 1):
        remaining = n_passages - rank + 1
        mrr += misses * n_found / remaining / rank
        misses *= max(remaining - n_found, 0) / remaining
    return ndcg, mrr


BM25_K1, BM25_B = 0.9, 0.4  # Anserini's defaults, the usual MS MARCO BM25 row
BM25_QUERY_BLOCK = 256
"""Queries BM25 scores at once: a block's scores are BM25_QUERY_BLOCK x passages float32 (16 MiB over MS MARCO's
16,700 judged passages, plus the sort's int64 indices), where the whole matrix of its 7,000 dev queries would be
0.47 GB, and 250 GB over its whole collection."""


def _bm25_tokens(texts: Sequence[str]) -> list[list[str]]:
    import bm25s
    import Stemmer

    return bm25s.tokenize(list(texts), lower=True, stopwords="en", stemmer=Stemmer.Stemmer("english"),
                          return_ids=False, show_progress=False)


def _bm25_index(passages: Sequence[str], k1: float, b: float):
    import bm25s

    index = bm25s.BM25(method="lucene", k1=k1, b=b)
    index.index(_bm25_tokens(passages), show_progress=False)
    return index


def _bm25_rows(index, query_tokens: Sequence[list[str]], n_passages: int) -> np.ndarray:
    """(len(query_tokens), n_passages) scores; a query with no token left (all stopwords) scores 0 everywhere."""
    if not query_tokens:
        return np.zeros((0, n_passages))
    return np.stack([index.get_scores(tokens) if tokens else np.zeros(n_passages) for tokens in query_tokens])


def bm25_scores(queries: Sequence[str], passages: Sequence[str], *, k1: float = BM25_K1,
                b: float = BM25_B) -> np.ndarray:
    """(queries, passages) Lucene BM25 scores from `bm25s`: lower case, English stopwords out, Snowball stems. The
    whole matrix: for a few queries; `bm25_rankings` ranks a split without it."""
    return _bm25_rows(_bm25_index(passages, k1, b), _bm25_tokens(queries), len(passages))


def bm25_rankings(queries: Sequence[str], passages: Sequence[str], pids: Sequence[str], k: int = RANK_CUTOFF, *,
                  block: int = BM25_QUERY_BLOCK, k1: float = BM25_K1, b: float = BM25_B) -> list[list[str]]:
    """Top-k passage ids per query by BM25, exactly `rank_by_scores` over `bm25_scores`'s matrix (ties to the
    lower passage index), scored `block` queries at a time: memory block x passages, whatever the query count."""
    index, tokens = _bm25_index(passages, k1, b), _bm25_tokens(queries)
    return [ranking for start in range(0, len(tokens), block)
            for ranking in rank_by_scores(_bm25_rows(index, tokens[start:start + block], len(passages)), pids, k)]


# ----------------------------------------------------------------------------------------------- corpus


def corpus_score(metric: str, per_example: Sequence) -> float:
    """The task score from per-example entries (what a bootstrap resamples): micro F1 for entities, else the mean."""
    if metric == "entity_f1":  # [tp, predicted, gold] per sentence, nested or flat (as rows store them)
        return entity_f1(np.asarray(per_example, dtype=float).reshape(-1, 3).tolist())
    return float(np.mean(per_example)) if len(per_example) else float("nan")
