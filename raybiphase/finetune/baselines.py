"""Baselines beside the fine-tuned encoders: BM25 on every retrieval task's test split, the majority class on every
sequence-classification task's; and the floor a diverged trial scores (`floor_scores`)."""

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


def floor_scores(task_name: str, *, max_examples: int = 0, max_eval_examples: int = 0,
                 source: str = "auto") -> dict:
    """What a diverged trial scores (issue 27: a collapsed run still counts against its LR, as in the authors'
    harness): the majority class's accuracy on validation and test for accuracy (what a model that learned
    nothing but the prior gets), 0 for F1, entity F1 and NDCG@10. Returns val_score, test_score and
    test_per_example (the majority's per-example hits for accuracy; empty otherwise, so a bootstrap leaves the
    seed out)."""
    task = get_task(task_name)
    if task.metric != "accuracy":
        return {"val_score": 0.0, "test_score": 0.0, "test_per_example": []}
    splits = load_splits(task, max_examples=max_examples, max_eval_examples=max_eval_examples, source=source)
    majority = _majority(task, splits.train)
    hits = {name: [float(r["label"] == majority) for r in split] for name, split in
            (("val", splits.val), ("test", splits.test))}
    return {"val_score": float(np.mean(hits["val"])), "test_score": float(np.mean(hits["test"])),
            "test_per_example": hits["test"]}
