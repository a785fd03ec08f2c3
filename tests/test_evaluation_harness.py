"""`evaluate` end to end with a cheap deterministic encoder, the cache, and task plumbing."""

import math

import numpy as np
import pytest
from scipy import stats

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
  assert encoder.calls == res["meta"]["n_texts"]  # one encode per distinct text, for all tasks
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
  assert set(resolve_tasks("all")) == set(TASKS) - {"STSBenchmarkDev"}
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
