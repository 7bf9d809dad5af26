"""IR: a bi-encoder; the embedding is the mean of the last hidden states over real tokens. Training: cosine
similarities / IR_TEMPERATURE between every query and every passage of the batch, cross-entropy towards its own
passage (in-batch negatives); a batch passage that is the query's own positive under another slot is masked so
it is never counted as a negative (SQuAD has several questions per paragraph).

Evaluation encodes the split's queries and its whole corpus (the passages its qrels judge, by default: see
raybiphase.finetune.tasks) and ranks the corpus by cosine similarity, in fp32: NDCG@10 (the paper's metric, binary
relevance unless finetune.ir_relevance is "graded") and MRR@10. The ranking is `top_k`: exact, in the order of the
full score matrix (score, then the lower passage index among equal scores, as `scoring.rank_by_scores` orders it),
yet it never holds that matrix: it walks blocks of QUERY_BLOCK queries x PASSAGE_CHUNK passages and keeps a running
top k, so its memory is O(QUERY_BLOCK x (PASSAGE_CHUNK + k)) beside the embeddings, whatever the corpus (MS MARCO's
8.8M passages against its 7k dev queries would be a 250 GB float32 matrix). A corpus of at most PASSAGE_CHUNK
passages and at most QUERY_BLOCK queries is scored by the same single matrix product as the full matrix, so its
scores are bitwise those of the full-matrix ranking (the quickstart's 800 queries over 4,000 passages are).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from raybiphase.finetune import scoring
from raybiphase.finetune.heads.base import EVAL_BATCH, Evaluation, Head
from raybiphase.finetune.tasks import relevance

QUERY_PREFIX, DOCUMENT_PREFIX = "Query: ", "Document: "
IR_TEMPERATURE = 0.05
PASSAGE_CHUNK = 16384
QUERY_BLOCK = 2048
"""A score block of QUERY_BLOCK x PASSAGE_CHUNK fp32 is 128 MiB; with torch.topk's work space and a tie's masks
(`_chunk_top_k`), the ranking's peak is a small multiple of it (benchmarks/bench_ir_rank.py measures it)."""


def _chunk_top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best (values, column indices) of each row, columns ascending, ties at the k-th value resolved to the
    lowest columns. torch.topk picks among equal values arbitrarily, which matters only in a row whose (k+1)-th
    best equals its k-th: those rows alone are chosen again, by a mask over their scores."""
    values, columns = scores.topk(min(k + 1, scores.shape[1]), dim=1)
    columns = columns[:, :k]
    if values.shape[1] > k:
        spilled = (values[:, k] == values[:, k - 1]).nonzero()[:, 0]
        if len(spilled):
            rows, kth = scores[spilled], values[spilled, k - 1:k]
            ties = rows == kth
            room = k - (rows > kth).sum(1, keepdim=True)  # how many of the k-th value's ties fit
            chosen = (rows > kth) | (ties & (ties.cumsum(1, dtype=torch.int32) <= room))
            columns = columns.index_put((spilled,), chosen.nonzero()[:, 1].view(len(spilled), k))
    columns = columns.sort(dim=1).values  # ascending: equal scores then keep the lower column first
    return scores.gather(1, columns), columns


def top_k(queries: torch.Tensor, passages: torch.Tensor, k: int = scoring.RANK_CUTOFF, *,
          chunk: int = PASSAGE_CHUNK, block: int = QUERY_BLOCK) -> torch.Tensor:
    """(queries, min(k, passages)) passage indices, best first: by the fp32 dot product, then the lower index
    among equal scores, exactly the first k of `scoring.rank_by_scores` over the full matrix of the same scores.
    Memory: one block x chunk of scores at a time, plus the running best (the module docstring)."""
    k = min(k, len(passages))
    if k == 0 or len(queries) == 0:
        return torch.zeros((len(queries), k), dtype=torch.long)
    out = []
    with torch.autocast(queries.device.type, enabled=False):
        for q in range(0, len(queries), block):
            query_block = queries[q:q + block].float()
            best_values = query_block.new_zeros((len(query_block), 0))
            best_indices = torch.zeros((len(query_block), 0), dtype=torch.long, device=queries.device)
            for p in range(0, len(passages), chunk):
                scores = query_block @ passages[p:p + chunk].float().T
                values, columns = _chunk_top_k(scores, min(k, scores.shape[1]))
                # the running best holds lower indices than this chunk, each part's ties in index order: a stable
                # sort by score keeps that order among equal scores, the order of the full matrix's ranking
                values = torch.cat([best_values, values], 1)
                indices = torch.cat([best_indices, columns + p], 1)
                values, order = values.sort(dim=1, descending=True, stable=True)
                best_values, best_indices = values[:, :k], indices.gather(1, order[:, :k])
            out.append(best_indices)
    return torch.cat(out)


class RetrievalHead(Head):
    def load_model(self, hf_dir: str):
        return self._model("encoder", hf_dir)

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

    def unit_length(self, unit) -> int:
        """A pair's passage: the longer of its two inputs, and the wider batch."""
        return len(unit[1])

    def loss(self, model, units: list) -> torch.Tensor:
        queries = self.embed(model, [u[0] for u in units])
        passages = self.embed(model, [u[1] for u in units])
        similarity = queries @ passages.T / IR_TEMPERATURE
        pids = [u[2] for u in units]
        same = self.tensor([[i != j and pids[i] == pids[j] for j in range(len(pids))] for i in range(len(pids))])
        similarity = similarity.masked_fill(same, float("-inf"))
        return F.cross_entropy(similarity, torch.arange(len(units), device=self.device))

    def prepare_eval(self, rset: dict):
        """Token ids of the queries and passages, and each query's relevance (`tasks.relevance`: its grades when it
        carries them, else its positives)."""
        return ([self.query(q["text"]) for q in rset["queries"]], [relevance(q) for q in rset["queries"]],
                [self.document(p["text"]) for p in rset["passages"]], [p["pid"] for p in rset["passages"]])

    @torch.no_grad()
    def _encode_all(self, model, sequences: list[list[int]]) -> torch.Tensor:
        return torch.cat([self.embed(model, sequences[i:i + EVAL_BATCH]) for i in range(0, len(sequences), EVAL_BATCH)])

    @torch.no_grad()
    def evaluate(self, model, prepared) -> Evaluation:
        queries, relevant, passages, pids = prepared
        ranked = top_k(self._encode_all(model, queries), self._encode_all(model, passages)).cpu().tolist()
        per_query = scoring.retrieval_scores([[pids[j] for j in row] for row in ranked], relevant)
        return Evaluation(float(np.mean(per_query["ndcg@10"])), per_query["ndcg@10"],
                          float(np.mean(per_query["mrr@10"])))
