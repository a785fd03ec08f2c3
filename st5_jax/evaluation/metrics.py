"""Correlations and classification scores, in numpy (checked against SciPy and scikit-learn)."""

from __future__ import annotations

import numpy as np


def rankdata(x_N: np.ndarray) -> np.ndarray:
  """1-based ranks, ties given their average rank (scipy.stats.rankdata's default)."""
  x_N = np.asarray(x_N)
  n = x_N.shape[0]
  order_N = np.argsort(x_N, kind="mergesort")
  sorted_N = x_N[order_N]
  starts_new_N = np.r_[True, sorted_N[1:] != sorted_N[:-1]]
  group_N = np.cumsum(starts_new_N) - 1
  starts_G = np.flatnonzero(starts_new_N)
  counts_G = np.diff(np.r_[starts_G, n])
  mean_rank_G = starts_G + (counts_G + 1) / 2.0
  ranks_N = np.empty(n, np.float64)
  ranks_N[order_N] = mean_rank_G[group_N]
  return ranks_N


def pearson(a_N: np.ndarray, b_N: np.ndarray) -> float:
  """Pearson's r; NaN when either side is constant (as SciPy, without the warning)."""
  a_N = np.asarray(a_N, np.float64) - np.mean(a_N)
  b_N = np.asarray(b_N, np.float64) - np.mean(b_N)
  denom = np.sqrt(np.dot(a_N, a_N) * np.dot(b_N, b_N))
  if denom == 0:
    return float("nan")
  return float(np.clip(np.dot(a_N, b_N) / denom, -1.0, 1.0))


def spearman(a_N: np.ndarray, b_N: np.ndarray) -> float:
  """Spearman's rho: Pearson's r of average ranks."""
  if len(a_N) != len(b_N):
    raise ValueError(f"length mismatch: {len(a_N)} vs {len(b_N)}")
  return pearson(rankdata(a_N), rankdata(b_N))


def accuracy(y_true_N: np.ndarray, y_pred_N: np.ndarray) -> float:
  return float(np.mean(np.asarray(y_true_N) == np.asarray(y_pred_N)))


def f1_binary(y_true_N: np.ndarray, y_pred_N: np.ndarray) -> float:
  """F1 of the positive class (label 1), sklearn's f1_score default."""
  y_true_N, y_pred_N = np.asarray(y_true_N) == 1, np.asarray(y_pred_N) == 1
  tp = np.sum(y_true_N & y_pred_N)
  denom = np.sum(y_true_N) + np.sum(y_pred_N)
  return float(2 * tp / denom) if denom else 0.0


def matthews(y_true_N: np.ndarray, y_pred_N: np.ndarray) -> float:
  """Matthews correlation for binary labels; 0 when a margin is empty (sklearn's choice)."""
  t_N, p_N = np.asarray(y_true_N) == 1, np.asarray(y_pred_N) == 1
  tp = float(np.sum(t_N & p_N))
  tn = float(np.sum(~t_N & ~p_N))
  fp = float(np.sum(~t_N & p_N))
  fn = float(np.sum(t_N & ~p_N))
  denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  return float((tp * tn - fp * fn) / denom) if denom else 0.0
