"""Alignment and uniformity (Wang & Isola 2020; Sentence-T5 paper eq. 15).

  alignment  = E_{(x, y) positive} ||f(x) - f(y)||^2
  uniformity = log E_{x, y iid} exp(-2 ||f(x) - f(y)||^2)

on L2-normalised embeddings; lower is better for both. Positives are STS-B pairs with
gold score >= 4; the data distribution is every distinct sentence of the same split,
and the expectation for uniformity runs over distinct pairs i < j (as
`torch.pdist` in Wang & Isola's code).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from st5_jax.evaluation import readers
from st5_jax.evaluation.cache import Encode

POSITIVE_MIN_SCORE = 4.0


def _normalise(x_NxD: np.ndarray) -> np.ndarray:
  x_NxD = np.asarray(x_NxD, np.float64)
  norm_N1 = np.linalg.norm(x_NxD, axis=1, keepdims=True)
  return x_NxD / np.where(norm_N1 > 0, norm_N1, 1.0)


def alignment(x_NxD: np.ndarray, y_NxD: np.ndarray) -> float:
  diff_NxD = _normalise(x_NxD) - _normalise(y_NxD)
  return float(np.mean(np.sum(diff_NxD ** 2, axis=1)))


def uniformity(x_NxD: np.ndarray, *, t: float = 2.0, block: int = 2048) -> float:
  """log of the mean of exp(-t ||x_i - x_j||^2) over pairs i < j, in row blocks."""
  x_NxD = _normalise(x_NxD)
  n = x_NxD.shape[0]
  if n < 2:
    raise ValueError("uniformity needs at least two embeddings")
  total = 0.0
  for start in range(0, n, block):
    rows_BxD = x_NxD[start:start + block]
    sq_BxN = np.maximum(2.0 - 2.0 * rows_BxD @ x_NxD.T, 0.0)  # unit vectors: ||a-b||^2 = 2 - 2 a.b
    upper_BxN = np.arange(n)[None, :] > np.arange(start, start + len(rows_BxD))[:, None]
    total += float(np.sum(np.exp(-t * sq_BxN) * upper_BxN))
  return float(np.log(total / (n * (n - 1) / 2)))


def align_uniform_task(data: readers.PairScores, *, kfold: int = 10, split: str = "test") -> Callable[[Encode], dict]:
  """`data`: STS-B pairs of `split` (st5_jax.evaluation.sets reads the test split); run(embed) -> result dict."""
  del kfold
  pos = data.scores >= POSITIVE_MIN_SCORE
  texts = list(dict.fromkeys(data.sents1 + data.sents2))  # the data distribution: each distinct sentence once

  def run(embed: Encode) -> dict:
    a = [s for s, keep in zip(data.sents1, pos) if keep]
    b = [s for s, keep in zip(data.sents2, pos) if keep]
    return {"alignment": alignment(embed(a), embed(b)), "uniformity": uniformity(embed(texts)),
            "n_positive_pairs": int(pos.sum()), "n_sentences": len(texts), "split": split,
            "main": None, "metric": None}
  return run
