"""Scoring a retrieval set: queries and corpus encoded by side, exact search, trec_eval's measures.

Queries are encoded with the query side's encoder and the corpus with the document side's
(the harness' `Sides`: different max lengths, and later prompts or towers), every query is
ranked against the whole corpus by exact dot product (st5_jax.retrieval.search.exact_search;
embeddings are L2-normalised, so this is cosine), the top `k` documents make the run, and
st5_jax.retrieval.metrics scores it as trec_eval would. `main` is MRR@10; every measure of
metrics.DEFAULT_METRICS is reported (fractions in [0, 1]).

`bm25_task` scores the same set with BM25 (st5_jax.retrieval.bm25), the baseline every
retrieval table carries.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from st5_jax.retrieval import metrics as metrics_lib
from st5_jax.retrieval.beir import RetrievalData

MAIN = "MRR@10"
DEPTH = 100  # documents kept per query: enough for Recall@100 and MAP@100


def _result(data: RetrievalData, run: metrics_lib.Run, *, seconds: dict[str, float],
            extra_metrics: tuple[str, ...] = ()) -> dict[str, Any]:
  names = dict.fromkeys([*metrics_lib.DEFAULT_METRICS, *(metrics_lib.parse_metric(m).name for m in extra_metrics)])
  scores = metrics_lib.evaluate(run, data.qrels, names)
  return {"main": scores["mean"][MAIN], "metric": MAIN, **scores["mean"], "n_queries": scores["n_queries"],
          "n_documents": len(data.corpus), "seconds_by_part": {k: round(v, 3) for k, v in seconds.items()}}


def retrieval_task(data: RetrievalData, *, kfold: int = 10, k: int = DEPTH,
                   extra_metrics: tuple[str, ...] = ()) -> Callable[[Any], dict]:
  """run(embed) -> results; `embed` has `.query` and `.document` (the harness' Sides), or is one encoder.

  The results hold metrics_lib.DEFAULT_METRICS and `extra_metrics` (any spelling; keyed by canonical name).
  """
  del kfold  # no classifier

  def run(embed) -> dict[str, Any]:
    from st5_jax.retrieval.search import exact_search  # pylint: disable=g-import-not-at-top  (JAX)

    query_side = getattr(embed, "query", embed)
    document_side = getattr(embed, "document", embed)
    query_ids, doc_ids = list(data.queries), list(data.corpus)
    t0 = time.perf_counter()
    queries_QxD = np.asarray(query_side([data.queries[q] for q in query_ids]), np.float32)
    t1 = time.perf_counter()
    documents_NxD = np.asarray(document_side([data.corpus[d] for d in doc_ids]), np.float32)
    t2 = time.perf_counter()
    scores_QxK, indices_QxK = exact_search(queries_QxD, documents_NxD, min(k, len(doc_ids)))
    run_ = metrics_lib.run_from_topk(query_ids, doc_ids, scores_QxK, indices_QxK)
    return _result(data, run_, seconds={"encode_queries": t1 - t0, "encode_documents": t2 - t1,
                                        "search": time.perf_counter() - t2}, extra_metrics=extra_metrics)

  return run


def bm25_task(data: RetrievalData, *, k: int = DEPTH, **bm25_kwargs) -> dict[str, Any]:
  """The set scored by BM25 over its own corpus (st5_jax.retrieval.bm25 settings)."""
  from st5_jax.retrieval import bm25  # pylint: disable=g-import-not-at-top

  query_ids, doc_ids = list(data.queries), list(data.corpus)
  t0 = time.perf_counter()
  index = bm25.BM25([data.corpus[d] for d in doc_ids], **bm25_kwargs)
  t1 = time.perf_counter()
  scores_QxK, indices_QxK = index.search([data.queries[q] for q in query_ids], min(k, len(doc_ids)))
  run_ = metrics_lib.run_from_topk(query_ids, doc_ids, scores_QxK, indices_QxK)
  return _result(data, run_, seconds={"index": t1 - t0, "search": time.perf_counter() - t1})
