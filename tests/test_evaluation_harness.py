"""`evaluate` end to end with a cheap deterministic encoder, the cache, and task plumbing."""

import csv
import hashlib
import math
import pathlib

import numpy as np
import pytest
from scipy import stats
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

from st5_jax import paths
from st5_jax.evaluation import (SUITES, TASKS, EmbeddingCache, evaluate, readers, resolve_tasks, sentglue,
                                sts_dev_spearman)
from st5_jax.evaluation.baselines import HashedBagOfWords


@pytest.fixture(scope="module")
def full_run(data_dir):
  # The whole suite; k=2 folds keeps it fast (the protocol itself is checked in test_evaluation_linear).
  encoder = HashedBagOfWords(32)
  return encoder, evaluate(encoder, "all", data_dir, kfold=2)


def test_whole_suite_runs_and_encodes_each_text_once(full_run):
  encoder, res = full_run
  assert list(res["tasks"]) == SUITES["all"]
  # One encode per distinct text, for all tasks (retrieval sets' corpora included).
  assert encoder.calls == res["meta"]["n_texts"]
  for name, task in res["tasks"].items():
    if task["suite"] == "geometry":
      assert 0 <= task["alignment"] <= 4 and -4 <= task["uniformity"] <= 0
      continue
    assert math.isfinite(task["main"]) and -100 <= task["main"] <= 100, name
    assert task["seconds"] >= 0 and task["files"]
  for suite in ("sts", "transfer", "sentglue"):
    assert res["summary"][suite]["complete"]
  # Bag-of-words similarity tracks gold similarity on every STS set.
  assert all(res["tasks"][t]["main"] > 0 for t in SUITES["sts"])


def test_results_match_direct_computation(full_run, data_dir):
  encoder, res = full_run
  data = readers.read_stsb(data_dir, split="test")
  a_NxD, b_NxD = (np.asarray(encoder(t), np.float64) for t in (data.sents1, data.sents2))
  # Same rounding as sts.cosine: bag-of-words cosines tie a lot, and ties are rounding-sensitive.
  cos_N = np.einsum("nd,nd->n", a_NxD, b_NxD) / (np.linalg.norm(a_NxD, axis=1) * np.linalg.norm(b_NxD, axis=1))
  assert res["tasks"]["STSBenchmark"]["main"] == pytest.approx(100 * stats.spearmanr(cos_N, data.scores).statistic)
  sts12 = res["tasks"]["STS12"]
  assert sts12["n"] == sum(s["n"] for s in sts12["subsets"].values())
  assert sts12["spearman_mean"] == pytest.approx(np.mean([s["spearman"] for s in sts12["subsets"].values()]))


def test_cache_reuse_and_dev_metric(data_dir):
  encoder = HashedBagOfWords(16)
  cache = EmbeddingCache(encoder)
  first = evaluate(encoder, ["STSBenchmarkDev", "stsb"], data_dir, cache=cache)
  calls = encoder.calls
  again = evaluate(encoder, "STSBenchmarkDev", data_dir, cache=cache)
  assert encoder.calls == calls  # nothing re-encoded
  score = sts_dev_spearman(encoder, data_dir=data_dir)
  assert score == pytest.approx(first["tasks"]["STSBenchmarkDev"]["main"]) == pytest.approx(
      again["tasks"]["STSBenchmarkDev"]["main"])


def test_resolve_tasks():
  assert resolve_tasks("sts") == SUITES["sts"]
  assert resolve_tasks("STS-B, sick-r,MR,mr") == ["STSBenchmark", "SICKRelatedness", "MR"]
  assert resolve_tasks(["geometry", "transfer"]) == ["AlignUniform"] + SUITES["transfer"]
  assert set(resolve_tasks("all")) == set(TASKS) - {"STSBenchmarkDev", "TREC-QA-dev", "SemEval2016-B-dev"}
  assert resolve_tasks("dev") == ["STSBenchmarkDev", "TREC-QA-dev", "SemEval2016-B-dev"]
  with pytest.raises(ValueError, match="unknown task"):
    resolve_tasks("sts,nope")


def test_bad_inputs_fail(data_dir, tmp_path):
  with pytest.raises(paths.MissingFileError):
    evaluate(HashedBagOfWords(8), "STS12", tmp_path / "absent")
  with pytest.raises(ValueError, match="shape"):
    evaluate(lambda texts: np.zeros((len(texts) + 1, 4)), "STSBenchmarkDev", data_dir)
  with pytest.raises(ValueError, match="non-finite"):
    evaluate(lambda texts: np.full((len(texts), 4), np.nan), "STSBenchmarkDev", data_dir)


def test_qnli_halves_share_no_text(data_dir):
  dev = readers.read_glue(data_dir, task="QNLI", split="dev")
  tr, te, groups = sentglue.qnli_halves(dev)
  assert len(tr) + len(te) == len(dev) and not set(tr) & set(te)
  q, s = np.array(dev.sents1), np.array(dev.sents2)
  assert not set(q[tr]) & set(q[te]) and not set(s[tr]) & set(s[te])
  assert not set(groups[tr]) & set(groups[te])
  assert 0.4 < len(tr) / len(dev) < 0.6
  tr2, te2, _ = sentglue.qnli_halves(dev)
  np.testing.assert_array_equal(tr, tr2)


# ------------------------------------------------ transfer and SentGLUE against scikit-learn
#
# Every transfer and SentGLUE figure of `full_run`, re-derived without st5_jax's readers,
# feature builder, solver, protocols or metrics: the raw files read with the csv module,
# the same encoder's embeddings, scikit-learn's LogisticRegression (lbfgs, tol 1e-6:
# the same figures as 1e-8 here, faster) in a re-typed copy of SentEval's loops, sklearn.metrics, and an exact
# leave-one-out ridge written out from the hat matrix (scikit-learn's Ridge for the fit).

_SEED = 1111
_C_INNER = [2.0 ** t for t in range(-2, 4)]  # SentEval's InnerKFold / Split grid
_C_KFOLD = [2.0 ** t for t in range(-1, 6)]  # SentEval's KFold grid
# Harness (float32 batched L-BFGS, gradient stop 1e-5) vs scikit-learn at its optimum,
# HashedBagOfWords(32), k=2: max gap 0.28 points (SentGLUE-MRPC, one dev row), MPQA 0.18
# (a dev-score tie at 2 decimals, 69.58 for C=0.5 and C=2, broken the other way by the
# float32 fit in one outer fold; the harness in float64 gives sklearn's 69.423 exactly),
# the rest <= 0.11, TREC/SST/STS-B/RTE exactly equal. 0.75 allows two rows of RTE dev
# (277 rows, 0.36 points a row) or such a C flip; features built as [u, v, u-v, u*v]
# (no abs) move STS-B by 2.25 and RTE by 1.81; C chosen on the k-fold test set moves
# SentGLUE-MRPC by 0.96 and RTE by 1.08.
_TOL = 0.75


def _raw_lines(path, encoding="utf-8"):
  with open(path, encoding=encoding, newline="") as f:
    text = f.read()
  return [line.rstrip("\r") for line in text.split("\n")][: -1 if text.endswith("\n") else None]


def _raw_tsv(path, *, header):
  with open(path, encoding="utf-8-sig", newline="") as f:  # GLUE/MRPC headers start with a BOM
    rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))  # literal quotes in MRPC/STS-B
  return rows[1:] if header else rows


def _text(t):  # the harness's documented text: whitespace-normalised, an empty text is "."
  return " ".join(t.split()) or "."


def _senteval_sorted(keys, *cols):
  order = sorted(range(len(keys)), key=lambda i: keys[i])  # stable, as SentEval's sorted()
  return [[c[i] for i in order] for c in cols]


def _sk_fit(c, x, y):
  return LogisticRegression(C=c, tol=1e-6, max_iter=10000).fit(x, y)


def _choice(grid, dev):
  """The chosen value (first maximum) and its lead over the runner-up, in dev points."""
  top = sorted(dev, reverse=True)
  return grid[int(np.argmax(dev))], top[0] - top[1]


def _sk_inner_kfold(x, y, k, choices):
  """SentEval's InnerKFoldClassifier loop (senteval/tools/validation.py), re-typed."""
  accs = []
  for tr, te in StratifiedKFold(k, shuffle=True, random_state=_SEED).split(x, y):
    inner = list(StratifiedKFold(k, shuffle=True, random_state=_SEED).split(x[tr], y[tr]))
    dev = [round(100 * np.mean([_sk_fit(c, x[tr][a], y[tr][a]).score(x[tr][b], y[tr][b]) for a, b in inner]), 2)
           for c in _C_INNER]
    choices.append(_choice(_C_INNER, dev))
    accs.append(100 * _sk_fit(_C_INNER[int(np.argmax(dev))], x[tr], y[tr]).score(x[te], y[te]))
  return float(np.mean(accs))


def _sk_kfold(x, y, xt, k, choices, *, score=accuracy_score, groups=None):
  """SentEval's KFoldClassifier: C by stratified k-fold on train, refit on train; test predictions."""
  splitter = (StratifiedKFold(k, shuffle=True, random_state=_SEED) if groups is None
              else StratifiedGroupKFold(k, shuffle=True, random_state=_SEED))
  folds = list(splitter.split(x, y, groups))
  dev = [round(100 * np.mean([score(y[b], _sk_fit(c, x[a], y[a]).predict(x[b])) for a, b in folds]), 2)
         for c in _C_KFOLD]
  choices.append(_choice(_C_KFOLD, dev))
  return _sk_fit(_C_KFOLD[int(np.argmax(dev))], x, y).predict(xt)


def _pairs(enc, s1, s2):
  u, v = (np.asarray(enc(s), np.float64) for s in (s1, s2))
  return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


def _sk_transfer(enc, root, k, chosen):
  out, st = {}, root / "senteval_transfer"
  binary = {"MR": ("MR/rt-polarity.pos", "MR/rt-polarity.neg"), "CR": ("CR/custrev.pos", "CR/custrev.neg"),
            "SUBJ": ("SUBJ/subj.objective", "SUBJ/subj.subjective"), "MPQA": ("MPQA/mpqa.pos", "MPQA/mpqa.neg")}
  for task, (pos, neg) in binary.items():
    p, n = _raw_lines(st / pos), _raw_lines(st / neg)
    texts, labels = [_text(t) for t in p + n], [1] * len(p) + [0] * len(n)
    texts, labels = _senteval_sorted([(len(t.split()), l) for t, l in zip(texts, labels)], texts, labels)
    out[task] = _sk_inner_kfold(np.asarray(enc(texts), np.float64), np.array(labels), k, chosen.setdefault(task, []))

  sst = {s: _raw_tsv(st / "SST/binary" / f"sentiment-{s}", header=False) for s in ("train", "dev", "test")}
  (xtr, ytr), (xdv, ydv), (xte, yte) = ((np.asarray(enc([r[0] for r in rows]), np.float64),
                                         np.array([int(r[1]) for r in rows])) for rows in sst.values())
  dev = [round(100 * _sk_fit(c, xtr, ytr).score(xdv, ydv), 2) for c in _C_INNER]
  chosen["SST2"] = [_choice(_C_INNER, dev)]
  out["SST2"] = 100 * _sk_fit(_C_INNER[int(np.argmax(dev))], xtr, ytr).score(xte, yte)

  trec = {}
  for split, name in (("train", "train_5500.label"), ("test", "TREC_10.label")):
    rows = [line.strip().split(" ", 1) for line in _raw_lines(st / "TREC" / name, "latin-1")]
    texts, labels = [_text(r[1]) for r in rows], [r[0].split(":")[0] for r in rows]
    trec[split] = _senteval_sorted([(len(t.split()), l) for t, l in zip(texts, labels)], texts, labels)
  classes = sorted(set(trec["train"][1]))  # SentEval's label ids follow this order (ABBR..NUM)
  pred = _sk_kfold(np.asarray(enc(trec["train"][0]), np.float64), np.array([classes.index(l) for l in trec["train"][1]]),
                   np.asarray(enc(trec["test"][0]), np.float64), k, chosen.setdefault("TREC", []))
  out["TREC"] = 100 * accuracy_score([classes.index(l) for l in trec["test"][1]], pred)

  mrpc = {}
  for split in ("train", "test"):
    rows = _raw_tsv(st / "MRPC" / f"msr_paraphrase_{split}.txt", header=True)
    a, b, y = [_text(r[3]) for r in rows], [_text(r[4]) for r in rows], [int(r[0]) for r in rows]
    mrpc[split] = _senteval_sorted([(len(s.split()), len(t.split()), l) for s, t, l in zip(a, b, y)], a, b, y)
  (a, b, y), (ta, tb, ty) = mrpc["train"], mrpc["test"]
  pred = _sk_kfold(_pairs(enc, a, b), np.array(y), _pairs(enc, ta, tb), k, chosen.setdefault("MRPC", []))
  out["MRPC"] = 100 * accuracy_score(ty, pred)
  out["MRPC f1"] = 100 * f1_score(ty, pred)
  return out


def _sk_loo_ridge(x, y, xt, yt, choices):
  """Ridge, alpha in 10^[-4..4] by exact leave-one-out Pearson (hat matrix of [X, 1], intercept unpenalised)."""
  xa = np.concatenate([x, np.ones((len(x), 1))], axis=1)
  dev = []
  for alpha in (10.0 ** t for t in range(-4, 5)):
    pen = alpha * np.eye(xa.shape[1])
    pen[-1, -1] = 0.0
    a_inv_xt = np.linalg.solve(xa.T @ xa + pen, xa.T)
    fitted, hat = xa @ (a_inv_xt @ y), np.einsum("nf,fn->n", xa, a_inv_xt)
    dev.append(round(100 * stats.pearsonr(y - (y - fitted) / (1 - hat), y).statistic, 2))
  choices.append(_choice([10.0 ** t for t in range(-4, 5)], dev))
  pred = Ridge(alpha=10.0 ** (int(np.argmax(dev)) - 4)).fit(x, y).predict(xt)
  return 100 * stats.pearsonr(pred, yt).statistic, 100 * stats.spearmanr(pred, yt).statistic


def _sk_sentglue(enc, root, k, chosen):
  out, g = {}, root / "glue"
  cola = {s: _raw_tsv(g / "CoLA" / f, header=False)
          for s, f in (("train", "train.tsv"), ("dev", "dev.tsv"), ("ood", "out_of_domain_dev.tsv"))}
  xs = {s: np.asarray(enc([r[3] for r in rows]), np.float64) for s, rows in cola.items()}
  ys = {s: np.array([int(r[1]) for r in rows]) for s, rows in cola.items()}
  pred = _sk_kfold(xs["train"], ys["train"], np.concatenate([xs["dev"], xs["ood"]]), k,
                   chosen.setdefault("SentGLUE-CoLA", []), score=matthews_corrcoef)
  out["SentGLUE-CoLA"] = 100 * matthews_corrcoef(np.concatenate([ys["dev"], ys["ood"]]), pred)

  sst = {s: _raw_tsv(g / "SST-2" / f"{s}.tsv", header=True) for s in ("train", "dev")}
  pred = _sk_kfold(np.asarray(enc([r[0] for r in sst["train"]]), np.float64),
                   np.array([int(r[1]) for r in sst["train"]]), np.asarray(enc([r[0] for r in sst["dev"]]), np.float64), k,
                   chosen.setdefault("SentGLUE-SST2", []))
  out["SentGLUE-SST2"] = 100 * accuracy_score([int(r[1]) for r in sst["dev"]], pred)

  label = {"MRPC": lambda r: int(r[0]), "RTE": lambda r: int(r[3] == "entailment")}
  cols = {"MRPC": (3, 4), "RTE": (1, 2)}
  for task in ("MRPC", "RTE"):
    tr, dv = (_raw_tsv(g / task / f"{s}.tsv", header=True) for s in ("train", "dev"))
    i, j = cols[task]
    pred = _sk_kfold(_pairs(enc, [r[i] for r in tr], [r[j] for r in tr]), np.array([label[task](r) for r in tr]),
                     _pairs(enc, [r[i] for r in dv], [r[j] for r in dv]), k, chosen.setdefault(f"SentGLUE-{task}", []))
    y = [label[task](r) for r in dv]
    out[f"SentGLUE-{task}"] = (100 * (accuracy_score(y, pred) + f1_score(y, pred)) / 2 if task == "MRPC"
                               else 100 * accuracy_score(y, pred))

  tr, dv = (_raw_tsv(g / "STS-B" / f"{s}.tsv", header=True) for s in ("train", "dev"))
  pearson, spearman = _sk_loo_ridge(_pairs(enc, [r[7] for r in tr], [r[8] for r in tr]), np.array([float(r[9]) for r in tr]),
                                    _pairs(enc, [r[7] for r in dv], [r[8] for r in dv]), np.array([float(r[9]) for r in dv]),
                                    chosen.setdefault("SentGLUE-STSB", []))
  out["SentGLUE-STSB"] = (pearson + spearman) / 2

  # QNLI dev halves, as documented: rows joined by shared question or sentence (connected
  # components), a component goes to the test half when md5(its first question)[0] is odd.
  rows = _raw_tsv(g / "QNLI" / "dev.tsv", header=True)
  q, s, y = [_text(r[1]) for r in rows], [_text(r[2]) for r in rows], np.array([int(r[3] == "entailment") for r in rows])
  qid, sid = {t: i for i, t in enumerate(dict.fromkeys(q))}, {t: i for i, t in enumerate(dict.fromkeys(s))}
  n_q = len(qid)
  edges = csr_matrix((np.ones(len(rows)), ([qid[t] for t in q], [n_q + sid[t] for t in s])), shape=(n_q + len(sid),) * 2)
  comp = connected_components(edges, directed=False)[1][[qid[t] for t in q]]
  first_q = {}
  for c, t in zip(comp, q):
    first_q.setdefault(c, t)
  test = np.array([hashlib.md5(first_q[c].encode("utf-8")).digest()[0] % 2 == 1 for c in comp])
  x = _pairs(enc, q, s)
  pred = _sk_kfold(x[~test], y[~test], x[test], k, chosen.setdefault("SentGLUE-QNLI", []), groups=comp[~test])
  out["SentGLUE-QNLI"] = 100 * accuracy_score(y[test], pred)
  return out


def test_transfer_and_sentglue_match_scikit_learn(full_run, data_dir):
  _, res = full_run
  chosen = {}  # task -> [(C or alpha chosen by scikit-learn's loop, its lead in dev points)], per (outer) fold
  sk = {**_sk_transfer(HashedBagOfWords(32), pathlib.Path(data_dir), 2, chosen),
        **_sk_sentglue(HashedBagOfWords(32), pathlib.Path(data_dir), 2, chosen)}
  assert set(SUITES["transfer"]) | set(SUITES["sentglue"]) <= set(sk)  # every figure has a re-derivation
  ours = {name: res["tasks"][name]["main"] for name in SUITES["transfer"] + SUITES["sentglue"]}
  ours["MRPC f1"] = res["tasks"]["MRPC"]["f1"]
  gaps = {name: abs(ours[name] - sk[name]) for name in ours}
  print("\n".join(f"{name:15s} harness {ours[name]:7.3f}  sklearn {sk[name]:7.3f}  gap {gaps[name]:.3f}" for name in ours))
  assert max(gaps.values()) <= _TOL, {n: g for n, g in gaps.items() if g > _TOL}
  # The hyper-parameter itself, wherever scikit-learn's choice leads the runner-up by >= 0.1 dev
  # points (a few dev rows; closer calls may flip with the float32 fit, as MPQA's exact tie does).
  # The figures alone hardly move when C is chosen on the test fold (C matters little here).
  for name, picks in chosen.items():
    task = res["tasks"][name]
    ours_c = task.get("c_per_fold") or [task.get("c", task.get("alpha"))]
    assert len(ours_c) == len(picks), name
    for fold, ((c, lead), c_ours) in enumerate(zip(picks, ours_c)):
      print(f"{name:15s} fold {fold}: sklearn {c:g} (lead {lead:.2f})  harness {c_ours:g}")
      assert lead < 0.1 or c == c_ours, (name, fold, c, lead, c_ours)
