"""Semantic textual similarity: Spearman x100 between cosine similarity and gold scores."""

from __future__ import annotations

import functools
import os

import numpy as np

from st5_jax import paths
from st5_jax.evaluation import metrics, readers
from st5_jax.evaluation.cache import Encode


def cosine(a_NxD: np.ndarray, b_NxD: np.ndarray) -> np.ndarray:
  """Row-wise cosine similarity; a zero vector scores 0 (SentEval's nan_to_num)."""
  a_NxD = np.asarray(a_NxD, np.float64)
  b_NxD = np.asarray(b_NxD, np.float64)
  denom_N = np.linalg.norm(a_NxD, axis=1) * np.linalg.norm(b_NxD, axis=1)
  dots_N = np.einsum("nd,nd->n", a_NxD, b_NxD)
  return np.where(denom_N > 0, dots_N / np.where(denom_N > 0, denom_N, 1.0), 0.0)


def score_pairs(data: readers.PairScores, emb1_NxD: np.ndarray, emb2_NxD: np.ndarray, *,
                per_subset: bool) -> dict:
  """Correlations x100 over all pairs, and per subset with SentEval's mean and weighted mean."""
  sims_N = cosine(emb1_NxD, emb2_NxD)
  out = {
      "spearman_all": 100 * metrics.spearman(sims_N, data.scores),
      "pearson_all": 100 * metrics.pearson(sims_N, data.scores),
      "n": len(data),
  }
  subsets = np.asarray(data.subsets)
  if per_subset:
    names = list(dict.fromkeys(data.subsets))
    detail = {}
    for name in names:
      sel = subsets == name
      detail[name] = {"spearman": 100 * metrics.spearman(sims_N[sel], data.scores[sel]),
                      "pearson": 100 * metrics.pearson(sims_N[sel], data.scores[sel]),
                      "n": int(sel.sum())}
    sp = np.array([d["spearman"] for d in detail.values()])
    pe = np.array([d["pearson"] for d in detail.values()])
    w = np.array([d["n"] for d in detail.values()], np.float64)
    out.update(spearman_mean=float(sp.mean()), spearman_wmean=float(np.average(sp, weights=w)),
               pearson_mean=float(pe.mean()), pearson_wmean=float(np.average(pe, weights=w)), subsets=detail)
  else:
    # One dataset in SentEval (STS-B, SICK-R): its "mean" is the all-pairs value.
    out.update(spearman_mean=out["spearman_all"], spearman_wmean=out["spearman_all"],
               pearson_mean=out["pearson_all"], pearson_wmean=out["pearson_all"])
  return out


def evaluate_pairs(data: readers.PairScores, embed: Encode, *, per_subset: bool) -> dict:
  result = score_pairs(data, embed(data.sents1), embed(data.sents2), per_subset=per_subset)
  result.update(main=result["spearman_all"], metric="spearman_all")
  return result


@functools.lru_cache(maxsize=4)
def _stsb_dev(root: str) -> tuple[readers.PairScores, list[str], np.ndarray, np.ndarray]:
  data = readers.read_stsb(root, split="dev")
  texts = list(dict.fromkeys(data.sents1 + data.sents2))
  index = {t: i for i, t in enumerate(texts)}
  return data, texts, np.array([index[t] for t in data.sents1]), np.array([index[t] for t in data.sents2])


def sts_dev_spearman(encode: Encode, *, data_dir=None) -> float:
  """Spearman x100 of cosine similarity on STS-B dev (1500 pairs, stsb/original/sts-dev.csv).

  For calling from a training loop: the file is parsed once per process and each of
  its distinct sentences is encoded once per call (one `encode` call).
  """
  root = os.fspath(paths.data_dir(data_dir))  # absolute, local or gs://
  data, texts, i1_N, i2_N = _stsb_dev(root)
  emb_NxD = np.asarray(encode(texts))
  if emb_NxD.shape[0] != len(texts):
    raise ValueError(f"encode returned {emb_NxD.shape[0]} rows for {len(texts)} texts")
  return 100 * metrics.spearman(cosine(emb_NxD[i1_N], emb_NxD[i2_N]), data.scores)
