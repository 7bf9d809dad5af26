"""TC: `EuroBertForTokenClassification`; a word's tag is predicted at its first token; words cut off by `max_len`
are predicted "O" (they still count in the gold entities); entity F1."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raybiphase.data.masking import IGNORE_INDEX
from raybiphase.finetune import scoring
from raybiphase.finetune.heads.base import EVAL_BATCH, Evaluation, Head, pad


class TokenClassificationHead(Head):
    def load_model(self, hf_dir: str):
        from transformers import EuroBertForTokenClassification

        return self._model(EuroBertForTokenClassification, hf_dir, num_labels=self.task.num_labels)

    def _encode(self, record: dict) -> tuple[list[int], list[int]]:
        """Ids and, per token, the index of the word it starts (-1 for other tokens)."""
        text, char_word = "", []
        for w, word in enumerate(record["words"]):
            if w:
                text, char_word = text + " ", char_word + [-1]
            text, char_word = text + word, char_word + [w] * len(word)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, starts, seen = encoded["input_ids"], [], set()
        for begin, end in encoded["offset_mapping"]:
            word = char_word[end - 1] if end > begin else -1  # a token's last character lies inside its word
            starts.append(word if word >= 0 and word not in seen else -1)
            seen.add(word)
        keep = self.max_len - len(self.open) - len(self.close)
        pad_word = [-1] * len(self.open)
        return self.open + ids[:keep] + self.close, pad_word + starts[:keep] + [-1] * len(self.close)

    def train_units(self, records: list[dict]) -> list:
        index = {tag: i for i, tag in enumerate(self.task.label_names)}
        units = []
        for record in records:
            ids, starts = self._encode(record)
            units.append((ids, [index[record["tags"][w]] if w >= 0 else IGNORE_INDEX for w in starts]))
        return units

    def loss(self, model, units: list) -> torch.Tensor:
        logits = self.forward_logits(model, [u[0] for u in units])
        labels = pad([u[1] for u in units], IGNORE_INDEX).to(self.device)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)

    def prepare_eval(self, split):
        return [(record, *self._encode(record)) for record in split]

    @torch.no_grad()
    def evaluate(self, model, prepared: list) -> Evaluation:
        counts = []
        for i in range(0, len(prepared), EVAL_BATCH):
            chunk = prepared[i:i + EVAL_BATCH]
            best = self.forward_logits(model, [c[1] for c in chunk]).argmax(-1).tolist()
            for (record, _, starts), row in zip(chunk, best):
                predicted = ["O"] * len(record["words"])
                for position, word in enumerate(starts):
                    if word >= 0:
                        predicted[word] = self.task.label_names[row[position]]
                counts.append(scoring.entity_counts(predicted, record["tags"]))
        return Evaluation(scoring.entity_f1(counts), counts)
