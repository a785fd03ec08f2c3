"""BM25 over a corpus in memory: the baseline row of every retrieval table (and BM25 negatives).

Scoring is Lucene's BM25 as bm25s 0.3.16 implements it (`method="lucene"`):

  score(q, d) = sum over query terms t in d of  idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
  idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

(Lucene 8+ leaves out the constant (k1 + 1) factor of Robertson's form: the ranking is the same.)
with k1 = 1.5 and b = 0.75 by default (BEIR's Elasticsearch baseline uses Lucene's BM25 with
k1 1.2, b 0.75; bm25s' defaults are kept and stated). Tokens: lower-cased `\\w+` runs, no
stemming, no stop words -- the same tokens for documents and queries. A query term counts
once per occurrence in the query (as in rank_bm25 and bm25s). Ties: the lower corpus index first.
"""

from __future__ import annotations

import re
from typing import Sequence

import bm25s
import numpy as np

_TOKEN = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
  return _TOKEN.findall(text.lower())


class BM25:
  """`BM25(corpus_texts).search(query_texts, k) -> (scores_QxK float32, indices_QxK int64)`."""

  def __init__(self, corpus: Sequence[str], *, k1: float = 1.5, b: float = 0.75):
    if not len(corpus):
      raise ValueError("BM25 needs a non-empty corpus")
    self.k1, self.b, self.size = k1, b, len(corpus)
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in tokenize(text)] for text in corpus]
    self.vocab = vocab
    self.retriever = bm25s.BM25(method="lucene", k1=k1, b=b)
    self.retriever.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)

  def scores(self, query: str) -> np.ndarray:
    """float32 [N]: the query's score against every document (terms not in the corpus add nothing)."""
    ids = [self.vocab[t] for t in tokenize(query) if t in self.vocab]
    if not ids:
      return np.zeros(self.size, np.float32)
    return np.asarray(self.retriever.get_scores(ids), np.float32)

  def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    k = min(k, self.size)
    scores_QxK = np.zeros((len(queries), k), np.float32)
    indices_QxK = np.zeros((len(queries), k), np.int64)
    for i, query in enumerate(queries):
      s_N = self.scores(query)
      top = np.lexsort((np.arange(self.size), -s_N))[:k]  # score descending, then the lower index
      scores_QxK[i], indices_QxK[i] = s_N[top], top
    return scores_QxK, indices_QxK
