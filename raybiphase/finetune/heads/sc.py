"""SC: `EuroBertForSequenceClassification` with `classifier_pooling="mean"` (the paper; EuroBERT's default is
"late"), or any other encoder under the same mean-pooled head (`encoders.EncoderWithHead`); accuracy. An input is
one text, `<bos> text <eos>` (the model's own special tokens: `[CLS] text [SEP]` for BERT): a sentence pair is
written as one text in the task's template (`Task.input_text`: MNLI's "Premise: A", a line break, "Hypothesis: B"),
for every model, as the authors' evaluation code does."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from raybiphase.finetune import scoring
from raybiphase.finetune.heads.base import EVAL_BATCH, Evaluation, Head


class SequenceClassificationHead(Head):
    def load_model(self, hf_dir: str):
        return self._model("sequence", hf_dir, self.task.num_labels)

    def train_units(self, records: list[dict]) -> list:
        return [(self.wrap(self.ids(self.task.input_text(r))), r["label"]) for r in records]

    def loss(self, model, units: list) -> torch.Tensor:
        logits = self.forward_logits(model, [u[0] for u in units])
        return F.cross_entropy(logits, self.tensor([u[1] for u in units]))

    def prepare_eval(self, split):
        return self.train_units(split)

    @torch.no_grad()
    def evaluate(self, model, units: list) -> Evaluation:
        predictions = []
        for i in range(0, len(units), EVAL_BATCH):
            predictions += self.forward_logits(model, [u[0] for u in units[i:i + EVAL_BATCH]]).argmax(-1).tolist()
        per_example = scoring.accuracy_per_example(predictions, [u[1] for u in units])
        return Evaluation(float(np.mean(per_example)), per_example)
