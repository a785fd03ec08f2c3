"""Correlations, scores and geometry against SciPy / scikit-learn and known answers."""

import numpy as np
import pytest
from scipy import stats
from scipy.spatial.distance import pdist
from sklearn import metrics as skm

from st5_jax.evaluation import geometry, metrics, readers, sts


@pytest.mark.parametrize("n,levels", [(7, 3), (100, 5), (1000, 1000), (2500, 11)])
def test_spearman_pearson_rankdata_match_scipy(n, levels):
  rng = np.random.default_rng(n)
  # Few levels -> many ties, as in STS gold scores (0, 0.2, ..., 5).
  gold_N = rng.integers(0, levels, n) / 2
  pred_N = gold_N + rng.normal(0, 1.5, n)
  np.testing.assert_allclose(metrics.rankdata(gold_N), stats.rankdata(gold_N))
  assert metrics.spearman(pred_N, gold_N) == pytest.approx(stats.spearmanr(pred_N, gold_N).statistic, abs=1e-12)
  assert metrics.pearson(pred_N, gold_N) == pytest.approx(stats.pearsonr(pred_N, gold_N).statistic, abs=1e-12)


def test_spearman_known_answers():
  x_N = np.random.default_rng(0).normal(size=50)
  assert metrics.spearman(x_N, np.exp(x_N)) == pytest.approx(1.0)  # any increasing map
  assert metrics.spearman(x_N, -x_N ** 3) == pytest.approx(-1.0)
  assert np.isnan(metrics.pearson(np.ones(5), np.arange(5.0)))  # constant side, as SciPy


def test_classification_scores_match_sklearn():
  rng = np.random.default_rng(1)
  y_N, p_N = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
  assert metrics.accuracy(y_N, p_N) == pytest.approx(skm.accuracy_score(y_N, p_N))
  assert metrics.f1_binary(y_N, p_N) == pytest.approx(skm.f1_score(y_N, p_N))
  assert metrics.matthews(y_N, p_N) == pytest.approx(skm.matthews_corrcoef(y_N, p_N))
  assert metrics.matthews(y_N, np.ones_like(y_N)) == 0.0  # empty margin, sklearn's convention


def test_cosine_and_known_answer_sts_scoring():
  rng = np.random.default_rng(2)
  a_NxD, b_NxD = rng.normal(size=(40, 8)), rng.normal(size=(40, 8))
  ref = np.sum(a_NxD * b_NxD, 1) / np.linalg.norm(a_NxD, axis=1) / np.linalg.norm(b_NxD, axis=1)
  np.testing.assert_allclose(sts.cosine(a_NxD, b_NxD), ref)
  assert sts.cosine(np.zeros((1, 3)), np.ones((1, 3)))[0] == 0.0

  # Pairs whose angle shrinks as the gold score grows: Spearman exactly 100 overall and per subset.
  scores_N = rng.permutation(np.linspace(0, 5, 60))
  angle_N = (5 - scores_N) / 5 * np.pi / 2
  u_NxD = np.tile([1.0, 0.0], (60, 1))
  v_NxD = np.stack([np.cos(angle_N), np.sin(angle_N)], 1)
  data = readers.PairScores(["a"] * 60, ["b"] * 60, scores_N, ["x", "y", "z"] * 20)
  res = sts.score_pairs(data, u_NxD, v_NxD, per_subset=True)
  assert res["spearman_all"] == pytest.approx(100.0)
  assert res["spearman_mean"] == pytest.approx(100.0)
  assert set(res["subsets"]) == {"x", "y", "z"} and res["n"] == 60


def test_sts_per_subset_mean_is_senteval_mean():
  rng = np.random.default_rng(3)
  n = 90
  subsets = ["s1"] * 20 + ["s2"] * 30 + ["s3"] * 40
  scores_N = rng.integers(0, 6, n).astype(float)
  u_NxD, v_NxD = rng.normal(size=(n, 4)), rng.normal(size=(n, 4))
  data = readers.PairScores(["a"] * n, ["b"] * n, scores_N, subsets)
  res = sts.score_pairs(data, u_NxD, v_NxD, per_subset=True)
  sims_N = sts.cosine(u_NxD, v_NxD)
  per = [stats.spearmanr(sims_N[np.array(subsets) == s], scores_N[np.array(subsets) == s]).statistic
         for s in ("s1", "s2", "s3")]
  assert res["spearman_mean"] == pytest.approx(100 * np.mean(per))
  assert res["spearman_wmean"] == pytest.approx(100 * np.average(per, weights=[20, 30, 40]))
  assert res["spearman_all"] == pytest.approx(100 * stats.spearmanr(sims_N, scores_N).statistic)


def test_alignment_uniformity_known_answers():
  x_NxD = np.random.default_rng(4).normal(size=(30, 5))
  assert geometry.alignment(x_NxD, 3 * x_NxD) == pytest.approx(0.0)  # same directions
  assert geometry.alignment(x_NxD, -x_NxD) == pytest.approx(4.0)  # antipodal unit vectors
  # An orthonormal set: every pair at squared distance 2, so log exp(-2 * 2) = -4.
  assert geometry.uniformity(np.eye(6)) == pytest.approx(-4.0)
  assert geometry.uniformity(np.array([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(-8.0)


def test_uniformity_matches_pdist_in_blocks():
  x_NxD = np.random.default_rng(5).normal(size=(257, 16))
  unit_NxD = x_NxD / np.linalg.norm(x_NxD, axis=1, keepdims=True)
  ref = np.log(np.mean(np.exp(-2 * pdist(unit_NxD, "sqeuclidean"))))
  assert geometry.uniformity(x_NxD, block=50) == pytest.approx(ref, abs=1e-10)
