"""The batched classifiers and SentEval's protocols, cross-checked against scikit-learn."""

import numpy as np
import pytest
from scipy import stats
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GridSearchCV, LeaveOneOut, StratifiedKFold, cross_val_predict

from st5_jax.evaluation import linear, sentglue, transfer

EXACT = dict(dtype=np.float64, tol=1e-10)  # converge fully so that scikit-learn can be matched


def _sk(c):
  return LogisticRegression(C=c, tol=1e-12, max_iter=100000)


def _noisy(n, d, k, seed):
  """Linear classes with label noise: not separable, so C matters."""
  rng = np.random.default_rng(seed)
  x_NxD = rng.normal(size=(n, d))
  y_N = np.argmax(x_NxD @ rng.normal(size=(d, k)) + rng.gumbel(size=(n, k)) * 1.5, axis=1)
  return x_NxD + 0.3, y_N  # off-centre, as raw embeddings are


@pytest.mark.parametrize("k", [2, 3])
def test_fit_logistic_matches_sklearn(k):
  x_NxD, y_N = _noisy(300, 7, k, seed=k)
  rng = np.random.default_rng(0)
  masks_PxN = rng.random((4, 300)) < 0.8
  c_P = np.array([0.25, 1.0, 4.0, 32.0])
  fit = linear.fit_logistic(x_NxD, y_N, train_PxN=masks_PxN, c_P=c_P, **EXACT)
  assert fit.converged_P.all()
  for p in range(4):
    ref = _sk(c_P[p]).fit(x_NxD[masks_PxN[p]], y_N[masks_PxN[p]])
    np.testing.assert_allclose(fit.coef_PxFxK[p], ref.coef_.T, atol=2e-6)
    np.testing.assert_allclose(fit.intercept_PxK[p], ref.intercept_, atol=2e-6)
    np.testing.assert_array_equal(fit.predict(x_NxD)[:, p], ref.predict(x_NxD))


def test_fit_logistic_float32_and_warm_start_agree():
  x_NxD, y_N = _noisy(500, 10, 2, seed=7)
  masks_PxN = np.random.default_rng(1).random((3, 500)) < 0.9
  exact = linear.fit_logistic(x_NxD, y_N, train_PxN=masks_PxN, c_P=2.0, **EXACT)
  fast = linear.fit_logistic(x_NxD, y_N, train_PxN=masks_PxN, c_P=2.0)  # float32 default
  np.testing.assert_allclose(fast.coef_PxFxK, exact.coef_PxFxK, atol=2e-3)
  agree = np.mean(fast.predict(x_NxD) == exact.predict(x_NxD))
  assert agree >= 0.995
  warm = linear.fit_logistic(x_NxD, y_N, train_PxN=masks_PxN, c_P=2.0, init_PxF1xK=exact.theta_PxF1xK, **EXACT)
  np.testing.assert_allclose(warm.coef_PxFxK, exact.coef_PxFxK, atol=1e-6)
  assert warm.n_iter_P.max() <= 2  # already at the optimum


def test_ridge_loo_matches_sklearn_refits():
  rng = np.random.default_rng(3)
  x_NxD = rng.normal(size=(40, 9)) + 1.0
  y_N = x_NxD @ rng.normal(size=9) + rng.normal(size=40)
  alphas = [0.1, 10.0]
  coef, intercept, loo = linear.ridge_loo(x_NxD, y_N, alphas_A=alphas)
  for a, alpha in enumerate(alphas):
    ref = Ridge(alpha=alpha).fit(x_NxD, y_N)
    np.testing.assert_allclose(coef[a], ref.coef_, atol=1e-9)
    assert intercept[a] == pytest.approx(ref.intercept_, abs=1e-9)
    # Leave-one-out by brute force: 40 refits without row i.
    brute = [Ridge(alpha=alpha).fit(np.delete(x_NxD, i, 0), np.delete(y_N, i)).predict(x_NxD[i:i + 1])[0]
             for i in range(40)]
    np.testing.assert_allclose(loo[a], brute, atol=1e-8)


# ------------------------------------------------------------ SentEval protocols


def _senteval_inner_kfold(x, y, kfold, grid):
  """senteval/tools/validation.py InnerKFoldClassifier (sklearn branch), re-typed."""
  skf = StratifiedKFold(n_splits=kfold, shuffle=True, random_state=1111)
  innerskf = StratifiedKFold(n_splits=kfold, shuffle=True, random_state=1111)
  dev, test, chosen = [], [], []
  for tr, te in skf.split(x, y):
    scores = []
    for c in grid:
      regscores = [_sk(c).fit(x[tr][itr], y[tr][itr]).score(x[tr][ite], y[tr][ite])
                   for itr, ite in innerskf.split(x[tr], y[tr])]
      scores.append(round(100 * np.mean(regscores), 2))
    best = int(np.argmax(scores))
    chosen.append(grid[best])
    dev.append(scores[best])
    test.append(100 * _sk(grid[best]).fit(x[tr], y[tr]).score(x[te], y[te]))
  return np.mean(dev), np.mean(test), chosen


def test_inner_kfold_matches_senteval_loop():
  x, y = _noisy(240, 6, 2, seed=11)
  ours = transfer.inner_kfold(x, y, kfold=3, **EXACT)
  dev, test, chosen = _senteval_inner_kfold(x, y, 3, transfer.C_INNER_KFOLD)
  assert ours["c_per_fold"] == chosen
  assert ours["devacc"] == pytest.approx(dev)
  assert ours["acc"] == pytest.approx(test)
  assert ours["fits"] == 3 * 6 * (3 + 1) + 6 and ours["converged"]


@pytest.mark.parametrize("k", [2, 4])
def test_kfold_select_matches_gridsearchcv(k):
  x, y = _noisy(400, 6, k, seed=20 + k)
  x_te, y_te = _noisy(150, 6, k, seed=40 + k)
  ours = transfer.kfold_select(x, y, x_te, y_te, kfold=4, **EXACT)
  grid = GridSearchCV(_sk(1.0), {"C": list(transfer.C_KFOLD)},
                      cv=StratifiedKFold(n_splits=4, shuffle=True, random_state=transfer.SEED)).fit(x, y)
  assert ours["c"] == grid.best_params_["C"]
  assert ours["devscore"] == pytest.approx(round(100 * grid.best_score_, 2))
  assert ours["acc"] == pytest.approx(100 * grid.score(x_te, y_te))
  np.testing.assert_array_equal(ours["pred"], grid.predict(x_te))


def test_split_select_matches_sklearn():
  x, y = _noisy(300, 5, 2, seed=5)
  ours = transfer.split_select(x[:200], y[:200], x[200:250], y[200:250], x[250:], y[250:], **EXACT)
  dev = [round(100 * _sk(c).fit(x[:200], y[:200]).score(x[200:250], y[200:250]), 2) for c in transfer.C_INNER_KFOLD]
  best = transfer.C_INNER_KFOLD[int(np.argmax(dev))]
  assert ours["c"] == best and ours["devacc"] == pytest.approx(max(dev))
  assert ours["acc"] == pytest.approx(100 * _sk(best).fit(x[:200], y[:200]).score(x[250:], y[250:]))


def test_protocols_known_answer_on_separable_data():
  rng = np.random.default_rng(9)
  y = np.repeat([0, 1], 100)
  x = rng.normal(size=(200, 4)) + 6.0 * y[:, None]  # two blobs far apart
  assert transfer.inner_kfold(x, y, kfold=3)["acc"] == 100.0
  assert transfer.kfold_select(x, y, x[::3], y[::3], kfold=3)["acc"] == 100.0
  assert transfer.split_select(x, y, x[::2], y[::2], x[1::2], y[1::2])["acc"] == 100.0


def test_default_float32_protocol_close_to_exact():
  x, y = _noisy(600, 8, 2, seed=13)
  exact = transfer.inner_kfold(x, y, kfold=3, **EXACT)
  fast = transfer.inner_kfold(x, y, kfold=3)
  assert abs(fast["acc"] - exact["acc"]) <= 100 / 200  # at most one test row per fold flips


def test_ridge_select_picks_best_loo_alpha():
  rng = np.random.default_rng(6)
  x = rng.normal(size=(120, 6))
  y = x @ rng.normal(size=6) + rng.normal(size=120) * 2
  x_te = rng.normal(size=(100, 6))
  y_te = x_te @ np.ones(6)
  res = sentglue.ridge_select(x, y, x_te, y_te)
  loo = [stats.pearsonr(cross_val_predict(Ridge(alpha=a), x, y, cv=LeaveOneOut()), y).statistic
         for a in sentglue.RIDGE_ALPHAS]
  assert res["alpha"] == sentglue.RIDGE_ALPHAS[int(np.argmax(np.round(100 * np.array(loo), 2)))]
  ref = Ridge(alpha=res["alpha"]).fit(x, y).predict(x_te)
  assert res["pearson"] == pytest.approx(100 * stats.pearsonr(ref, y_te).statistic)
  assert res["spearman"] == pytest.approx(100 * stats.spearmanr(ref, y_te).statistic)
