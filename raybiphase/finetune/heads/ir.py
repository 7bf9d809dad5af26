"""IR: a bi-encoder; the embedding is the mean of the last hidden states over real tokens. Training: cosine
similarities / IR_TEMPERATURE between every query and every passage of the batch, cross-entropy towards its own
passage (in-batch negatives); a batch passage that is the query's own positive under another slot is masked so
it is never counted as a negative (SQuAD has several questions per paragraph). Evaluation ranks the whole
evaluation corpus by cosine similarity: NDCG@10 (the paper's metric) and MRR@10.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from raybiphase.finetune import scoring
from raybiphase.finetune.heads.base import EVAL_BATCH, Evaluation, Head

QUERY_PREFIX, DOCUMENT_PREFIX = "Query: ", "Document: "
IR_TEMPERATURE = 0.05


class RetrievalHead(Head):
    def load_model(self, hf_dir: str):
        from transformers import EuroBertModel

        return self._model(EuroBertModel, hf_dir)

    def query(self, text: str) -> list[int]:
        return self.wrap(self.ids(QUERY_PREFIX + text))

    def document(self, text: str) -> list[int]:
        return self.wrap(self.ids(DOCUMENT_PREFIX + text))

    def embed(self, model, sequences: list[list[int]]) -> torch.Tensor:
        ids, mask = self.batch(sequences)
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = (hidden.float() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return F.normalize(pooled, dim=-1)

    def train_units(self, records: list[dict]) -> list:
        return [(self.query(r["query"]), self.document(r["passage"]), r["pid"]) for r in records]

    def loss(self, model, units: list) -> torch.Tensor:
        queries = self.embed(model, [u[0] for u in units])
        passages = self.embed(model, [u[1] for u in units])
        similarity = queries @ passages.T / IR_TEMPERATURE
        pids = [u[2] for u in units]
        same = self.tensor([[i != j and pids[i] == pids[j] for j in range(len(pids))] for i in range(len(pids))])
        similarity = similarity.masked_fill(same, float("-inf"))
        return F.cross_entropy(similarity, torch.arange(len(units), device=self.device))

    def prepare_eval(self, rset: dict):
        return ([self.query(q["text"]) for q in rset["queries"]], [set(q["positives"]) for q in rset["queries"]],
                [self.document(p["text"]) for p in rset["passages"]], [p["pid"] for p in rset["passages"]])

    @torch.no_grad()
    def _encode_all(self, model, sequences: list[list[int]]) -> torch.Tensor:
        return torch.cat([self.embed(model, sequences[i:i + EVAL_BATCH]) for i in range(0, len(sequences), EVAL_BATCH)])

    @torch.no_grad()
    def evaluate(self, model, prepared) -> Evaluation:
        queries, relevant, passages, pids = prepared
        scores = (self._encode_all(model, queries) @ self._encode_all(model, passages).T).float().cpu().numpy()
        per_query = scoring.retrieval_scores(scoring.rank_by_scores(scores, pids), relevant)
        return Evaluation(float(np.mean(per_query["ndcg@10"])), per_query["ndcg@10"],
                          float(np.mean(per_query["mrr@10"])))
