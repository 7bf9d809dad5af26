"""Retrieval evaluation at the paper's scale, by the authors' protocol: the bi-encoder's exact top-k over passage
chunks ranks as the full score matrix does (ties included), NDCG counts graded qrels' grades, each task of a training
group is validated on its own split (so each chooses its own LR), and the dry run prices evaluation. No Ray."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raybiphase.config import SweepSpec, load
from raybiphase.finetune import scoring
from raybiphase.finetune.heads.ir import RetrievalHead, top_k

# ------------------------------------------------------------------------------------------------ ranking


def _tied(rng, rows: int, dim: int) -> torch.Tensor:
    """Small integer embeddings: their dot products are exact, and many are equal."""
    return torch.tensor(rng.integers(-2, 3, (rows, dim)).astype(np.float32))


@pytest.mark.parametrize("chunk, block", [(7, 5), (1, 1), (64, 64), (3, 100)])
def test_chunked_top_k_ranks_exactly_as_the_full_matrix_ties_to_the_lower_passage(chunk, block):
    rng = np.random.default_rng(0)
    for _ in range(40):
        queries, passages = _tied(rng, int(rng.integers(1, 25)), 3), _tied(rng, int(rng.integers(1, 50)), 3)
        k = int(rng.integers(1, 14))
        full = scoring.rank_by_scores((queries @ passages.T).numpy(), list(range(len(passages))), k)
        assert top_k(queries, passages, k, chunk=chunk, block=block).tolist() == full


def _old_evaluation(queries: torch.Tensor, passages: torch.Tensor, pids: list[str], relevant: list) -> dict:
    """What evaluation computed before ranking in chunks: the whole (queries, passages) matrix, sorted."""
    return scoring.retrieval_scores(scoring.rank_by_scores((queries @ passages.T).numpy(), pids), relevant)


def test_the_heads_evaluation_scores_every_query_as_the_full_matrix_ranking_did(monkeypatch):
    rng = np.random.default_rng(1)
    queries, passages = _tied(rng, 30, 4), _tied(rng, 200, 4)
    pids = [f"p{i}" for i in range(200)]
    relevant = [set(rng.choice(pids, 3, replace=False)) for _ in range(30)]
    head = RetrievalHead.__new__(RetrievalHead)
    encoded = {"queries": queries, "passages": passages}
    monkeypatch.setattr(RetrievalHead, "_encode_all", lambda self, model, sequences: encoded[sequences])
    monkeypatch.setattr(top_k, "__kwdefaults__", {"chunk": 16, "block": 7})  # many chunks, as a large corpus
    evaluation = head.evaluate(None, ("queries", relevant, "passages", pids))
    old = _old_evaluation(queries, passages, pids, relevant)
    assert evaluation.per_example == old["ndcg@10"] and evaluation.secondary == float(np.mean(old["mrr@10"]))
    assert 0 < evaluation.score < 1


def test_ndcg_counts_graded_relevance_by_its_grade_and_binary_relevance_as_grade_one():
    ranked = ["a", "b", "c", "d"]
    graded = {"b": 3, "c": 1, "e": 2}  # e is relevant but never retrieved: it raises the ideal
    dcg = 3 / math.log2(3) + 1 / math.log2(4)
    ideal = 3 + 2 / math.log2(3) + 1 / math.log2(4)
    assert scoring.ndcg_at_k(ranked, graded) == pytest.approx(dcg / ideal)
    assert scoring.ndcg_at_k(ranked, {"b", "c", "e"}) == pytest.approx(
        (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3) + 1 / math.log2(4)))
    assert scoring.mrr_at_k(ranked, graded) == 0.5
    head = RetrievalHead.__new__(RetrievalHead)  # a query's grades reach the metric when its qrels carry them
    head.query = head.document = lambda text: [1]
    prepared = head.prepare_eval({"queries": [{"qid": "q", "text": "x", "positives": ["b", "c"], "grades": graded},
                                              {"qid": "r", "text": "y", "positives": ["a"]}],
                                  "passages": [{"pid": "a", "text": "z"}]})
    assert prepared[1] == [graded, {"a"}]


# ------------------------------------------------------------------------------------------------ per-task validation


def test_a_stopped_riders_row_keeps_its_own_validation_score_not_the_trained_tasks():
    from raybiphase.finetune import fanout
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.results.rows import FinetuneRow

    trial = TrialSpec.plain("unused", "msmarco", lr=1e-4, seed=0, also_test=("nq", "mldr"))
    metrics = {"step": 3, "val_score": 0.5, fanout.rider_metric("nq"): 0.7, fanout.rider_metric("mldr"): 0.2}
    rows: list[FinetuneRow] = fanout.trial_rows(trial, metrics, failed=False)  # the last report ASHA stopped it at
    assert [(r.task, r.val_score, r.stopped_early) for r in rows] == [
        ("msmarco", 0.5, True), ("nq", 0.7, True), ("mldr", 0.2, True)]


# ------------------------------------------------------------------------------------------------ the dry run


def _spec(**finetune) -> SweepSpec:
    return load(SweepSpec, "sweeps/quickstart.yaml", [f"finetune.{key}={value}" for key, value in {
        "tasks": "[msmarco, nq, mldr]", "max_examples": 0, "max_eval_examples": 0, "max_len": 128,
        **finetune}.items()])


def test_the_dry_runs_fine_tuning_gpu_hours_count_every_evaluation_of_every_task():
    from raybiphase.planning.cost import trial_count
    from raybiphase.planning.plan import describe, make_plan

    spec = _spec()
    plan = make_plan(spec)
    ft = spec.finetune
    trials = (len(plan.checkpoints()) + len(plan.controls)) * len(ft.lrs) * len(ft.seeds)
    # one trial trains msmarco's pairs; msmarco, nq and mldr are each validated and tested on its model
    trial = trial_count(("msmarco", "nq", "mldr"), "tiny", spec)
    assert trial.validations == math.ceil(trial.steps / ft.eval_every)
    assert plan.finetune_gpu_hours(spec, evaluation_only=True) == pytest.approx(trials * trial.eval_s / 3600)
    assert plan.finetune_gpu_hours(spec) == pytest.approx(trials * (trial.train_s + trial.eval_s) / 3600)
    scored_apart = sum(trial_count((name,), "tiny", spec).eval_s for name in ("msmarco", "nq", "mldr"))
    assert trial.eval_s == pytest.approx(scored_apart)
    assert "of them evaluation" in describe(plan, spec)
    # validating more often, or over the whole collections, costs more
    assert make_plan(_spec(eval_every=50)).finetune_gpu_hours(_spec(eval_every=50)) > plan.finetune_gpu_hours(spec)
    full = _spec(ir_corpus="full")
    assert make_plan(full).finetune_gpu_hours(full) > 100 * plan.finetune_gpu_hours(spec)


@pytest.mark.parametrize("task, cap", [("squad_retrieval", 0), ("squad_retrieval", 800), ("wiki_retrieval", 0),
                                       ("tweets", 0), ("tweets", 800)])
def test_the_offline_tasks_evaluation_sizes_are_their_splits(task, cap):
    from raybiphase.finetune.eval_sizes import evaluation_inputs, training_examples
    from raybiphase.finetune.tasks import get_task, load_splits

    splits = load_splits(get_task(task), max_examples=cap)

    def inputs(split) -> int:
        return len(split["queries"]) + len(split["passages"]) if isinstance(split, dict) else len(split)
    assert evaluation_inputs(task, cap) == (inputs(splits.val), inputs(splits.test))
    assert training_examples(task, cap) == len(splits.train)  # what caps a trial at one epoch


def test_every_task_has_evaluation_sizes():
    from raybiphase.finetune.eval_sizes import SPLITS, TRAIN
    from raybiphase.finetune.tasks import TASKS

    assert set(SPLITS) == set(TASKS)
    assert set(TRAIN) == {name for name, task in TASKS.items() if not task.train_task}  # every task that trains
