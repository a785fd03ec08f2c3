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


# ----------------------------------------------------------------------------- K hard negatives per query


def numpy_k_loss_and_grads(q, p, n_BxKxD, *, tau, bidirectional=False, smoothing=0.0, cosine=False, weight=0.0):
  """Eq. 14 with K negatives per query, and its gradient w.r.t. (q, p, n), in float64.

  Query i's candidates are all B positives and all B*K negatives of the batch (B*(1+K)
  logits), `weight` added to its logits against its own K negatives; the reverse term
  scores positives against the B queries. Gradient: d xent / d logits = softmax - target.
  """
  q, p, n = (np.asarray(x, np.float64) for x in (q, p, n_BxKxD))
  B, K, _ = n.shape
  raw = (q, p, n)
  if cosine:
    q, p, n = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in raw)
  cands = [p[j] for j in range(B)] + [n[j, k] for k in range(K) for j in range(B)]  # column B + k*B + j: n[j, k]
  owner = list(range(B)) + [j for k in range(K) for j in range(B)]
  is_negative = [False] * B + [True] * (B * K)

  def xent_and_dlogits(queries, candidates, bonus):
    C = len(candidates)
    logits = np.array([[queries[i] @ c / tau for c in candidates] for i in range(len(queries))]) + bonus
    logp = logits - np.log(np.sum(np.exp(logits - logits.max(1, keepdims=True)), 1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    target = np.eye(len(queries), C) * (1 - smoothing) + smoothing / C
    loss = -np.sum(target * logp) / len(queries)
    return loss, (np.exp(logp) - target) / len(queries)

  bonus = np.array([[weight if is_negative[c] and owner[c] == i else 0.0 for c in range(B * (1 + K))]
                    for i in range(B)])
  loss, d_BxC = xent_and_dlogits(q, cands, bonus)
  scale = 0.5 if bidirectional else 1.0
  dq = scale * d_BxC @ np.stack(cands) / tau
  dc = scale * d_BxC.T @ q / tau
  dp, dn = dc[:B].copy(), np.stack([dc[B + k * B:B + (k + 1) * B] for k in range(K)], axis=1)
  loss = scale * loss
  if bidirectional:
    loss_r, dr_BxB = xent_and_dlogits(p, list(q), 0.0)
    loss += 0.5 * loss_r
    dp += 0.5 * dr_BxB @ q / tau
    dq += 0.5 * dr_BxB.T @ p / tau
  grads = [dq, dp, dn]
  if cosine:  # through x / |x|: (g - u (u . g)) / |x|
    units = (q, p, n)
    grads = [(g - u * np.sum(u * g, -1, keepdims=True)) / np.linalg.norm(x, axis=-1, keepdims=True)
             for g, u, x in zip(grads, units, raw)]
  return loss, grads


def _k_inputs(B=5, K=3, D=6, seed=11):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, D)).astype(np.float32)
  p = (q + rng.normal(size=(B, D))).astype(np.float32)  # related positives
  n = (q[:, None] + 1.5 * rng.normal(size=(B, K, D))).astype(np.float32)  # hard-ish negatives
  return q, p, n


def test_the_numpy_k_gradient_is_the_derivative_of_the_numpy_k_loss():
  """Central differences of the reference loss equal its analytic gradient (the reference checks itself)."""
  q, p, n = (x.astype(np.float64) for x in _k_inputs(B=3, K=2, D=3))
  kw = dict(tau=0.5, bidirectional=True, smoothing=0.1, cosine=True, weight=0.7)
  _, grads = numpy_k_loss_and_grads(q, p, n, **kw)
  args = [q, p, n]
  for a, g in enumerate(grads):
    numeric = np.zeros_like(g)
    for idx in np.ndindex(*g.shape):
      hi, lo = [x.copy() for x in args], [x.copy() for x in args]
      hi[a][idx] += 1e-6
      lo[a][idx] -= 1e-6
      numeric[idx] = (numpy_k_loss_and_grads(*hi, **kw)[0] - numpy_k_loss_and_grads(*lo, **kw)[0]) / 2e-6
    np.testing.assert_allclose(g, numeric, rtol=1e-5, atol=1e-7)


SETTINGS = {  # the paper's dot-product loss, and SimCSE's (cosine, hard_negative_weight), at non-default values
    "st5": dict(temperature=0.05, label_smoothing=0.1),
    "simcse": dict(temperature=0.05, label_smoothing=0.1, similarity="cosine", hard_negative_weight=0.7),
}


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_k_negatives_loss_and_gradient_match_numpy(K, bidirectional, setting):
  q, p, n = _k_inputs(K=K)
  kw = dict(SETTINGS[setting], bidirectional=bidirectional)
  cosine = kw.get("similarity") == "cosine"
  if not cosine:  # the ST5 loss reads unit vectors (the tower normalises)
    q, p = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, p))
    n = n / np.linalg.norm(n, axis=-1, keepdims=True)
  want, want_grads = numpy_k_loss_and_grads(q, p, n, tau=kw["temperature"], bidirectional=bidirectional,
                                            smoothing=kw["label_smoothing"], cosine=cosine,
                                            weight=kw.get("hard_negative_weight", 0.0))
  (got, metrics), grads = jax.value_and_grad(lambda *a: losses.in_batch_softmax_loss(*a, **kw), argnums=(0, 1, 2),
                                             has_aux=True)(q, p, n)
  assert 0.5 < want < 10  # a non-trivial value
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  for name, g, w in zip("qpn", grads, want_grads):
    assert g.shape == w.shape
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5, err_msg=name)
  # The metric: each query's mean similarity to its own K negatives.
  unit = (lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)) if cosine else (lambda x: x)
  own = np.einsum("bd,bkd->bk", unit(q), unit(n))
  assert float(metrics["hard_negative_similarity"]) == pytest.approx(own.mean(), rel=1e-5)
  # [B, K, D] and a list of K [B, D] towers are the same negatives.
  listed, _ = losses.in_batch_softmax_loss(q, p, [n[:, k] for k in range(K)], **kw)
  assert float(listed) == pytest.approx(float(got), rel=1e-6)


def test_k_negatives_logits_are_every_query_against_every_positive_and_negative():
  q, p, n = _k_inputs(B=4, K=3)
  logits = np.asarray(losses.contrastive_logits(q, p, n, temperature=0.5))
  assert logits.shape == (4, 4 * (1 + 3))
  for i in range(4):
    for j in range(4):
      assert logits[i, j] == pytest.approx(q[i] @ p[j] / 0.5, rel=1e-5)
      for k in range(3):
        assert logits[i, 4 + 4 * k + j] == pytest.approx(q[i] @ n[j, k] / 0.5, rel=1e-5)


def test_the_weight_moves_only_each_querys_own_negatives():
  """SimCSE's weight on the own K negatives: raising it raises their softmax mass, and only theirs matters."""
  q, p, n = _k_inputs(K=3)
  base = dict(temperature=0.05, similarity="cosine")
  l0, _ = losses.in_batch_softmax_loss(q, p, n, **base, hard_negative_weight=0.0)
  l1, _ = losses.in_batch_softmax_loss(q, p, n, **base, hard_negative_weight=1.0)
  assert float(l1) > float(l0)
  # Another example's negatives under the weight would change the loss: swap the owners of two rows' negatives.
  swapped = n.copy()
  swapped[[0, 1]] = n[[1, 0]]
  lw, _ = losses.in_batch_softmax_loss(q, p, swapped, **base, hard_negative_weight=1.0)
  ls, _ = losses.in_batch_softmax_loss(q, p, swapped, **base, hard_negative_weight=0.0)
  assert float(ls) == pytest.approx(float(l0), rel=1e-6)  # unweighted: the pool of candidates is the same
  assert abs(float(lw) - float(l1)) > 1e-3


# Today's values (one hard negative, before K existed), recorded from the HEAD of 2026-12 on this input.
K1_GOLDEN = {
    "st5": {"loss": 1.6666920185089111, "accuracy": 0.6666666865348816, "positive_similarity": 0.6472563743591309,
            "negative_similarity": 0.10251644253730774, "alignment": 0.7054874897003174,
            "uniformity": -2.2682690620422363, "hard_negative_similarity": -0.08967375010251999},
    "st5_bidirectional_smoothed": {
        "loss": 2.986790657043457, "accuracy": 0.6666666865348816, "positive_similarity": 0.6472563743591309,
        "negative_similarity": 0.10251644253730774, "alignment": 0.7054874897003174,
        "uniformity": -2.2682690620422363, "hard_negative_similarity": -0.08967375010251999},
    "simcse": {"loss": 2.983874797821045, "accuracy": 0.6666666865348816, "positive_similarity": 0.6472563147544861,
               "negative_similarity": 0.10251642763614655, "alignment": 0.7054874300956726,
               "uniformity": -2.2682690620422363, "hard_negative_similarity": -0.08967374265193939},
}
K1_SETTINGS = {
    "st5": dict(temperature=0.05),
    "st5_bidirectional_smoothed": dict(temperature=0.05, bidirectional=True, label_smoothing=0.1),
    "simcse": dict(temperature=0.05, bidirectional=True, label_smoothing=0.1, similarity="cosine",
                   hard_negative_weight=0.7),
}


@pytest.mark.parametrize("setting", sorted(K1_SETTINGS))
def test_one_negative_is_todays_loss_in_every_form(setting):
  rng = np.random.default_rng(40)
  q, noise, n = (rng.normal(size=(6, 8)).astype(np.float32) for _ in range(3))
  p = q + noise
  kw = K1_SETTINGS[setting]
  if kw.get("similarity") != "cosine":
    q, p, n = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (q, p, n))
  forms = {"[B, D]": n, "[B, 1, D]": n[:, None], "[[B, D]]": [n]}
  results = {name: losses.in_batch_softmax_loss(q, p, neg, **kw) for name, neg in forms.items()}
  grads = {name: jax.grad(lambda a, b, c: losses.in_batch_softmax_loss(a, b, c, **kw)[0], argnums=(0, 1, 2))(q, p, neg)
           for name, neg in forms.items()}
  for name, (loss, metrics) in results.items():
    assert {k: float(v) for k, v in metrics.items()} == pytest.approx(K1_GOLDEN[setting], rel=1e-6), name
    # The three forms are one computation: bit for bit.
    assert float(loss) == float(results["[B, D]"][0]), name
    for g, g0 in zip(grads[name][:2], grads["[B, D]"][:2]):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(g0), err_msg=name)
    np.testing.assert_array_equal(np.asarray(grads[name][2]).reshape(6, 8), np.asarray(grads["[B, D]"][2]), name)


def test_k_negatives_span_the_global_batch_on_a_mesh():
  """[B, K, D] negatives sharded over the batch axes: every query still sees all B*K of them."""
  mesh = partitioning.make_mesh(partitioning.MeshConfig(4, 2, 1))
  B, K = 16, 3
  q, p, n = _k_inputs(B=B, K=K, D=8)
  sharding = NamedSharding(mesh, P(partitioning.BATCH_AXES))
  qs, ps, ns = (jax.device_put(x, sharding) for x in (q, p, n))
  with jax.set_mesh(mesh):
    logits, loss = jax.jit(lambda a, b, c: (losses.contrastive_logits(a, b, c, temperature=0.1),
                                            losses.in_batch_softmax_loss(a, b, c, temperature=0.1)[0]))(qs, ps, ns)
  want = np.concatenate([q @ p.T] + [q @ n[:, k].T for k in range(K)], 1) / 0.1
  np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(float(loss), numpy_k_loss_and_grads(q, p, n, tau=0.1)[0], rtol=1e-5)


def test_bad_negatives_are_a_clear_error():
  q, p, n = _k_inputs(K=2)
  with pytest.raises(ValueError, match=r"\[B, D\] or \[B, K, D\]"):
    losses.in_batch_softmax_loss(q, p, n[None])
  with pytest.raises(ValueError, match="pass None"):
    losses.in_batch_softmax_loss(q, p, [])
