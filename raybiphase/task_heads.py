"""What each task family puts on top of the encoder: the stock transformers model, inputs, loss and evaluation.

    head = head_for(task, tokenizer, max_len=128)
    model = head.load_model(hf_dir)                  # EuroBertFor{Sequence,Token}Classification or EuroBertModel
    units = head.train_units(splits.train)           # tokenized training units
    loss = head.loss(model, units[:32])
    result = head.evaluate(model, head.prepare_eval(splits.val))   # Evaluation(score, per_example, secondary)

SC and TC live here, QA and IR in `raybiphase.qa_ir_heads`.

Inputs are built from token ids, so any tokenizer works the same way: `<bos> A <eos>` or `<bos> A <eos> B <eos>`
(bos/eos used when the tokenizer has them), at most `max_len` tokens.
* SC: `EuroBertForSequenceClassification` with `classifier_pooling="mean"` (the paper; EuroBERT's default is "late").
* TC: `EuroBertForTokenClassification`; a word's tag is predicted at its first token; words cut off by `max_len`
  are predicted "O" (they still count in the gold entities).
* QA: `EuroBertForTokenClassification` with 2 labels, start and end (the paper): `<bos> question <eos> window <eos>`
  over overlapping windows of the context (a third of a window overlaps the next), training on the windows that
  hold the answer (and, for unanswerable questions, on position 0); the prediction is the best valid span (at most
  MAX_ANSWER_TOKENS) over all windows, mapped back to the context's characters.
* IR: `EuroBertModel`, mean pooling over real tokens, "Query: " / "Document: " prefixes, cosine similarity at
  temperature IR_TEMPERATURE, in-batch negatives (a batch passage equal to the query's own positive is masked).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from raybiphase import scoring
from raybiphase.tasks import Task

QUERY_PREFIX, DOCUMENT_PREFIX = "Query: ", "Document: "
IR_TEMPERATURE = 0.05
MAX_QUESTION_TOKENS = 64
MAX_ANSWER_TOKENS = 30
N_BEST = 20
EVAL_BATCH = 64
IGNORE = -100


@dataclass(frozen=True)
class Evaluation:
    score: float
    per_example: list
    secondary: float = float("nan")


@contextlib.contextmanager
def _quiet_transformers():
    """from_pretrained warns that the task head is newly initialised (expected here) and draws a progress bar."""
    from transformers.utils import logging

    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def pad(sequences: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(s) for s in sequences)
    return torch.tensor([s + [value] * (width - len(s)) for s in sequences], dtype=torch.long)


class Head:
    def __init__(self, task: Task, tokenizer, max_len: int):
        self.task, self.tokenizer, self.max_len = task, tokenizer, max_len
        self.open = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        self.close = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = pad_id if pad_id is not None else 0

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def wrap(self, first: list[int], second: list[int] | None = None) -> list[int]:
        """`<bos> first <eos> [second <eos>]`, the longer part trimmed first to fit max_len."""
        budget = self.max_len - len(self.open) - len(self.close) * (1 if second is None else 2)
        if second is None:
            return self.open + first[:budget] + self.close
        first, second = list(first), list(second)
        while len(first) + len(second) > budget:
            (first if len(first) >= len(second) else second).pop()
        return self.open + first + self.close + second + self.close

    def batch(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = pad(sequences, self.pad_id)
        mask = pad([[1] * len(s) for s in sequences], 0)
        return ids, mask

    def forward_logits(self, model, sequences: list[list[int]]) -> torch.Tensor:
        ids, mask = self.batch(sequences)
        return model(input_ids=ids, attention_mask=mask).logits

    def _model(self, cls, hf_dir: str, **kwargs):
        with _quiet_transformers():
            return cls.from_pretrained(hf_dir, dtype=torch.float32, **kwargs)

    def prepare_eval(self, split):
        return split


# ------------------------------------------------------------------------------------------------ SC


class SequenceClassificationHead(Head):
    def load_model(self, hf_dir: str):
        from transformers import EuroBertForSequenceClassification

        return self._model(EuroBertForSequenceClassification, hf_dir, num_labels=self.task.num_labels,
                           classifier_pooling="mean")

    def train_units(self, records: list[dict]) -> list:
        return [(self.wrap(self.ids(r["text"]), self.ids(r["text_pair"]) if r["text_pair"] else None), r["label"])
                for r in records]

    def loss(self, model, units: list) -> torch.Tensor:
        logits = self.forward_logits(model, [u[0] for u in units])
        return F.cross_entropy(logits, torch.tensor([u[1] for u in units]))

    def prepare_eval(self, split):
        return self.train_units(split)

    @torch.no_grad()
    def evaluate(self, model, units: list) -> Evaluation:
        predictions = []
        for i in range(0, len(units), EVAL_BATCH):
            predictions += self.forward_logits(model, [u[0] for u in units[i:i + EVAL_BATCH]]).argmax(-1).tolist()
        per_example = scoring.accuracy_per_example(predictions, [u[1] for u in units])
        return Evaluation(float(np.mean(per_example)), per_example)


# ------------------------------------------------------------------------------------------------ TC


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
            units.append((ids, [index[record["tags"][w]] if w >= 0 else IGNORE for w in starts]))
        return units

    def loss(self, model, units: list) -> torch.Tensor:
        logits = self.forward_logits(model, [u[0] for u in units])
        labels = pad([u[1] for u in units], IGNORE)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)

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


# ------------------------------------------------------------------------------------------------ heads by family


def head_for(task: Task, tokenizer, max_len: int) -> Head:
    from raybiphase.qa_ir_heads import QuestionAnsweringHead, RetrievalHead

    heads = {"SC": SequenceClassificationHead, "TC": TokenClassificationHead,
             "QA": QuestionAnsweringHead, "IR": RetrievalHead}
    return heads[task.family](task, tokenizer, max_len)
