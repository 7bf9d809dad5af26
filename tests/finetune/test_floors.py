"""Each metric's floor is what a model that learned nothing scores, computed from the evaluation labels alone (a
diverged trial has no working model), with per-example entries a bootstrap can count."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from raybiphase.finetune import scoring
from raybiphase.finetune.baselines import FLOORS, floor_of, floor_scores
from raybiphase.finetune.tasks import TASKS, TaskSplits, get_task, load_splits


def _question(qid: str, answers: list[str]) -> dict:
    return {"id": qid, "question": "q?", "context": "a b c",
            "answers": {"text": answers, "answer_start": [0] * len(answers)}}


def test_squad_v2s_floor_is_answering_no_answer_everywhere_not_zero():
    """Half the questions unanswerable: saying "no answer" to all scores 50, which a diverged trial gets."""
    test = [_question("a", ["x"]), _question("b", []), _question("c", ["y", "z"]), _question("d", [])]
    floor = floor_of(get_task("squad_v2"), TaskSplits(train=[], val=test[:2], test=test))
    assert floor["test_per_example"] == [0.0, 1.0, 0.0, 1.0]
    assert floor["test_score"] == floor["test_secondary"] == 0.5 and floor["val_score"] == 0.5
    squad = floor_of(get_task("squad"), TaskSplits(train=[], val=test[:1], test=test[:1]))  # v1: every one answered
    assert squad["test_score"] == 0.0 and squad["test_per_example"] == [0.0]


def test_entity_f1s_floor_predicts_no_entity_and_keeps_the_gold_counts():
    test = [{"words": ["a", "b"], "tags": ["B-ANS", "I-ANS"]}, {"words": ["c"], "tags": ["O"]}]
    floor = floor_of(get_task("squad_bio"), TaskSplits(train=[], val=test, test=test))
    assert floor["test_per_example"] == [[0, 0, 1], [0, 0, 0]] and floor["test_score"] == 0.0
    assert math.isnan(floor["test_secondary"])


def test_accuracys_floor_is_the_training_majority_on_the_evaluation_split():
    train = [{"label": 1}, {"label": 1}, {"label": 0}]
    test = [{"label": 1}, {"label": 0}, {"label": 0}, {"label": 0}]
    floor = floor_of(get_task("tweets"), TaskSplits(train=train, val=test[:1], test=test))
    assert floor["test_per_example"] == [1.0, 0.0, 0.0, 0.0] and floor["val_score"] == 1.0


def _rankings(n_passages: int, n_found: int):
    """Every placement of the relevant passages r0.. among the others: a uniformly random ranking is uniform over
    these (each stands for the same number of orders of the irrelevant passages)."""
    for spots in itertools.permutations(range(n_passages), n_found):
        ranking = [f"x{i}" for i in range(n_passages)]
        for j, spot in enumerate(spots):
            ranking[spot] = f"r{j}"
        yield ranking


@pytest.mark.parametrize("n_passages, n_found, n_relevant, k", [(6, 2, 2, 3), (5, 1, 1, 10), (12, 3, 4, 10),
                                                              (4, 0, 1, 10)])
@pytest.mark.parametrize("graded", [False, True])
def test_a_random_rankings_expected_ndcg_and_mrr_equal_the_mean_over_every_ranking(n_passages, n_found,
                                                                                   n_relevant, k, graded):
    ids = [f"r{j}" for j in range(n_found)] + [f"unjudged-{j}" for j in range(n_relevant - n_found)]
    relevant = {pid: 1 + (i * 2) % 3 for i, pid in enumerate(ids)} if graded else set(ids)  # grades 1, 3, 2, 1...
    rankings = list(_rankings(n_passages, n_found))
    ndcg = np.mean([scoring.ndcg_at_k(r, relevant, k) for r in rankings])
    mrr = np.mean([scoring.mrr_at_k(r, relevant, k) for r in rankings])
    corpus = set(rankings[0])
    assert scoring.random_ranking_scores(corpus, relevant, k) == pytest.approx((ndcg, mrr), abs=1e-12)


@pytest.mark.parametrize("task", ["tweets", "squad_commas", "squad", "wiki_retrieval"])  # one per family
def test_a_real_tasks_floor_has_an_entry_per_test_example(task, offline_cache):
    floor = floor_scores(task, max_examples=24)
    test = load_splits(get_task(task), max_examples=24).test
    assert len(floor["test_per_example"]) == len(test["queries"] if isinstance(test, dict) else test) > 0
    assert scoring.corpus_score(get_task(task).metric, floor["test_per_example"]) == pytest.approx(floor["test_score"])
    assert 0.0 <= floor["test_score"] < 1.0


def test_every_tasks_metric_states_its_floor():
    assert {task.metric for task in TASKS.values()} <= set(FLOORS)
