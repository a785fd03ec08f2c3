"""SentEval transfer tasks: logistic regression on frozen embeddings, SentEval's protocols.

The three protocols of senteval/tools/validation.py (scikit-learn branch), with the
same grids, fold seeds, rounding and tie-breaking:

- inner k-fold (MR, CR, SUBJ, MPQA): outer stratified k-fold; within each outer
  training part, C in 2^[-2..3] chosen by inner stratified k-fold accuracy; the
  reported accuracy is the mean over outer test folds.
- k-fold (TREC, MRPC): C in 2^[-1..5] chosen by stratified k-fold on train, refit on
  all of train, scored on test.
- split (SST-2): C in 2^[-2..3] chosen on dev, scored on test.

All fits of a task (folds x C) are one `linear.fit_logistic` call, warm-started from a
fit per C on all the task's training rows.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

from st5_jax.evaluation import linear, metrics, readers
from st5_jax.evaluation.cache import Encode

SEED = 1111  # SentEval's default seed, used for every fold split.
C_INNER_KFOLD = tuple(2.0 ** t for t in range(-2, 4))  # InnerKFoldClassifier and SplitClassifier
C_KFOLD = tuple(2.0 ** t for t in range(-1, 6))  # KFoldClassifier


def _fit_grid(x_NxF, y_N, train_PxN, c_index_P, c_grid, **fit_kwargs) -> linear.LogisticFit:
  """Fits every problem; each C is first fitted on all training rows to warm-start its folds."""
  c_grid = np.asarray(c_grid, np.float64)
  union_N = np.any(train_PxN, axis=0)
  first = linear.fit_logistic(x_NxF, y_N, train_PxN=np.repeat(union_N[None], len(c_grid), 0), c_P=c_grid, **fit_kwargs)
  return linear.fit_logistic(x_NxF, y_N, train_PxN=train_PxN, c_P=c_grid[c_index_P],
                             init_PxF1xK=first.theta_PxF1xK[c_index_P], **fit_kwargs)


def pair_features(u_NxD: np.ndarray, v_NxD: np.ndarray) -> np.ndarray:
  """[u, v, |u - v|, u * v]."""
  return np.concatenate([u_NxD, v_NxD, np.abs(u_NxD - v_NxD), u_NxD * v_NxD], axis=1)


def inner_kfold(x_NxF, y_N, *, kfold: int = 10, seed: int = SEED, c_grid=C_INNER_KFOLD, **fit_kwargs) -> dict:
  """SentEval's InnerKFoldClassifier: nested stratified k-fold, accuracy x100."""
  x_NxF, y_N = np.asarray(x_NxF), np.asarray(y_N)
  n, nc = len(y_N), len(c_grid)
  outer = list(StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed).split(np.zeros(n), y_N))
  masks, c_index, evals = [], [], []  # evals[p]: rows problem p is scored on.
  for tr, te in outer:
    inner = list(StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed).split(np.zeros(len(tr)), y_N[tr]))
    for ci in range(nc):
      for itr, ite in inner + [(np.arange(len(tr)), None)]:
        mask = np.zeros(n, bool)
        mask[tr[itr]] = True
        masks.append(mask)
        c_index.append(ci)
        evals.append(te if ite is None else tr[ite])
  fit = _fit_grid(x_NxF, y_N, np.stack(masks), np.asarray(c_index), c_grid, **fit_kwargs)
  pred_NxP = fit.predict(x_NxF)
  acc_P = np.array([metrics.accuracy(y_N[rows], pred_NxP[rows, p]) for p, rows in enumerate(evals)])
  per_outer = acc_P.reshape(kfold, nc, kfold + 1)
  dev_scores = np.round(100 * per_outer[:, :, :kfold].mean(axis=2), 2)  # [outer, C], rounded as SentEval.
  best = np.argmax(dev_scores, axis=1)  # first maximum: the smallest C among ties.
  test = 100 * per_outer[np.arange(kfold), best, kfold]
  return {"acc": float(test.mean()), "devacc": float(dev_scores[np.arange(kfold), best].mean()),
          "c_per_fold": [c_grid[b] for b in best], "n": n, "fits": len(masks) + nc,
          "converged": bool(fit.converged_P.all())}


def kfold_select(x_tr, y_tr, x_te, y_te, *, kfold: int = 10, seed: int = SEED, c_grid=C_KFOLD,
                 select: str = "accuracy", groups=None, **fit_kwargs) -> dict:
  """SentEval's KFoldClassifier: C by stratified k-fold on train, refit on train, test scores.

  `select="mcc"` chooses C by Matthews correlation instead of accuracy; `groups` keeps
  rows of a group in one fold (StratifiedGroupKFold).
  """
  x_tr, y_tr, x_te, y_te = map(np.asarray, (x_tr, y_tr, x_te, y_te))
  n_tr, nc = len(y_tr), len(c_grid)
  if groups is None:
    folds = list(StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed).split(np.zeros(n_tr), y_tr))
  else:
    folds = list(StratifiedGroupKFold(n_splits=kfold, shuffle=True, random_state=seed).split(
        np.zeros(n_tr), y_tr, groups))
  x_all = np.concatenate([x_tr, x_te], axis=0)
  y_all = np.concatenate([y_tr, y_te], axis=0)
  n = len(y_all)
  masks, c_index = [], []
  for ci in range(nc):
    for tr, _ in folds + [(np.arange(n_tr), None)]:
      mask = np.zeros(n, bool)
      mask[tr] = True
      masks.append(mask)
      c_index.append(ci)
  fit = _fit_grid(x_all, y_all, np.stack(masks), np.asarray(c_index), c_grid, **fit_kwargs)
  pred_NxP = fit.predict(x_all).reshape(n, nc, kfold + 1)
  score = metrics.matthews if select == "mcc" else metrics.accuracy
  dev = np.zeros(nc)
  for ci in range(nc):
    dev[ci] = np.mean([score(y_tr[va], pred_NxP[va, ci, j]) for j, (_, va) in enumerate(folds)])
  dev = np.round(100 * dev, 2)
  best = int(np.argmax(dev))
  test_pred = pred_NxP[n_tr:, best, kfold]
  return {"acc": 100 * metrics.accuracy(y_te, test_pred), "devscore": float(dev[best]), "select": select,
          "c": c_grid[best], "pred": test_pred, "n_train": n_tr, "n_test": len(y_te), "fits": len(masks) + nc,
          "converged": bool(fit.converged_P.all())}


def split_select(x_tr, y_tr, x_dev, y_dev, x_te, y_te, *, c_grid=C_INNER_KFOLD, **fit_kwargs) -> dict:
  """SentEval's SplitClassifier: C chosen on dev accuracy, test accuracy x100."""
  x_all = np.concatenate([x_tr, x_dev, x_te], axis=0)
  y_all = np.concatenate([y_tr, y_dev, y_te], axis=0)
  n_tr, n_dev = len(y_tr), len(y_dev)
  mask_N = np.zeros(len(y_all), bool)
  mask_N[:n_tr] = True
  fit = linear.fit_logistic(x_all, y_all, train_PxN=np.repeat(mask_N[None], len(c_grid), 0),
                            c_P=np.asarray(c_grid), **fit_kwargs)
  pred_NxP = fit.predict(x_all)
  dev = np.round([100 * metrics.accuracy(y_dev, pred_NxP[n_tr:n_tr + n_dev, p]) for p in range(len(c_grid))], 2)
  best = int(np.argmax(dev))
  return {"acc": 100 * metrics.accuracy(y_te, pred_NxP[n_tr + n_dev:, best]), "devacc": float(dev[best]),
          "c": c_grid[best], "n_train": n_tr, "n_dev": n_dev, "n_test": len(y_te), "fits": len(c_grid),
          "converged": bool(fit.converged_P.all())}


# ----------------------------------------------------------------------- tasks
# Each takes what st5_jax.evaluation.sets reads for its task (rows already in SentEval's
# order, `sets.senteval_sorted`) and returns run(embed) -> result dict.


def binary_task(data: readers.Labeled, *, kfold: int = 10) -> Callable[[Encode], dict]:
  """MR, CR, SUBJ, MPQA: inner k-fold."""
  def run(embed: Encode) -> dict:
    res = inner_kfold(embed(data.texts), data.labels, kfold=kfold)
    res.update(main=res["acc"], metric="acc")
    return res
  return run


def sst2_task(parts: dict[str, readers.Labeled], *, kfold: int = 10) -> Callable[[Encode], dict]:
  del kfold  # SST-2 uses its dev split.
  train, dev, test = parts["train"], parts["dev"], parts["test"]

  def run(embed: Encode) -> dict:
    res = split_select(embed(train.texts), train.labels, embed(dev.texts), dev.labels, embed(test.texts), test.labels)
    res.update(main=res["acc"], metric="acc")
    return res
  return run


def trec_task(parts: dict[str, readers.Labeled], *, kfold: int = 10) -> Callable[[Encode], dict]:
  train, test = parts["train"], parts["test"]

  def run(embed: Encode) -> dict:
    res = kfold_select(embed(train.texts), train.labels, embed(test.texts), test.labels, kfold=kfold)
    res.pop("pred")
    res.update(main=res["acc"], metric="acc")
    return res
  return run


def mrpc_task(parts: dict[str, readers.LabeledPairs], *, kfold: int = 10) -> Callable[[Encode], dict]:
  train, test = parts["train"], parts["test"]

  def run(embed: Encode) -> dict:
    res = kfold_select(pair_features(embed(train.sents1), embed(train.sents2)), train.labels,
                       pair_features(embed(test.sents1), embed(test.sents2)), test.labels, kfold=kfold)
    res["f1"] = 100 * metrics.f1_binary(test.labels, res.pop("pred"))
    res.update(main=res["acc"], metric="acc")
    return res
  return run
