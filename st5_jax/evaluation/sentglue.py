"""SentGLUE (Sentence-T5 paper, section 2.5): GLUE tasks on frozen sentence embeddings.

Each input text is encoded on its own; pair tasks use [u, v, |u - v|, u * v]. GLUE test
labels are not public, so every task trains on GLUE train and is scored on GLUE dev,
with the classifier's C chosen by SentEval's k-fold protocol on train only (C in
2^[-1..5]). QNLI has only its dev split here, which is cut in two halves with no
question or sentence shared between them (see `qnli_halves`); C is chosen by grouped
k-fold on the first half and the score is on the second. STS-B is a ridge regression
on the pair features, its strength chosen by exact leave-one-out Pearson on train.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np

from st5_jax.evaluation import linear, metrics, readers, transfer
from st5_jax.evaluation.cache import Encode

RIDGE_ALPHAS = tuple(10.0 ** t for t in range(-4, 5))
# Each task takes what st5_jax.evaluation.sets reads for it ({split: data}; QNLI: its dev
# split) and returns run(embed) -> result dict.


def _pairs(embed: Encode, data) -> np.ndarray:
  return transfer.pair_features(embed(data.sents1), embed(data.sents2))


def cola_task(parts: dict[str, readers.Labeled], *, kfold: int = 10) -> Callable[[Encode], dict]:
  train, dev_in, dev_ood = parts["train"], parts["dev"], parts["dev_ood"]

  def run(embed: Encode) -> dict:
    dev_y = np.concatenate([dev_in.labels, dev_ood.labels])
    res = transfer.kfold_select(embed(train.texts), train.labels, embed(dev_in.texts + dev_ood.texts), dev_y,
                                kfold=kfold, select="mcc")
    pred = res.pop("pred")
    n_in = len(dev_in)
    res.update(mcc=100 * metrics.matthews(dev_y, pred),
               mcc_in_domain=100 * metrics.matthews(dev_in.labels, pred[:n_in]),
               mcc_out_of_domain=100 * metrics.matthews(dev_ood.labels, pred[n_in:]))
    res.update(main=res["mcc"], metric="mcc")
    return res
  return run


def sst2_task(parts: dict[str, readers.Labeled], *, kfold: int = 10) -> Callable[[Encode], dict]:
  train, dev = parts["train"], parts["dev"]

  def run(embed: Encode) -> dict:
    res = transfer.kfold_select(embed(train.texts), train.labels, embed(dev.texts), dev.labels, kfold=kfold)
    res.pop("pred")
    res.update(main=res["acc"], metric="acc")
    return res
  return run


def _pair_classification(*, f1: bool):
  def build(parts: dict[str, readers.LabeledPairs], *, kfold: int = 10) -> Callable[[Encode], dict]:
    train, dev = parts["train"], parts["dev"]

    def run(embed: Encode) -> dict:
      res = transfer.kfold_select(_pairs(embed, train), train.labels, _pairs(embed, dev), dev.labels, kfold=kfold)
      pred = res.pop("pred")
      if f1:  # GLUE's MRPC score is the mean of F1 and accuracy.
        res["f1"] = 100 * metrics.f1_binary(dev.labels, pred)
        res.update(main=(res["acc"] + res["f1"]) / 2, metric="mean(acc,f1)")
      else:
        res.update(main=res["acc"], metric="acc")
      return res
    return run
  return build


mrpc_task = _pair_classification(f1=True)
rte_task = _pair_classification(f1=False)


def ridge_select(x_tr, y_tr, x_te, y_te, *, alphas=RIDGE_ALPHAS) -> dict:
  """Ridge regression, alpha chosen by leave-one-out Pearson on train; Pearson/Spearman x100 on test."""
  coef_AxF, intercept_A, loo_AxN = linear.ridge_loo(x_tr, y_tr, alphas_A=alphas)
  dev = np.round([100 * metrics.pearson(loo_N, y_tr) for loo_N in loo_AxN], 2)
  best = int(np.argmax(dev))
  pred = np.asarray(x_te, np.float64) @ coef_AxF[best] + intercept_A[best]
  return {"pearson": 100 * metrics.pearson(pred, y_te), "spearman": 100 * metrics.spearman(pred, y_te),
          "dev_pearson": float(dev[best]), "alpha": alphas[best], "n_train": len(y_tr), "n_test": len(y_te)}


def stsb_task(parts: dict[str, readers.PairScores], *, kfold: int = 10) -> Callable[[Encode], dict]:
  del kfold  # leave-one-out instead: one eigendecomposition for every alpha.
  train, dev = parts["train"], parts["dev"]

  def run(embed: Encode) -> dict:
    res = ridge_select(_pairs(embed, train), train.scores, _pairs(embed, dev), dev.scores)
    res.update(main=(res["pearson"] + res["spearman"]) / 2, metric="mean(pearson,spearman)")
    return res
  return run


def qnli_halves(data: readers.LabeledPairs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Splits QNLI dev into (train rows, test rows, group per row) with no text shared across halves.

  Rows sharing a question or a sentence are joined into one group (connected
  components); each group goes to the half given by the parity of the first byte of
  md5(its first question), so the split is fixed by the data, not by row order.
  """
  parent = {}

  def find(x):
    while parent.setdefault(x, x) != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    return x

  for q, s in zip(data.sents1, data.sents2):
    parent[find(("q", q))] = find(("s", s))
  roots = [find(("q", q)) for q in data.sents1]
  first_question = {}
  for r, q in zip(roots, data.sents1):
    first_question.setdefault(r, q)
  group_ids = {r: i for i, r in enumerate(first_question)}
  groups = np.array([group_ids[r] for r in roots])
  to_test = np.array([hashlib.md5(first_question[r].encode("utf-8")).digest()[0] % 2 == 1 for r in roots])
  return np.flatnonzero(~to_test), np.flatnonzero(to_test), groups


def qnli_task(dev: readers.LabeledPairs, *, kfold: int = 10) -> Callable[[Encode], dict]:
  tr, te, groups = qnli_halves(dev)

  def run(embed: Encode) -> dict:
    x = _pairs(embed, dev)
    res = transfer.kfold_select(x[tr], dev.labels[tr], x[te], dev.labels[te], kfold=kfold, groups=groups[tr])
    res.pop("pred")
    res.update(main=res["acc"], metric="acc", split="QNLI dev halves without shared text (qnli_halves)")
    return res
  return run
