"""Contrastive loss against a NumPy re-derivation of the paper's eqs. 13-15."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from st5_jax import losses, partitioning


def _unit(rng, n, d):
  x = rng.normal(size=(n, d))
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def numpy_loss(q, p, n=None, tau=0.01, bidirectional=False, smoothing=0.0):
  """Eq. 13 (n None) / eq. 14, written out term by term."""
  B = len(q)

  def one_direction(queries, pos, neg):
    total = 0.0
    for i in range(B):
      cands = [pos[j] for j in range(B)] + ([neg[j] for j in range(B)] if neg is not None else [])
      logits = np.array([queries[i] @ c / tau for c in cands], np.float64)
      logz = np.log(np.sum(np.exp(logits - logits.max()))) + logits.max()
      logp = logits - logz
      target = np.zeros(len(cands))
      target[i] = 1.0
      target = target * (1 - smoothing) + smoothing / len(cands)
      total += -np.sum(target * logp)
    return total / B

  loss = one_direction(q, p, n)
  if bidirectional:
    loss = 0.5 * (loss + one_direction(p, q, None))
  return loss


@pytest.mark.parametrize("hard_negatives", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("tau", [0.01, 0.07])  # the paper's, and another: both directions must use it
def test_loss_matches_numpy(hard_negatives, bidirectional, smoothing, tau):
  rng = np.random.default_rng(0)
  q, p, n = _unit(rng, 12, 16), _unit(rng, 12, 16), _unit(rng, 12, 16)
  p = (q + 3.0 * p) / np.linalg.norm(q + 3.0 * p, axis=1, keepdims=True)  # loosely related positives
  assert numpy_loss(q, p) > 1.0  # a non-trivial value to compare
  want = numpy_loss(q, p, n if hard_negatives else None, tau, bidirectional, smoothing)
  got, metrics = losses.in_batch_softmax_loss(q, p, n if hard_negatives else None, temperature=tau,
                                              bidirectional=bidirectional, label_smoothing=smoothing)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  assert float(metrics["loss"]) == pytest.approx(want, rel=1e-5)


def test_metrics_match_numpy():
  rng = np.random.default_rng(1)
  q, p, n = _unit(rng, 10, 8), _unit(rng, 10, 8), _unit(rng, 10, 8)
  _, m = losses.in_batch_softmax_loss(q, p, n, temperature=0.05)
  sims = q @ p.T
  logits = np.concatenate([sims, q @ n.T], 1)
  assert float(m["accuracy"]) == pytest.approx(np.mean(np.argmax(logits, 1) == np.arange(10)))
  assert float(m["positive_similarity"]) == pytest.approx(np.mean(np.diag(sims)), rel=1e-5)
  assert float(m["negative_similarity"]) == pytest.approx(sims[~np.eye(10, dtype=bool)].mean(), rel=1e-5)
  assert float(m["hard_negative_similarity"]) == pytest.approx(np.mean(np.sum(q * n, 1)), rel=1e-5)
  # eq. 15 with squared distances (Wang & Isola's alpha=2, t=2)
  assert float(m["alignment"]) == pytest.approx(np.mean(np.sum((q - p) ** 2, 1)), rel=1e-5)
  x = np.concatenate([q, p])
  d2 = np.sum((x[:, None] - x[None]) ** 2, -1)
  off = ~np.eye(20, dtype=bool)
  assert float(m["uniformity"]) == pytest.approx(np.log(np.mean(np.exp(-2 * d2[off]))), rel=1e-5)


def test_perfect_embeddings_have_low_loss_and_full_accuracy():
  rng = np.random.default_rng(2)
  q = _unit(rng, 8, 32)
  loss, m = losses.in_batch_softmax_loss(q, q, _unit(rng, 8, 32), temperature=0.01)
  assert float(loss) < 1e-3 and float(m["accuracy"]) == 1.0


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (4, 2, 1), (2, 1, 4)])
def test_logits_span_the_global_batch_on_a_mesh(mesh_shape):
  """Each query sees every positive and hard negative of all devices: logits are [B, 2B] global."""
  assert jax.device_count() == 8
  mesh = partitioning.make_mesh(partitioning.MeshConfig(*mesh_shape))
  rng = np.random.default_rng(3)
  B = 16
  q, p, n = (_unit(rng, B, 8) for _ in range(3))
  sharding = NamedSharding(mesh, P(partitioning.BATCH_AXES))
  qs, ps, ns = (jax.device_put(x, sharding) for x in (q, p, n))
  assert len(qs.addressable_shards) == 8 and qs.addressable_shards[0].data.shape[0] == B // (mesh_shape[0] * mesh_shape[1])

  @jax.jit
  def f(q_, p_, n_):
    logits = losses.contrastive_logits(q_, p_, n_, temperature=0.01)
    return logits, losses.in_batch_softmax_loss(q_, p_, n_)[0]

  with jax.set_mesh(mesh):
    logits, loss = f(qs, ps, ns)
  assert logits.shape == (B, 2 * B)
  np.testing.assert_allclose(np.asarray(logits), np.concatenate([q @ p.T, q @ n.T], 1) / 0.01, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(float(loss), numpy_loss(q, p, n), rtol=1e-5)
