"""TC: `EuroBertForTokenClassification` (another encoder: the same linear layer on its states); entity F1 over words.

Two labellings (`finetune.tc_labels`):

* "all_subtokens" (the default, as the authors' evaluation code does): every token of a word is trained on the
  word's tag, and a word's prediction is a majority vote over its tokens' predicted tags; a tie goes to the tied
  tag with the highest summed probability over the word's tokens (then the lowest tag index).
* "first_subtoken": only a word's first token is trained, and the word's tag is predicted there.

Words cut off by `max_len` are predicted "O" (they still count in the gold entities).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

import numpy as np
import torch
import torch.nn.functional as F

from raybiphase.config.sweep import TcLabels
from raybiphase.data.masking import IGNORE_INDEX
from raybiphase.finetune import scoring
from raybiphase.finetune.heads.base import EVAL_BATCH, Evaluation, Head, pad
from raybiphase.finetune.tasks import Task


def first_tokens(token_words: Sequence[int]) -> list[int]:
    """`token_words` with every token but a word's first set to -1."""
    seen: set[int] = set()
    out = []
    for word in token_words:
        out.append(word if word >= 0 and word not in seen else -1)
        seen.add(word)
    return out


def word_predictions(probabilities: np.ndarray, token_words: Sequence[int], n_words: int) -> list[int | None]:
    """Per word, the tag its tokens vote for: the most frequent argmax over the word's tokens, a tie going to the
    tied tag with the highest summed probability over those tokens (then the lowest index); None for a word with
    no token. `probabilities`: (tokens, tags); `token_words`: per token, its word's index or -1."""
    positions: list[list[int]] = [[] for _ in range(n_words)]
    for position, word in enumerate(token_words):
        if word >= 0:
            positions[word].append(position)
    best = probabilities.argmax(-1)
    out: list[int | None] = []
    for rows in positions:
        if not rows:
            out.append(None)
            continue
        votes = np.bincount(best[rows], minlength=probabilities.shape[-1])
        tied = np.flatnonzero(votes == votes.max())
        out.append(int(tied[np.argmax(probabilities[rows][:, tied].sum(0))]))
    return out


class TokenClassificationHead(Head):
    def __init__(self, task: Task, tokenizer, max_len: int, *, labels: TcLabels = "all_subtokens",
                 trust_remote_code: bool = False):
        super().__init__(task, tokenizer, max_len, trust_remote_code=trust_remote_code)
        if labels not in get_args(TcLabels):
            raise ValueError(f"finetune.tc_labels: {labels!r} is not allowed; allowed: {', '.join(get_args(TcLabels))}")
        self.labels = labels

    def load_model(self, hf_dir: str):
        return self._model("token", hf_dir, self.task.num_labels)

    def _encode(self, record: dict) -> tuple[list[int], list[int]]:
        """Ids and, per token, the index of the word it belongs to (-1 for special tokens and bare spaces); with
        "first_subtoken", only a word's first token keeps its index."""
        text, char_word = "", []
        for w, word in enumerate(record["words"]):
            if w:
                text, char_word = text + " ", char_word + [-1]
            text, char_word = text + word, char_word + [w] * len(word)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = encoded["input_ids"]
        # a token's last character lies inside its word (a byte-level BPE token carries the space before it)
        words = [char_word[end - 1] if end > begin else -1 for begin, end in encoded["offset_mapping"]]
        if self.labels == "first_subtoken":
            words = first_tokens(words)
        keep = self.max_len - len(self.open) - len(self.close)
        return (self.open + ids[:keep] + self.close,
                [-1] * len(self.open) + words[:keep] + [-1] * len(self.close))

    def train_units(self, records: list[dict]) -> list:
        index = {tag: i for i, tag in enumerate(self.task.label_names)}
        units = []
        for record in records:
            ids, words = self._encode(record)
            units.append((ids, [index[record["tags"][w]] if w >= 0 else IGNORE_INDEX for w in words]))
        return units

    def loss(self, model, units: list) -> torch.Tensor:
        logits = self.forward_logits(model, [u[0] for u in units])
        labels = pad([u[1] for u in units], IGNORE_INDEX, logits.shape[1]).to(self.device)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)

    def prepare_eval(self, split):
        return [(record, *self._encode(record)) for record in split]

    @torch.no_grad()
    def evaluate(self, model, prepared: list) -> Evaluation:
        counts = []
        for i in range(0, len(prepared), EVAL_BATCH):
            chunk = prepared[i:i + EVAL_BATCH]
            probabilities = self.forward_logits(model, [c[1] for c in chunk]).float().softmax(-1).cpu().numpy()
            for (record, ids, words), row in zip(chunk, probabilities):
                # one token per word under "first_subtoken": the vote is that token's prediction
                tags = word_predictions(row[:len(ids)], words, len(record["words"]))
                predicted = ["O" if t is None else self.task.label_names[t] for t in tags]
                counts.append(scoring.entity_counts(predicted, record["tags"]))
        return Evaluation(scoring.entity_f1(counts), counts)
