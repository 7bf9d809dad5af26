"""QA (the paper: token classification with 2 labels): `<bos> question <eos> window <eos>` over overlapping windows
of the context (in the tokenizer's own pair layout: `[CLS] question [SEP] window [SEP]` for BERT, the window and its
closing token segment B where the model reads token_type_ids, as BERT's own pair encoding marks it); logits[..., 0]
score starts, logits[..., 1] ends. Training uses every window: one that holds the first gold answer whole points at
it, any other (and every window of an unanswerable SQuAD v2 question) points start and end at position 0, the
`<bos>` (or `[CLS]`) token, as transformers' run_qa example trains them; a tokenizer that writes no token there is
a `UserError` that says what to set. Prediction: the
N_BEST best starts and ends of each window's context tokens (position 0 is never a span), the best valid span
(start <= end, at most MAX_ANSWER_TOKENS) over all windows, mapped back to the context's characters; only for
SQuAD v2 does the empty answer win, when position 0 scores higher (its lowest score over the windows, as in the
transformers example). Scored with the official SQuAD EM/F1 (`raybiphase.finetune.scoring`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from raybiphase.errors import UserError
from raybiphase.finetune import scoring
from raybiphase.finetune.heads.base import EVAL_BATCH, Evaluation, Head

MAX_QUESTION_TOKENS = 64
MAX_ANSWER_TOKENS = 30
N_BEST = 20  # best starts and ends kept per window


class QuestionAnsweringHead(Head):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.open:
            raise UserError(f"finetune: QA points a window without the answer at its first token, but the tokenizer "
                            f"{self.tokenizer.name_or_path} writes no <bos> or [CLS] there; set its bos_token, save it "
                            f"beside the model and pass that folder")

    def load_model(self, hf_dir: str):
        return self._model("token", hf_dir, 2)

    def windows(self, record: dict) -> list[dict]:
        """Overlapping context windows of one question: ids, the position of the first context token, and the
        character offsets of the window's context tokens."""
        question = self.ids(record["question"])[:MAX_QUESTION_TOKENS]
        encoded = self.tokenizer(record["context"], add_special_tokens=False, return_offsets_mapping=True)
        context, offsets = encoded["input_ids"], encoded["offset_mapping"]
        budget = max(1, self.max_len - len(self.open) - len(self.middle) - len(self.close) - len(question))
        step = max(1, budget - budget // 3)
        first = len(self.open) + len(question) + len(self.middle)
        out = []
        for begin in range(0, max(1, len(context)), step):
            end = min(begin + budget, len(context))
            out.append({"ids": self.open + question + self.middle + context[begin:end] + self.close,
                        "first": first, "offsets": offsets[begin:end]})
            if end >= len(context):
                break
        return out

    def train_units(self, records: list[dict]) -> list:
        units = []
        for record in records:
            answers = record["answers"]
            for window in self.windows(record):
                target = (0, 0)  # no answer in this window (kept, as transformers' run_qa keeps them)
                if answers["text"]:
                    start_char = answers["answer_start"][0]
                    end_char = start_char + len(answers["text"][0])
                    offsets = window["offsets"]
                    if offsets and offsets[0][0] <= start_char and offsets[-1][1] >= end_char:
                        start = next(i for i, (_, e) in enumerate(offsets) if e > start_char)
                        end = max(i for i, (s, _) in enumerate(offsets) if s < end_char)
                        target = (window["first"] + start, window["first"] + max(start, end))
                units.append((window["ids"], target, window["first"]))
        return units

    def loss(self, model, units: list) -> torch.Tensor:
        inputs = self.inputs([u[0] for u in units], [u[2] for u in units])
        mask = inputs["attention_mask"]
        logits = model(**inputs).logits.masked_fill(~mask.bool()[..., None], -1e4)
        starts, ends = self.tensor([u[1][0] for u in units]), self.tensor([u[1][1] for u in units])
        return (F.cross_entropy(logits[..., 0], starts) + F.cross_entropy(logits[..., 1], ends)) / 2

    def prepare_eval(self, split):
        return [(record, self.windows(record)) for record in split]

    def _best_span(self, record: dict, windows: list[dict], logits: list[np.ndarray]) -> str:
        best_score, best_text, null_score = -np.inf, "", np.inf
        for window, scores in zip(windows, logits):
            null_score = min(null_score, scores[0, 0] + scores[0, 1])
            n_context = len(window["offsets"])
            starts = scores[window["first"]:window["first"] + n_context, 0]
            ends = scores[window["first"]:window["first"] + n_context, 1]
            for s in np.argsort(-starts, kind="stable")[:N_BEST]:
                for e in np.argsort(-ends, kind="stable")[:N_BEST]:
                    if s <= e < s + MAX_ANSWER_TOKENS and starts[s] + ends[e] > best_score:
                        best_score = starts[s] + ends[e]
                        best_text = record["context"][window["offsets"][s][0]:window["offsets"][e][1]].strip()
        if self.task.unanswerable and null_score > best_score:
            return ""
        return best_text

    @torch.no_grad()
    def evaluate(self, model, prepared: list) -> Evaluation:
        flat = [(q, w) for q, (_, windows) in enumerate(prepared) for w in windows]
        logits: list[list[np.ndarray]] = [[] for _ in prepared]
        for i in range(0, len(flat), EVAL_BATCH):
            chunk = flat[i:i + EVAL_BATCH]
            out = self.forward_logits(model, [w["ids"] for _, w in chunk],
                                      [w["first"] for _, w in chunk]).float().cpu().numpy()
            for row, (q, w) in zip(out, chunk):
                logits[q].append(row[: len(w["ids"])])
        f1, exact = [], []
        for (record, windows), scores in zip(prepared, logits):
            prediction = self._best_span(record, windows, scores)
            f1.append(scoring.squad_f1(prediction, record["answers"]["text"]))
            exact.append(scoring.squad_exact_match(prediction, record["answers"]["text"]))
        return Evaluation(float(np.mean(f1)), f1, float(np.mean(exact)))
