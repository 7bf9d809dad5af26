"""Baselines beside the fine-tuned encoders: BM25 on every retrieval task's test split, the majority class on every
sequence-classification task's."""

from __future__ import annotations

import numpy as np

from raybiphase.finetune import scoring
from raybiphase.finetune.tasks import get_task, load_splits


def bm25_baseline(task_name: str, *, max_examples: int = 0, max_eval_examples: int = 0) -> dict:
    """The BM25 row of a retrieval task on its test split (capped like fine-tuning): test score and per-query scores."""
    task = get_task(task_name)
    test = load_splits(task, max_examples=max_examples, max_eval_examples=max_eval_examples).test
    rankings = scoring.bm25_rankings([q["text"] for q in test["queries"]], [p["text"] for p in test["passages"]],
                                     [p["pid"] for p in test["passages"]])
    per_query = scoring.retrieval_scores(rankings, [set(q["positives"]) for q in test["queries"]])
    return {"task": task.name, "dataset": task.dataset, "metric": task.metric,
            "test_score": float(np.mean(per_query["ndcg@10"])), "test_secondary": float(np.mean(per_query["mrr@10"])),
            "secondary_metric": task.secondary_metric, "test_per_example": per_query["ndcg@10"]}


def majority_baseline(task_name: str, *, max_examples: int = 0, max_eval_examples: int = 0) -> dict:
    """The majority-class row of a sequence-classification task: the training split's most frequent label (ties
    to the lower index) predicted for every test example, capped like fine-tuning."""
    task = get_task(task_name)
    splits = load_splits(task, max_examples=max_examples, max_eval_examples=max_eval_examples)
    counts = np.bincount([r["label"] for r in splits.train], minlength=task.num_labels)
    majority = int(np.argmax(counts))
    per_example = [float(r["label"] == majority) for r in splits.test]
    return {"task": task.name, "dataset": task.dataset, "metric": task.metric,
            "test_score": float(np.mean(per_example)), "test_secondary": float("nan"),
            "secondary_metric": task.secondary_metric, "test_per_example": per_example,
            "label": task.label_names[majority]}
