"""Baselines beside the fine-tuned encoders: BM25 on every retrieval task's test split, the majority class on every
sequence-classification task's; and each metric's floor, what a model that learned nothing scores and a diverged
trial is given (`FLOORS`, `floor_scores`)."""

from __future__ import annotations

import numpy as np

from raybiphase.finetune import scoring
from raybiphase.finetune.tasks import Task, TaskSplits, get_task, load_splits, relevance


def bm25_baseline(task_name: str, *, max_examples: int = 0, max_eval_examples: int = 0,
                  ir_relevance: str = "binary") -> dict:
    """The BM25 row of a retrieval task on its test split (capped like fine-tuning, relevance counted as
    finetune.ir_relevance says): test score and per-query scores. It ranks the judged passages whatever
    finetune.ir_corpus says."""
    task = get_task(task_name)
    test = load_splits(task, max_examples=max_examples, max_eval_examples=max_eval_examples,
                       ir_relevance=ir_relevance).test
    rankings = scoring.bm25_rankings([q["text"] for q in test["queries"]], [p["text"] for p in test["passages"]],
                                     [p["pid"] for p in test["passages"]])
    per_query = scoring.retrieval_scores(rankings, [relevance(q) for q in test["queries"]])
    return {"task": task.name, "dataset": task.dataset, "metric": task.metric,
            "test_score": float(np.mean(per_query["ndcg@10"])), "test_secondary": float(np.mean(per_query["mrr@10"])),
            "secondary_metric": task.secondary_metric, "test_per_example": per_query["ndcg@10"]}


def _majority(task, train: list) -> int:
    """The training split's most frequent label (ties to the lower index)."""
    return int(np.argmax(np.bincount([r["label"] for r in train], minlength=task.num_labels)))


def majority_baseline(task_name: str, *, max_examples: int = 0, max_eval_examples: int = 0) -> dict:
    """The majority-class row of a sequence-classification task: the training split's most frequent label (ties
    to the lower index) predicted for every test example, capped like fine-tuning."""
    task = get_task(task_name)
    splits = load_splits(task, max_examples=max_examples, max_eval_examples=max_eval_examples)
    majority = _majority(task, splits.train)
    per_example = [float(r["label"] == majority) for r in splits.test]
    return {"task": task.name, "dataset": task.dataset, "metric": task.metric,
            "test_score": float(np.mean(per_example)), "test_secondary": float("nan"),
            "secondary_metric": task.secondary_metric, "test_per_example": per_example,
            "label": task.label_names[majority]}


FLOORS = {
    "accuracy": "the training split's majority class predicted for every example",
    "entity_f1": "no entity predicted: F1 0",
    "f1": "no answer to any question: F1 0 where every question has one, the unanswerable share on SQuAD v2",
    "ndcg@10": "a uniformly random ranking of the evaluation corpus: its expected NDCG@10",
}
"""Each metric's floor: what a model that learned nothing scores, the score a diverged trial gets (`floor_of`)."""


def floor_scores(task_name: str, *, max_examples: int = 0, max_eval_examples: int = 0, source: str = "auto",
                 ir_corpus: str = "judged", ir_relevance: str = "binary", revisions: tuple[str, ...] = ()) -> dict:
    """`floor_of` the task's splits, loaded and capped as the trial's are: what a diverged trial of it scores."""
    task = get_task(task_name)
    return floor_of(task, load_splits(task, max_examples=max_examples, max_eval_examples=max_eval_examples,
                                      source=source, ir_corpus=ir_corpus, ir_relevance=ir_relevance,
                                      revisions=revisions))


def floor_of(task: Task, splits: TaskSplits) -> dict:
    """What a model that learned nothing scores on the task (`FLOORS`), computed from the labels alone, so a trial
    whose model diverged still gets it: a collapsed run counts against its LR, as in the authors' harness.

    Returns val_score, test_score, test_secondary (exact match for QA, MRR@10 for IR, else NaN) and
    test_per_example, entries like the task's head gives, one per test example in the same order (accuracy hits,
    [tp, predicted, gold] entity counts, F1 per question, NDCG@10 per query), so a bootstrap over the seeds
    counts a diverged one at its floor."""
    val, _ = _floor_entries(task, splits.val, splits.train)
    test, secondary = _floor_entries(task, splits.test, splits.train)
    return {"val_score": scoring.corpus_score(task.metric, val), "test_score": scoring.corpus_score(task.metric, test),
            "test_secondary": float(np.mean(secondary)) if len(secondary) else float("nan"),
            "test_per_example": test}


def _floor_entries(task: Task, split, train: list) -> tuple[list, list]:
    """(per-example entries, per-example secondary scores) of the floor on one evaluation split."""
    if task.metric == "accuracy":
        majority = _majority(task, train)
        return [float(r["label"] == majority) for r in split], []
    if task.metric == "entity_f1":
        return [[0, 0, len(scoring.bio_entities(r["tags"]))] for r in split], []
    if task.family == "QA":  # the empty answer: F1 and exact match are 1 exactly where there is no gold answer
        empty = [scoring.squad_f1("", r["answers"]["text"]) for r in split]
        return empty, empty
    pids = {p["pid"] for p in split["passages"]}
    expected = [scoring.random_ranking_scores(pids, relevance(q)) for q in split["queries"]]
    return [ndcg for ndcg, _ in expected], [mrr for _, mrr in expected]
