"""The model card's header is huggingface_hub's own: its model-index reads back through `ModelCard` as one
`EvalResult` per fine-tuning score (task, dataset, split, metric, value), and a card without scores has none. No
torch, no Ray."""

from __future__ import annotations

import math

from huggingface_hub import ModelCard

from raybiphase.checkpoint_meta import CheckpointMeta
from raybiphase.config import RunConfig, from_dict, to_dict
from raybiphase.pretrain.card import model_card

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
    found = [(r.task_type, r.task_name, r.dataset_type, r.dataset_name, r.dataset_split, r.metric_type,
              r.metric_value, r.metric_args) for r in card.data.eval_results]
    assert found == [
        ("information-retrieval", "squad_retrieval", "squad_retrieval", "SQuAD question -> paragraph", "test",
         "ndcg@10", 0.4, {"best_lr": 3e-5, "n_seeds": 1}),  # one seed: no interval
        ("text-classification", "tweets", "tweets", "3-class sentiment (tweets)", "test", "accuracy", 0.5123,
         {"best_lr": 1e-4, "n_seeds": 3, "ci95": 0.0211}),
    ]  # squad has no test score: not in the index; the table shows its row with an empty score
    assert "| tweets | SC | accuracy | 51.23 ± 2.11 | 0.0001 | 3 |" in card.text
    assert "| squad | QA | f1 |  |" in card.text


def test_a_card_without_scores_has_no_model_index_and_keeps_its_tags():
    card = ModelCard(model_card(META, name="tiny-r"))
    assert card.data.eval_results is None and "model-index" not in card.content
    assert card.data.tags == ["raybiphase", "eurobert", "encoder", "clm", "mlm"]
    assert card.data.pipeline_tag == "fill-mask" and "# tiny-r" in card.text
