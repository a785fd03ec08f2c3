"""Matryoshka embeddings: Contrastive's loss at nested dimensions against a NumPy re-derivation, its gradient,
its errors, GradCache and its gin file."""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import synthetic
from st5_jax import configs, features, gin_config, losses, partitioning
from st5_jax.gin_config import parse_gin
from st5_jax.objectives import Contrastive, ObjectiveConfigError, contrastive
from st5_jax.checkpoints import tree

DIMS, WEIGHTS = (64, 16, 8), (1.0, 0.5, 0.25)
NEGATIVES = [features.RIGHT_NEG, f"{features.RIGHT_NEG}_1"]  # K = 2 hard negatives a query


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def numpy_in_batch(q, p, negs, *, tau, bidirectional, smoothing=0.0, hard_negative_weight=0.0):
  """Eq. 14 with K negatives (each query against every positive and negative of the batch), written out."""
  B = len(q)

  def xent(logits):
    logz = np.log(np.sum(np.exp(logits - logits.max(1, keepdims=True)), 1)) + logits.max(1)
    target = np.eye(B, logits.shape[1]) * (1 - smoothing) + smoothing / logits.shape[1]
    return np.mean(-np.sum(target * (logits - logz[:, None]), 1))

  logits = np.concatenate([p] + negs) @ q.T
  logits = logits.T / tau
  for k in range(len(negs)):  # SimCSE: query i's own negatives
    logits[np.arange(B), B + k * B + np.arange(B)] += hard_negative_weight
  loss = xent(logits)
  if bidirectional:
    loss = 0.5 * (loss + xent(p @ q.T / tau))
  return loss


def numpy_matryoshka(q, p, negs, dims, weights, **kw):
  """sum_i w_i * loss(first d_i dims of every embedding, re-normalised)."""
  cut = lambda x, d: _unit(x[:, :d])  # noqa: E731
  return sum(w * numpy_in_batch(cut(q, d), cut(p, d), [cut(n, d) for n in negs], **kw) for d, w in zip(dims, weights))


def _embeddings(rng, B=12, D=64):
  """Unnormalised embeddings (the loss must re-normalise each cut), positives loosely tied to their queries."""
  q = rng.normal(size=(B, D))
  return {features.LEFT: q, features.RIGHT: q + 2.0 * rng.normal(size=(B, D)),
          **{s: rng.normal(size=(B, D)) for s in NEGATIVES}}


@pytest.mark.parametrize("objective,numpy_kw", [
    (Contrastive(temperature=0.05, bidirectional=True, num_negatives=2, matryoshka_dims=DIMS,
                 matryoshka_weights=WEIGHTS), dict(tau=0.05, bidirectional=True)),
    (Contrastive(loss="simcse", temperature=0.07, hard_negative_weight=0.6, label_smoothing=0.1, num_negatives=2,
                 matryoshka_dims=(32, 8), matryoshka_weights=(0.3, 2.0)),
     dict(tau=0.07, bidirectional=False, smoothing=0.1, hard_negative_weight=0.6)),
])
def test_loss_matches_numpy_at_nested_dims_with_hard_negatives(objective, numpy_kw):
  emb = _embeddings(np.random.default_rng(0))
  dims, weights = zip(*objective.matryoshka())
  want = numpy_matryoshka(emb[features.LEFT], emb[features.RIGHT], [emb[s] for s in NEGATIVES], dims, weights,
                          **numpy_kw)
  got, metrics = jax.jit(lambda e: contrastive.in_batch_loss(e, NEGATIVES, objective.loss_kwargs(),
                                                             objective.matryoshka()))(
      {k: jnp.asarray(v, jnp.float32) for k, v in emb.items()})
  assert float(got) == pytest.approx(want, rel=1e-5)
  assert float(metrics["loss"]) == pytest.approx(want, rel=1e-5)
  for d in dims:  # each dimension's own (unweighted) loss
    cut = {k: _unit(v[:, :d]) for k, v in emb.items()}
    one = numpy_in_batch(cut[features.LEFT], cut[features.RIGHT], [cut[s] for s in NEGATIVES], **numpy_kw)
    assert float(metrics[f"loss_dim_{d}"]) == pytest.approx(one, rel=1e-5)


def test_gradient_matches_numpy_finite_differences():
  """d loss / d embeddings along random directions: JAX's gradient against central differences of the NumPy
  loss in float64 (through the cuts and their re-normalisation)."""
  rng = np.random.default_rng(1)
  emb = _embeddings(rng)
  obj = Contrastive(temperature=0.05, bidirectional=True, num_negatives=2, matryoshka_dims=DIMS,
                    matryoshka_weights=WEIGHTS)
  kw = dict(tau=0.05, bidirectional=True)

  def jax_loss(e):
    return contrastive.in_batch_loss(e, NEGATIVES, obj.loss_kwargs(), obj.matryoshka())[0]

  def numpy_loss(e):
    return numpy_matryoshka(e[features.LEFT], e[features.RIGHT], [e[s] for s in NEGATIVES], DIMS, WEIGHTS, **kw)

  grads = jax.jit(jax.grad(jax_loss))({k: jnp.asarray(v, jnp.float32) for k, v in emb.items()})
  eps = 1e-5
  for _ in range(3):
    direction = {k: rng.normal(size=v.shape) for k, v in emb.items()}
    plus = numpy_loss({k: v + eps * direction[k] for k, v in emb.items()})
    minus = numpy_loss({k: v - eps * direction[k] for k, v in emb.items()})
    numeric = (plus - minus) / (2 * eps)
    analytic = sum(float(np.sum(np.asarray(grads[k], np.float64) * direction[k])) for k in emb)
    assert analytic == pytest.approx(numeric, rel=2e-3, abs=1e-4)


def test_a_dimension_larger_than_the_embedding_is_a_clear_error():
  model = configs.ST5Config(t5=configs.t5_size("t5_tiny"), embedding_dim=48)
  with pytest.raises(ObjectiveConfigError, match=r"larger than the model's 48-d embeddings.*<= 48"):
    Contrastive(matryoshka_dims=(64, 32)).check(model, None)
  Contrastive(matryoshka_dims=(48, 32)).check(model, None)
  with pytest.raises(ValueError, match=r"\[64\] are larger than the embeddings' 48"):
    losses.matryoshka_loss(lambda e: (jnp.sum(e[0]), {}), [jnp.ones((2, 48))], dims=(64, 32), weights=(1.0, 1.0))


@pytest.mark.parametrize("kw,match", [
    (dict(matryoshka_dims=(64, 0)), "positive ints"),
    (dict(matryoshka_dims=(64, 32), matryoshka_weights=(1.0,)), "one weight per dimension"),
    (dict(matryoshka_weights=(1.0,)), "without Contrastive.matryoshka_dims"),
    (dict(matryoshka_dims=(64, 64)), "twice"),
    (dict(matryoshka_dims=(64,), matryoshka_weights=(-1.0,)), ">= 0"),
])
def test_bad_settings_are_refused_by_name(kw, match):
  with pytest.raises(ObjectiveConfigError, match=match):
    Contrastive(**kw)


def test_grad_cache_and_the_plain_step_agree_with_matryoshka():
  """Through the objective's own step (a tiny stand-in tower): the loss on its embeddings equals NumPy's, and
  GradCache (2 chunks) gives the plain gradient, with K = 1 hard negative and both directions."""
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  batch = jax.device_get(next(synthetic.SyntheticPairs(mesh, 8, 0, negatives=1)))
  model = synthetic.TinyTower(dim=16)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])
  obj = Contrastive(temperature=0.05, bidirectional=True, matryoshka_dims=(16, 8, 4),
                    matryoshka_weights=(1.0, 0.5, 2.0))
  results = []
  for chunks in (0, 2):
    vg = obj.make_value_and_grad(model, None, None, types.SimpleNamespace(grad_cache_chunks=chunks))
    results.append(jax.jit(vg)(params, batch, jax.random.PRNGKey(2)))
  ((loss, _), grads), ((loss_c, _), grads_c) = results
  emb = {k: np.asarray(model.apply({"params": params}, v), np.float64) for k, v in batch.items()}
  want = numpy_matryoshka(emb[features.LEFT], emb[features.RIGHT], [emb[features.RIGHT_NEG]], (16, 8, 4),
                          (1.0, 0.5, 2.0), tau=0.05, bidirectional=True)
  assert float(loss) == pytest.approx(want, rel=1e-5)
  assert float(loss_c) == pytest.approx(want, rel=1e-5)
  flat, flat_c = tree.flatten(grads), tree.flatten(grads_c)
  assert any(np.abs(v).max() > 1e-4 for v in flat.values())
  for k in flat:
    np.testing.assert_allclose(flat_c[k], flat[k], atol=1e-6, rtol=1e-4, err_msg=k)


def test_the_gin_file_turns_it_on_for_a_run_and_checks_its_dims():
  parse_gin(["st5_tiny_cpu.gin", "objectives/matryoshka.gin"], [])
  spec = gin_config.run_spec()
  obj = spec.train_config.objective
  assert obj.matryoshka() == ((256, 1.0), (128, 1.0), (64, 1.0), (32, 1.0)) and obj.bidirectional
  obj.check(spec.model, spec.train_config)
  # FLOPs count the similarity logits at every cut
  lengths = dict(spec.data.feature_lengths)
  plain = Contrastive(bidirectional=True).step_flops(spec.model, global_batch_size=64, lengths=lengths)
  B, C = 64, 128
  assert obj.step_flops(spec.model, global_batch_size=64, lengths=lengths) - plain == pytest.approx(
      3 * 2 * B * C * (256 + 128 + 64 + 32 - 256))
  parse_gin(["st5_tiny_cpu.gin", "objectives/matryoshka.gin"], ["MATRYOSHKA_DIMS = (768, 64)",
                                                                "MATRYOSHKA_WEIGHTS = (1.0, 1.0)"])
  spec = gin_config.run_spec()
  with pytest.raises(ObjectiveConfigError, match="larger than the model's 256-d"):
    spec.train_config.objective.check(spec.model, spec.train_config)
