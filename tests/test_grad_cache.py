"""GradCache gives the full-batch gradient (fp32, 1e-5) with chunked backward passes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import synthetic
from st5_jax import configs, features, losses, optim, partitioning, train
from st5_jax.objectives import contrastive, grad_cache
from st5_jax.checkpoints import tree
from st5_jax.model import SentenceT5

CFG = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)


def _negatives(e, K):
  """The K negative towers' embeddings as [B, K, D] (None without negatives)."""
  names = [m for _, m in features.negative_features(K)] if K else []
  return jnp.stack([e[m] for m in names], axis=1) if names else None


def _full_grad(model, params, batch, loss_kw, K=1):
  def loss_fn(p):
    e = {k: model.apply({"params": p}, v) for k, v in batch.items()}
    negatives = _negatives(e, K if features.RIGHT_NEG in batch else 0)
    return losses.in_batch_softmax_loss(e[features.LEFT], e[features.RIGHT], negatives, **loss_kw)
  return jax.value_and_grad(loss_fn, has_aux=True)(params)


# K = 3 hard negatives per query with SimCSE's hard-negative weight and label smoothing (the
# loss couples every tower): five towers, each chunked and back-propagated on its own.
SIMCSE_KW = dict(temperature=0.05, similarity="cosine", hard_negative_weight=0.7, label_smoothing=0.1)


@pytest.mark.parametrize("chunks,negatives,bidirectional,simcse", [
    (4, True, False, False), (2, False, True, False), (8, True, True, False), (4, 3, True, True)])
def test_grad_cache_equals_full_batch_gradient(chunks, negatives, bidirectional, simcse):
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  batch = jax.device_get(next(synthetic.SyntheticPairs(mesh, 16, 0, negatives=negatives)))
  K = int(negatives) or 1
  assert sum(k.startswith(features.RIGHT_NEG) for k in batch) == int(negatives)
  model = SentenceT5(CFG)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])
  loss_kw = dict(temperature=0.01, bidirectional=bidirectional, label_smoothing=0.0)
  if simcse:
    loss_kw.update(SIMCSE_KW)
  (loss, metrics), grads = jax.jit(lambda p, b: _full_grad(model, p, b, loss_kw, K))(params, batch)
  (loss_c, metrics_c), grads_c = jax.jit(
      lambda p, b: contrastive.grad_cache_value_and_grad(contrastive.make_embed_fn(model), p, b, jax.random.PRNGKey(1),
                                                         chunks=chunks, loss_kw=loss_kw, num_negatives=K)
  )(params, batch)
  assert float(loss_c) == pytest.approx(float(loss), rel=1e-5)
  for k in metrics:
    assert float(metrics_c[k]) == pytest.approx(float(metrics[k]), rel=1e-5, abs=1e-6), k
  flat, flat_c = tree.flatten(grads), tree.flatten(grads_c)
  for k in flat:
    np.testing.assert_allclose(flat_c[k], flat[k], atol=1e-5, rtol=1e-5, err_msg=k)


@pytest.mark.parametrize("K", [1, 3])
def test_train_step_with_grad_cache_on_a_mesh_matches_plain_step(K):
  mesh = partitioning.make_mesh(partitioning.MeshConfig(4, 2, 1))
  results = []
  for chunks in (0, 4):
    tc = train.TrainConfig(num_train_steps=4, global_batch_size=32, grad_cache_chunks=chunks,
                           optimizer=optim.OptimizerConfig(learning_rate=1e-2, epsilon1=1e-6),
                           objective=contrastive.Contrastive(num_negatives=K))
    setup = train.build(CFG, tc, mesh)
    with jax.set_mesh(mesh):
      state = train.init_state(setup, CFG, seed=0)
      it = synthetic.SyntheticPairs(mesh, 32, 0, negatives=K)
      for _ in range(2):
        state, m = setup.step_fn(state, next(it))
    results.append((jax.device_get(m), tree.flatten(jax.device_get(state.params))))
  (m0, p0), (m1, p1) = results
  assert float(m1["loss"]) == pytest.approx(float(m0["loss"]), rel=1e-5)
  for k in p0:
    np.testing.assert_allclose(p1[k], p0[k], atol=2e-5, rtol=1e-4, err_msg=k)


@pytest.mark.parametrize("K", [1, 3])
def test_grad_cache_with_dropout_equals_the_gradient_of_its_masks(K):
  """With dropout, GradCache's gradient is that of the chunked forward pass with the same masks.

  The reference differentiates the loss of the embeddings each chunk gets with its dropout key
  (what step 1 computes) straight through: steps 1 and 3 must draw the same masks. Every
  tower has its own key, the K negative towers too (split(key, 2 + K)).
  """
  cfg = CFG.replace(t5=CFG.t5.replace(dropout_rate=0.3))
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  batch = jax.device_get(next(synthetic.SyntheticPairs(mesh, 8, 0, negatives=K)))
  model = SentenceT5(cfg)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])
  loss_kw = dict(temperature=0.01, bidirectional=False, label_smoothing=0.0)
  embed, key, chunks = contrastive.make_embed_fn(model), jax.random.PRNGKey(3), 2
  sides = [features.LEFT, features.RIGHT] + [m for _, m in features.negative_features(K)]

  def chunked_loss(p):
    e = {}
    for s, k in zip(sides, jax.random.split(key, len(sides))):
      rows = [embed(p, batch[s][c::chunks], ck) for c, ck in enumerate(jax.random.split(k, chunks))]
      e[s] = jnp.stack(rows, axis=1).reshape(batch[s].shape[0], -1)  # interleave back: row c + chunks * i
    return losses.in_batch_softmax_loss(e[features.LEFT], e[features.RIGHT], _negatives(e, K), **loss_kw)

  (loss, _), grads = jax.jit(jax.value_and_grad(chunked_loss, has_aux=True))(params)
  (loss_c, _), grads_c = jax.jit(lambda p: contrastive.grad_cache_value_and_grad(
      embed, p, batch, key, chunks=chunks, loss_kw=loss_kw, num_negatives=K))(params)
  (loss_det, _), _ = jax.jit(lambda p: _full_grad(model, p, batch, loss_kw, K))(params)
  assert abs(float(loss) - float(loss_det)) > 1e-3  # the dropout is really on
  assert float(loss_c) == pytest.approx(float(loss), rel=1e-5)
  flat, flat_c = tree.flatten(grads), tree.flatten(grads_c)
  for k in flat:
    np.testing.assert_allclose(flat_c[k], flat[k], atol=1e-5, rtol=1e-4, err_msg=k)


def test_indivisible_chunks_are_an_error():
  with pytest.raises(ValueError, match="not divisible into 3 chunks"):
    grad_cache.split(jnp.zeros((16, 4)), 3)
