"""GradCache gives the full-batch gradient (fp32, 1e-5) with chunked backward passes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import synthetic
from st5_jax import configs, grad_cache, losses, optim, partitioning, train
from st5_jax.checkpoints import tree
from st5_jax.model import SentenceT5

CFG = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)


def _full_grad(model, params, batch, loss_kw):
  def loss_fn(p):
    e = {k: model.apply({"params": p}, v) for k, v in batch.items()}
    return losses.in_batch_softmax_loss(e[train.LEFT], e[train.RIGHT], e.get(train.RIGHT_NEG), **loss_kw)
  return jax.value_and_grad(loss_fn, has_aux=True)(params)


@pytest.mark.parametrize("chunks,negatives,bidirectional", [(4, True, False), (2, False, True), (8, True, True)])
def test_grad_cache_equals_full_batch_gradient(chunks, negatives, bidirectional):
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  batch = jax.device_get(next(synthetic.SyntheticPairs(mesh, 16, 0, negatives=negatives)))
  model = SentenceT5(CFG)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])
  loss_kw = dict(temperature=0.01, bidirectional=bidirectional, label_smoothing=0.0)
  (loss, metrics), grads = jax.jit(lambda p, b: _full_grad(model, p, b, loss_kw))(params, batch)
  (loss_c, metrics_c), grads_c = jax.jit(
      lambda p, b: grad_cache.value_and_grad(train.make_embed_fn(model), p, b, jax.random.PRNGKey(1),
                                             chunks=chunks, loss_kw=loss_kw)
  )(params, batch)
  assert float(loss_c) == pytest.approx(float(loss), rel=1e-5)
  for k in metrics:
    assert float(metrics_c[k]) == pytest.approx(float(metrics[k]), rel=1e-5, abs=1e-6), k
  flat, flat_c = tree.flatten(grads), tree.flatten(grads_c)
  for k in flat:
    np.testing.assert_allclose(flat_c[k], flat[k], atol=1e-5, rtol=1e-5, err_msg=k)


def test_train_step_with_grad_cache_on_a_mesh_matches_plain_step():
  mesh = partitioning.make_mesh(partitioning.MeshConfig(4, 2, 1))
  results = []
  for chunks in (0, 4):
    tc = train.TrainConfig(num_train_steps=4, global_batch_size=32, grad_cache_chunks=chunks,
                           optimizer=optim.OptimizerConfig(learning_rate=1e-2, epsilon1=1e-6))
    setup = train.build(CFG, tc, mesh)
    with jax.set_mesh(mesh):
      state = train.init_state(setup, CFG, seed=0)
      it = synthetic.SyntheticPairs(mesh, 32, 0)
      for _ in range(2):
        state, m = setup.step_fn(state, next(it))
    results.append((jax.device_get(m), tree.flatten(jax.device_get(state.params))))
  (m0, p0), (m1, p1) = results
  assert float(m1["loss"]) == pytest.approx(float(m0["loss"]), rel=1e-5)
  for k in p0:
    np.testing.assert_allclose(p1[k], p0[k], atol=2e-5, rtol=1e-4, err_msg=k)


def test_indivisible_chunks_are_an_error():
  with pytest.raises(ValueError, match="not divisible into 3 chunks"):
    grad_cache._split(jnp.zeros((16, 4)), 3)
