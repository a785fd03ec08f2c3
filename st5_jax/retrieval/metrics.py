"""Retrieval metrics on a run, as trec_eval computes them (NumPy only for `run_from_topk`).

A run maps each query id to {doc id: score}; qrels map each query id to {doc id: relevance}.
A document is relevant when its relevance is > 0 (trec_eval's default level 1 on integer
grades); an unjudged document is not relevant. Each query's run is ranked here, the
trec_eval way: score descending, ties broken by doc id descending (code-point order, the
same as trec_eval's strcmp on UTF-8), so any run dict scores as trec_eval scores it
(whatever order its dict has).

Which queries: those of the qrels with at least one relevant document (as BEIR, MTEB and
sentence-transformers' InformationRetrievalEvaluator keep them). A query missing from the
run scores 0 on every metric and counts in the mean (trec_eval -c, and ir-measures 0.4.3,
which fills such queries with 0; pytrec_eval alone reports only the queries in the run, so
a mean over its output is higher). Queries of the run absent from the qrels are ignored.

Metric names are `MEASURE@k`, case-insensitive, k >= 1; results are keyed by the canonical
name below. R is the number of relevant documents of the query, rel(d) its relevance.

  MRR@k        1 / rank of the first relevant document in the top k, else 0. trec_eval's
               recip_rank on the run cut at k; ir-measures RR@k (alias RR@k).
  nDCG@k       DCG@k / ideal DCG@k, DCG = sum over the top k of gain / log2(rank + 1) with
               gain = rel(d) (graded; <= 0 gives 0), ideal DCG from the qrels' relevance
               levels sorted descending, cut at k. trec_eval ndcg_cut.k (BEIR's nDCG@k).
  Recall@k     relevant documents in the top k / R. trec_eval recall_k (alias R@k).
  Precision@k  relevant documents in the top k / k (k even when fewer are retrieved).
               trec_eval P_k (alias P@k).
  MAP@k        sum over relevant documents ranked within k of the precision at their rank,
               divided by R. trec_eval map_cut.k (BEIR's MAP@k; alias AP@k).
  Accuracy@k   1 if any relevant document is in the top k, else 0: DPR/NQ's top-k accuracy;
               trec_eval success_k, ir-measures Success@k (alias Success@k).

Where sentence-transformers' InformationRetrievalEvaluator (6.2.0) differs:
  - MAP@k divides by min(k, R), not R: its figure is higher for every query with R > k
    (equal when R <= k).
  - Relevance is binary (a set of relevant ids per query): its nDCG@k equals ours on binary
    qrels only.
  - Ties: score descending, then corpus id *ascending*. On runs without tied scores every
    figure above except MAP@k with R > k is the same as here.
ir-measures' own RR@k (its MS MARCO provider) also breaks ties by ascending doc id; its
trec_eval-backed measures (nDCG, R, P, AP, Success, RR without a cutoff) rank as here.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

Run = Mapping[str, Mapping[str, float]]  # query id -> {doc id: score}
Qrels = Mapping[str, Mapping[str, int]]  # query id -> {doc id: relevance}; relevance <= 0: not relevant

DEFAULT_METRICS = ("MRR@10", "nDCG@10", "Recall@1", "Recall@5", "Recall@10", "Recall@100", "MAP@100",
                   "Accuracy@1", "Accuracy@5", "Accuracy@20", "Accuracy@100")

# Accepted spellings (lower case) -> canonical measure name; ir-measures' names are aliases.
_MEASURES = {"mrr": "MRR", "rr": "MRR", "ndcg": "nDCG", "recall": "Recall", "r": "Recall", "precision": "Precision",
             "p": "Precision", "map": "MAP", "ap": "MAP", "accuracy": "Accuracy", "success": "Accuracy"}
_CANONICAL = ("MRR", "nDCG", "Recall", "Precision", "MAP", "Accuracy")


@dataclasses.dataclass(frozen=True)
class Metric:
  measure: str  # one of _CANONICAL
  k: int

  @property
  def name(self) -> str:
    return f"{self.measure}@{self.k}"


def parse_metric(name: str) -> Metric:
  """"nDCG@10" -> Metric("nDCG", 10); an unknown name or a bad cutoff is one ValueError."""
  measure, at, k_text = str(name).strip().partition("@")
  canonical = _MEASURES.get(measure.lower())
  k = int(k_text) if k_text.isdigit() else 0
  if canonical is None or not at or k < 1:
    raise ValueError(f"unknown retrieval metric {name!r}: use MEASURE@k with MEASURE one of {', '.join(_CANONICAL)} "
                     f"and k >= 1 (e.g. nDCG@10)")
  return Metric(canonical, k)


def parse_metrics(names: Iterable[str]) -> list[Metric]:
  """Parsed and de-duplicated, in the given order."""
  if isinstance(names, str):
    names = [names]
  out = list(dict.fromkeys(parse_metric(n) for n in names))
  if not out:
    raise ValueError("no retrieval metric given: name at least one, e.g. nDCG@10")
  return out


def ranked(scores: Mapping[str, float], depth: int | None = None) -> list[str]:
  """Doc ids in trec_eval order (score descending, then doc id descending), the first `depth` of them."""
  bad = next((d for d, s in scores.items() if math.isnan(s)), None)
  if bad is not None:  # NaN would make the order depend on the dict's order
    raise ValueError(f"the run scores document {bad!r} NaN: every score must be a number")
  if depth is not None and depth < len(scores):
    return [d for d, _ in heapq.nlargest(depth, scores.items(), key=_trec_eval_key)]
  return [d for d, _ in sorted(scores.items(), key=_trec_eval_key, reverse=True)]


def _trec_eval_key(item: tuple[str, float]) -> tuple[float, str]:
  doc_id, score = item
  return score, doc_id


def _score_query(ranking: Sequence[str], relevance: Mapping[str, int], metrics: Sequence[Metric]) -> dict[str, float]:
  """Every metric of one query whose qrels hold at least one relevant document."""
  gains = [max(relevance.get(d, 0), 0) for d in ranking]
  n_relevant = sum(1 for r in relevance.values() if r > 0)
  ideal = sorted((r for r in relevance.values() if r > 0), reverse=True)
  first = next((i for i, g in enumerate(gains) if g > 0), None)  # 0-based rank of the first relevant doc
  # hits_upto[i]: relevant documents among the first i; precision_sum[i]: sum of precision at each relevant rank < i.
  hits_upto, precision_sum = [0], [0.0]
  for i, g in enumerate(gains):
    hits_upto.append(hits_upto[-1] + (g > 0))
    precision_sum.append(precision_sum[-1] + (hits_upto[-1] / (i + 1) if g > 0 else 0.0))
  out = {}
  for m in metrics:
    k = m.k
    cut = min(k, len(gains))
    if m.measure == "MRR":
      value = 1.0 / (first + 1) if first is not None and first < k else 0.0
    elif m.measure == "Accuracy":
      value = 1.0 if first is not None and first < k else 0.0
    elif m.measure == "Recall":
      value = hits_upto[cut] / n_relevant
    elif m.measure == "Precision":
      value = hits_upto[cut] / k
    elif m.measure == "MAP":
      value = precision_sum[cut] / n_relevant
    else:  # nDCG
      dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]) if g > 0)
      ideal_dcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal[:k]))
      value = dcg / ideal_dcg
    out[m.name] = value
  return out


def evaluate(run: Run, qrels: Qrels, metrics: Iterable[str] = DEFAULT_METRICS) -> dict:
  """{"mean": {metric: float}, "per_query": {qid: {metric: float}}, "n_queries": int, "n_missing_from_run": int}.

  Over the queries of `qrels` with at least one relevant document; a query missing from the
  run scores 0 (see the module doc for each metric's definition).
  """
  parsed = parse_metrics(metrics)
  depth = max(m.k for m in parsed)
  per_query: dict[str, dict[str, float]] = {}
  missing = 0
  for qid, relevance in qrels.items():
    if not any(r > 0 for r in relevance.values()):
      continue
    scores = run.get(qid)
    missing += scores is None
    per_query[qid] = _score_query(ranked(scores or {}, depth), relevance, parsed)
  if not per_query:
    raise ValueError("no query of the qrels has a relevant document (relevance > 0): nothing to evaluate; "
                     "check the qrels file and its split")
  n = len(per_query)
  mean = {m.name: math.fsum(q[m.name] for q in per_query.values()) / n for m in parsed}
  return {"mean": mean, "per_query": per_query, "n_queries": n, "n_missing_from_run": missing}


def run_from_topk(query_ids: Sequence[str], doc_ids: Sequence[str], scores_QxK,
                  indices_QxK) -> dict[str, dict[str, float]]:
  """A run from a search's top-k arrays: row q holds indices into `doc_ids` and their scores.

  Negative indices (faiss' -1 for "fewer than k found") are left out.
  """
  scores_QxK, indices_QxK = np.asarray(scores_QxK), np.asarray(indices_QxK)
  if scores_QxK.ndim != 2 or scores_QxK.shape != indices_QxK.shape or scores_QxK.shape[0] != len(query_ids):
    raise ValueError(f"run_from_topk: scores {scores_QxK.shape} and indices {indices_QxK.shape} must both be "
                     f"(queries={len(query_ids)}, k)")
  if indices_QxK.size and not np.issubdtype(indices_QxK.dtype, np.integer):
    raise ValueError(f"run_from_topk: indices must be integers, got {indices_QxK.dtype}")
  if indices_QxK.size and int(indices_QxK.max()) >= len(doc_ids):
    raise ValueError(f"run_from_topk: index {int(indices_QxK.max())} is out of range for {len(doc_ids)} documents")
  run: dict[str, dict[str, float]] = {}
  for qid, score_row, index_row in zip(query_ids, scores_QxK.tolist(), indices_QxK.tolist()):
    if qid in run:
      raise ValueError(f"run_from_topk: query id {qid!r} appears twice; query ids must be unique")
    hits = {doc_ids[i]: s for i, s in zip(index_row, score_row) if i >= 0}
    if len(hits) != sum(1 for i in index_row if i >= 0):
      raise ValueError(f"run_from_topk: query {qid!r} lists a document twice; a top-k row must not repeat one")
    run[qid] = hits
  return run
