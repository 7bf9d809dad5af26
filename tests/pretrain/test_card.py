"""The model card's header is huggingface_hub's own: its model-index reads back through `ModelCard` as one
`EvalResult` per fine-tuning score (task, dataset, split, metric, value), and a card without scores has none. No
torch, no Ray."""

from __future__ import annotations

import math

from huggingface_hub import ModelCard

from raybiphase.checkpoint_meta import CheckpointMeta
from raybiphase.config import RunConfig, from_dict, to_dict
from raybiphase.pretrain.card import HUB_DATASETS, model_card

RUN = from_dict(RunConfig, {"model": {"size": "tiny"}, "phases": {"steps": 6, "clm_share": 0.5},
                            "optim": {"warmup_steps": 1, "decay_steps": 1}})
META = CheckpointMeta(run=to_dict(RUN), step=6, data_start=0, metrics={"step": 6, "val/mlm_loss": 5.25})
SUMMARY = [
    {"run": "r", "pretrain_step": 6, "task": "tweets", "family": "SC", "dataset": "3-class sentiment (tweets)",
     "metric": "accuracy", "test_mean": 0.5123, "test_ci95": 0.0211, "best_lr": 1e-4, "n_seeds": 3},
    {"run": "r", "pretrain_step": 6, "task": "squad_retrieval", "family": "IR",
     "dataset": "SQuAD question -> paragraph", "metric": "ndcg@10", "test_mean": 0.4, "test_ci95": math.nan, "best_lr": 3e-5, "n_seeds": 1},
    {"run": "r", "pretrain_step": 6, "task": "squad", "family": "QA", "dataset": "SQuAD v1.1", "metric": "f1",
     "test_mean": math.nan, "test_ci95": math.nan, "best_lr": math.nan, "n_seeds": 0},  # every seed stopped
]


def test_the_cards_model_index_reads_back_as_one_eval_result_per_score(tmp_path):
    (tmp_path / "README.md").write_text(model_card(META, name="tiny-r", scores=SUMMARY))
    card = ModelCard.load(tmp_path / "README.md")  # a local file: what the Hub parses when the folder is pushed
    assert card.data.model_name == "tiny-r" and card.data.library_name == "transformers"
    found = [(r.task_type, r.task_name, r.dataset_type, r.dataset_config, r.dataset_name, r.dataset_split,
              r.metric_type, r.metric_value, r.metric_args) for r in card.data.eval_results]
    assert found == [
        ("information-retrieval", "squad_retrieval", "rajpurkar/squad", None, "SQuAD question -> paragraph",
         "validation", "ndcg@10", 0.4, {"best_lr": 3e-5, "n_seeds": 1}),  # one seed: no interval
        ("text-classification", "tweets", "tweets", None, "3-class sentiment (tweets)", "test", "accuracy", 0.5123,
         {"best_lr": 1e-4, "n_seeds": 3, "ci95": 0.0211}),  # packaged files: its own held-out test share
    ]  # squad has no test score: not in the index; the table shows its row with an empty score
    assert "| tweets | SC | accuracy | 51.23 ± 2.11 | 0.0001 | 3 |" in card.text
    assert "| squad | QA | f1 |  |" in card.text


def test_a_card_without_scores_has_no_model_index_and_keeps_its_tags():
    card = ModelCard(model_card(META, name="tiny-r"))
    assert card.data.eval_results is None and "model-index" not in card.content
    assert card.data.tags == ["raybiphase", "eurobert", "encoder", "clm", "mlm"]
    assert card.data.pipeline_tag == "fill-mask" and "# tiny-r" in card.text


def test_a_hub_tasks_entry_names_its_hub_dataset_config_and_the_official_split_it_tested_on(tmp_path):
    rows = [{"run": "r", "pretrain_step": 6, "task": task, "family": family, "dataset": task, "metric": "m",
             "test_mean": 0.5, "test_ci95": 0.01, "best_lr": 1e-4, "n_seeds": 3}
            for task, family in (("mnli", "SC"), ("ontonotes", "TC"), ("msmarco", "IR"))]
    (tmp_path / "README.md").write_text(model_card(META, name="tiny-r", scores=rows))
    found = {r.task_name: (r.dataset_type, r.dataset_config, r.dataset_split)
             for r in ModelCard.load(tmp_path / "README.md").data.eval_results}
    assert found == {"mnli": ("nyu-mll/glue", "mnli", "validation_matched"),  # the paper's test: official validation
                     "ontonotes": ("ontonotes/conll2012_ontonotesv5", "english_v12", "validation"),
                     "msmarco": ("mteb/msmarco", "default", "test")}  # retrieval: TREC-DL 2019's qrels


def test_every_hub_dataset_the_card_names_is_one_the_loaders_read():
    from raybiphase.finetune import hub
    from raybiphase.finetune.tasks import TASKS

    loaded = {hub.GLUE, hub.CONLL2003, hub.ONTONOTES, hub.UNER, hub.SUPER_GLUE, hub.MSMARCO, hub.NQ, hub.MLDR,
              "rajpurkar/squad", "rajpurkar/squad_v2"}
    assert {dataset for dataset, _, _ in HUB_DATASETS.values()} == loaded
    production = {name for name, task in TASKS.items() if task.production}
    assert production <= set(HUB_DATASETS) and set(HUB_DATASETS) <= set(TASKS)


def test_the_card_header_has_license_datasets_language_and_a_hub_base_model():
    card = ModelCard(model_card(META, name="tiny-r"))
    assert (card.data.license, card.data.datasets, card.data.language) == ("apache-2.0", ["rajpurkar/squad"], ["en"])
    assert card.data.base_model is None  # random initial weights
    continued = from_dict(RunConfig, {**to_dict(RUN), "model": {"size": "tiny", "init_from": "EuroBERT/EuroBERT-210m"},
                                      "data": {"source": "HuggingFaceFW/fineweb-edu"}})
    card = ModelCard(model_card(CheckpointMeta(run=to_dict(continued), step=6, data_start=0, metrics={}),
                                name="tiny-c"))
    assert (card.data.base_model, card.data.datasets) == ("EuroBERT/EuroBERT-210m", ["HuggingFaceFW/fineweb-edu"])
    assert card.data.language is None  # a corpus of the user's: its language is not known here
    local = from_dict(RunConfig, {**to_dict(RUN), "model": {"size": "tiny", "init_from": "/ckpt/step-00000008"},
                                  "data": {"source": "/data/corpus.jsonl"}})
    card = ModelCard(model_card(CheckpointMeta(run=to_dict(local), step=6, data_start=0, metrics={}), name="l"))
    assert card.data.base_model is None and card.data.datasets is None
