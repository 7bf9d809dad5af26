"""NDCG@10 and MRR@10 (raybiphase.finetune.scoring) equal trec_eval's, through `ir_measures`' pytrec_eval provider
(trec_eval's own C code), query by query to 1e-9: on rankings the project's ranking code makes, with graded qrels
(TREC-DL's 0-3: the grade is the gain, grade 0 is judged non-relevant) and binary ones, relevant passages ranked
past 10 or never, tied scores and queries without a relevant passage.

Two differences are deliberate, and each is checked here as stated:
* ties: the project ranks equal scores by passage order (the lower index first, `rank_by_scores`), trec_eval by
  passage id in descending order; the same tied scores score alike when the two orders agree.
* a query with no relevant passage: both score it 0 when it has judgments; trec_eval leaves a query with no
  judgment at all out of its mean, the project scores it 0 and counts it (a task's every query is evaluated).
"""

from __future__ import annotations

import ir_measures
import numpy as np
import pytest

from raybiphase.finetune import scoring

trec_eval = ir_measures.pytrec_eval
MEASURES = {"ndcg@10": ir_measures.nDCG @ 10, "mrr@10": ir_measures.RR @ 10}


def _reference(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """{metric: {query id: trec_eval's value}}."""
    by_measure = {str(m): name for name, m in MEASURES.items()}
    values = {name: {} for name in MEASURES}
    for metric in trec_eval.iter_calc(list(MEASURES.values()), qrels, run):
        values[by_measure[str(metric.measure)]][metric.query_id] = metric.value
    return values


def _ranked_run(qids: list[str], rankings: list[list[str]]) -> dict[str, dict[str, float]]:
    """A run whose scores fall strictly down the project's ranking, so trec_eval reads the same order."""
    return {q: {pid: float(len(r) - i) for i, pid in enumerate(r)} for q, r in zip(qids, rankings, strict=True)}


def _judged(rng, n_queries: int, pids: list[str]) -> dict[str, dict[str, int]]:
    """TREC-DL-like qrels: 1-6 judged passages per query graded 0-3; every fifth query only judged non-relevant."""
    qrels = {}
    for q in range(n_queries):
        judged = rng.choice(pids, int(rng.integers(1, 7)), replace=False)
        grades = [0] * len(judged) if q % 5 == 4 else rng.integers(0, 4, len(judged))
        qrels[f"q{q}"] = {str(pid): int(g) for pid, g in zip(judged, grades)}
    return qrels


def _relevance(grades: dict[str, int], graded: bool):
    relevant = {pid: float(g) for pid, g in grades.items() if g >= 1}
    return relevant if graded else set(relevant)


@pytest.mark.parametrize("graded", [True, False], ids=["graded", "binary"])
def test_ndcg_and_mrr_at_10_equal_trec_evals_query_by_query(graded):
    rng = np.random.default_rng(7)
    pids = [f"D{i}" for i in range(120)]
    qrels = _judged(rng, 60, pids)
    qids = list(qrels)
    scores = rng.normal(size=(len(qids), len(pids)))
    for row, q in enumerate(qids):  # relevant passages a little ahead: some in the top 10, some past it
        for pid, grade in qrels[q].items():
            scores[row, pids.index(pid)] += grade * rng.uniform(0.3, 1.5)
    rankings = scoring.rank_by_scores(scores, pids, k=scoring.RANK_CUTOFF)
    ours = scoring.retrieval_scores(rankings, [_relevance(qrels[q], graded) for q in qids])
    judged = qrels if graded else {q: {p: int(g >= 1) for p, g in j.items()} for q, j in qrels.items()}
    reference = _reference(judged, _ranked_run(qids, rankings))
    for name in MEASURES:
        assert [reference[name][q] for q in qids] == pytest.approx(ours[name], abs=1e-9, rel=0)
    assert 0.1 < np.mean(ours["ndcg@10"]) < 0.9 and 0 in ours["mrr@10"]  # neither all hits nor all misses
    if graded:  # the grades matter: binary gains score these rankings otherwise
        binary = scoring.retrieval_scores(rankings, [_relevance(qrels[q], False) for q in qids])
        assert binary["ndcg@10"] != pytest.approx(ours["ndcg@10"], abs=1e-6)


def test_tied_scores_rank_by_passage_order_where_trec_eval_ranks_by_descending_id():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 3, size=(40, 30)).astype(float)  # many ties
    qrels = _judged(rng, 40, [str(i) for i in range(30)])
    qids = list(qrels)
    descending = [f"P{i:02d}" for i in range(29, -1, -1)]  # passage order = descending id: the two rules agree
    ascending = descending[::-1]
    for pids, agree in ((descending, True), (ascending, False)):
        rename = dict(zip((str(i) for i in range(30)), pids, strict=True))
        judged = {q: {rename[p]: g for p, g in j.items()} for q, j in qrels.items()}
        ours = scoring.retrieval_scores(scoring.rank_by_scores(scores, pids),
                                        [_relevance(judged[q], True) for q in qids])
        tied_run = {q: {pid: float(s) for pid, s in zip(pids, scores[row], strict=True)}
                    for row, q in enumerate(qids)}
        reference = [_reference(judged, tied_run)["ndcg@10"][q] for q in qids]
        same = np.allclose(reference, ours["ndcg@10"], atol=1e-9, rtol=0)
        assert same == agree


def test_a_query_without_a_relevant_passage_scores_0_and_counts_where_trec_eval_skips_an_unjudged_one():
    ranking = [["a", "b", "c"], ["a", "b", "c"], ["c", "a", "b"]]
    qrels = {"judged_non_relevant": {"a": 0, "b": 0}, "relevant": {"a": 2, "c": 1}}  # "unjudged": no qrels
    qids = ["judged_non_relevant", "unjudged", "relevant"]
    ours = scoring.retrieval_scores(ranking, [_relevance(qrels.get(q, {}), True) for q in qids])
    reference = _reference(qrels, _ranked_run(qids, ranking))
    assert ours["ndcg@10"][0] == reference["ndcg@10"]["judged_non_relevant"] == 0.0
    assert ours["mrr@10"][0] == reference["mrr@10"]["judged_non_relevant"] == 0.0
    assert "unjudged" not in reference["ndcg@10"] and ours["ndcg@10"][1] == ours["mrr@10"][1] == 0.0
    assert ours["ndcg@10"][2] == pytest.approx(reference["ndcg@10"]["relevant"], abs=1e-9)
    mean = trec_eval.calc_aggregate([MEASURES["mrr@10"]], qrels, _ranked_run(qids, ranking))[MEASURES["mrr@10"]]
    assert mean == pytest.approx((0 + 1) / 2) and np.mean(ours["mrr@10"]) == pytest.approx((0 + 0 + 1) / 3)


@pytest.mark.slow  # loads the offline SQuAD retrieval split (a few seconds) and ranks it with BM25
def test_bm25_rankings_of_real_squad_questions_score_as_trec_eval_scores_them(offline_cache):
    from raybiphase.finetune.tasks import get_task, load_splits, relevance

    test = load_splits(get_task("squad_retrieval"), max_examples=200).test
    queries = test["queries"]
    rankings = scoring.bm25_rankings([q["text"] for q in queries], [p["text"] for p in test["passages"]],
                                     [p["pid"] for p in test["passages"]])
    ours = scoring.retrieval_scores(rankings, [relevance(q) for q in queries])
    qids = [q["qid"] for q in queries]
    qrels = {q["qid"]: dict.fromkeys(q["positives"], 1) for q in queries}
    reference = _reference(qrels, _ranked_run(qids, rankings))
    for name in MEASURES:
        assert [reference[name][q] for q in qids] == pytest.approx(ours[name], abs=1e-9, rel=0)
    assert 0.5 < np.mean(ours["mrr@10"]) < 1  # a real ranking: mostly hits, not all
