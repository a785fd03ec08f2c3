"""contrastive.embed_towers: one forward for every tower of the same shape equals one forward per tower."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import synthetic
from st5_jax import configs, features, flops, losses, partitioning, train
from st5_jax.objectives import contrastive
from st5_jax.model.st5 import SentenceT5, abstract_params

CFG = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)


_tokens = synthetic.eos_padded_tokens


@pytest.mark.parametrize("lengths", [(12, 12, 12), (8, 12, 12), (12, 12, None)])
def test_embed_towers_equals_one_forward_per_tower(lengths):
  B = 16
  sides = [features.LEFT, features.RIGHT, features.RIGHT_NEG]
  batch = {s: _tokens(B, L, i) for i, (s, L) in enumerate(zip(sides, lengths)) if L}
  mesh = partitioning.make_mesh(partitioning.MeshConfig())  # 8 fake devices: batch-sharded
  model = SentenceT5(CFG)
  boxed = abstract_params(CFG)
  embed = contrastive.make_embed_fn(model, boxed)
  params = jax.jit(lambda k: model.init(k, jnp.ones((1, 8), jnp.int32))["params"])(jax.random.PRNGKey(0))
  params = jax.tree.map(lambda x: x.value if hasattr(x, "value") else x, params,
                        is_leaf=lambda x: hasattr(x, "value"))

  def both(p, b):
    with partitioning.with_rules(partitioning.DEFAULT_RULES):
      fused = contrastive.embed_towers(embed, p, b, jax.random.PRNGKey(1))
      single = {s: embed(p, t, jax.random.PRNGKey(2)) for s, t in b.items()}
      loss_f = losses.in_batch_softmax_loss(fused[features.LEFT], fused[features.RIGHT], fused.get(features.RIGHT_NEG))[0]
      loss_s = losses.in_batch_softmax_loss(single[features.LEFT], single[features.RIGHT], single.get(features.RIGHT_NEG))[0]
      return fused, single, loss_f, loss_s

  shard = partitioning.batch_sharding(mesh)
  with jax.set_mesh(mesh):
    dev = {s: jax.device_put(t, shard) for s, t in batch.items()}
    fused, single, loss_f, loss_s = jax.jit(both)(params, dev)
  assert set(fused) == set(batch)
  for s in batch:
    assert fused[s].shape == (B, 16)
    np.testing.assert_allclose(np.asarray(fused[s]), np.asarray(single[s]), atol=2e-6, err_msg=s)
  np.testing.assert_allclose(float(loss_f), float(loss_s), rtol=1e-5)
  # The towers really differ (a mix-up of rows or sides would show above).
  assert not np.allclose(np.asarray(single[features.LEFT]), np.asarray(single[features.RIGHT]), atol=1e-3)


def test_embed_towers_moves_no_data_between_devices():
  """Stacking on axis 1 keeps every device's rows local: the fused forward adds no collectives."""
  B, L = 16, 12
  mesh = partitioning.make_mesh(partitioning.MeshConfig())
  model = SentenceT5(CFG)
  embed = contrastive.make_embed_fn(model, abstract_params(CFG))
  params_abs = jax.eval_shape(lambda: jax.tree.map(
      lambda x: x.value if hasattr(x, "value") else x, model.init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))[
          "params"], is_leaf=lambda x: hasattr(x, "value")))
  toks = {s: jax.ShapeDtypeStruct((B, L), jnp.int32, sharding=partitioning.batch_sharding(mesh))
          for s in (features.LEFT, features.RIGHT, features.RIGHT_NEG)}
  rep = partitioning.replicated(mesh)
  params_abs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), params_abs)

  def fwd(p, b):
    with partitioning.with_rules(partitioning.DEFAULT_RULES):
      e = contrastive.embed_towers(embed, p, b, jax.random.PRNGKey(0))
      return jnp.stack([e[s] for s in b], axis=1)  # [B, 3, D], batch-sharded like the inputs

  with jax.set_mesh(mesh):
    hlo = jax.jit(fwd, out_shardings=partitioning.batch_sharding(mesh)).lower(params_abs, toks).compile().as_text()
  for collective in ("all-to-all", "all-gather", "collective-permute", "all-reduce"):
    assert collective not in hlo, collective


def test_step_gradients_equal_one_forward_per_tower():
  B = 8
  batch = {s: jnp.asarray(_tokens(B, 10, i)) for i, s in enumerate((features.LEFT, features.RIGHT, features.RIGHT_NEG))}
  model = SentenceT5(CFG)
  embed = contrastive.make_embed_fn(model)
  params = jax.tree.map(lambda x: x.value if hasattr(x, "value") else x,
                        model.init(jax.random.PRNGKey(3), jnp.ones((1, 8), jnp.int32))["params"],
                        is_leaf=lambda x: hasattr(x, "value"))

  def fused(p):
    e = contrastive.embed_towers(embed, p, batch, jax.random.PRNGKey(0))
    return losses.in_batch_softmax_loss(e[features.LEFT], e[features.RIGHT], e[features.RIGHT_NEG])[0]

  def separate(p):
    e = {s: embed(p, t, jax.random.PRNGKey(0)) for s, t in batch.items()}
    return losses.in_batch_softmax_loss(e[features.LEFT], e[features.RIGHT], e[features.RIGHT_NEG])[0]

  g_fused, g_sep = jax.jit(jax.grad(fused))(params), jax.jit(jax.grad(separate))(params)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_fused), jax.tree.leaves(g_sep)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


# ----------------------------------------------------------------------------- K hard negatives per query


def _k_batch(B, K, lengths):
  sides = [features.LEFT, features.RIGHT] + [m for _, m in features.negative_features(K)]
  return {s: jnp.asarray(_tokens(B, L, i)) for i, (s, L) in enumerate(zip(sides, lengths))}


def test_k_negative_towers_of_one_length_go_through_as_one_forward():
  """With K = 3, the positives and the three negatives (one length) are one forward of 4B rows."""
  B, K = 8, 3
  batch = _k_batch(B, K, [6, 10, 10, 10, 10])
  calls = []
  model = SentenceT5(CFG)
  inner = contrastive.make_embed_fn(model)

  def embed(p, tokens, key):
    calls.append(tuple(tokens.shape))
    return inner(p, tokens, key)

  params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"]
  e = contrastive.embed_towers(embed, params, batch, jax.random.PRNGKey(1))
  assert calls == [(B, 6), ((1 + K) * B, 10)]
  assert set(e) == set(batch) and all(v.shape == (B, 16) for v in e.values())


def test_k_negatives_step_gradient_equals_one_forward_per_tower():
  """Contrastive(num_negatives=3)'s step: loss and gradient of every tower apart, negatives as [B, K, D]."""
  B, K = 8, 3
  batch = _k_batch(B, K, [10] * (2 + K))
  obj = contrastive.Contrastive(num_negatives=K, loss="simcse", hard_negative_weight=0.5, temperature=0.05,
                                bidirectional=True)
  model = SentenceT5(CFG)
  params = jax.tree.map(lambda x: x.value if hasattr(x, "value") else x,
                        model.init(jax.random.PRNGKey(3), jnp.ones((1, 8), jnp.int32))["params"],
                        is_leaf=lambda x: hasattr(x, "value"))
  tc = train.TrainConfig(num_train_steps=1, global_batch_size=B, objective=obj)
  (loss, _), grads = jax.jit(obj.make_value_and_grad(model, None, CFG, tc))(params, batch, jax.random.PRNGKey(0))

  def separate(p):
    e = {s: model.apply({"params": p}, t) for s, t in batch.items()}
    negatives_BxKxD = jnp.stack([e[m] for _, m in features.negative_features(K)], axis=1)
    return losses.in_batch_softmax_loss(e[features.LEFT], e[features.RIGHT], negatives_BxKxD, **obj.loss_kwargs())[0]

  want, g_sep = jax.jit(jax.value_and_grad(separate))(params)
  assert float(loss) == pytest.approx(float(want), rel=1e-5)
  # Three negatives are really read: the loss without the last two differs.
  e = {s: model.apply({"params": params}, t) for s, t in batch.items()}
  one = losses.in_batch_softmax_loss(e[features.LEFT], e[features.RIGHT], e[features.RIGHT_NEG], **obj.loss_kwargs())[0]
  assert abs(float(one) - float(loss)) > 1e-3
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(g_sep)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_k_negatives_features_and_flops():
  obj = contrastive.Contrastive(num_negatives=3)
  lengths = {"inputs": 16, "targets": 12, "negative_targets": 12, "negative_targets_2": 8}
  declared = {k: f.shape(4, lengths) for k, f in obj.features(lengths).items()}
  neg = features.RIGHT_NEG
  assert declared == {features.LEFT: (4, 16), features.RIGHT: (4, 12), neg: (4, 12), f"{neg}_1": (4, 12),
                      f"{neg}_2": (4, 8)}  # negative_targets_1 takes the negative_targets length
  towers = sum(4 * flops.encoder_forward_flops(CFG, L) for L in (16, 12, 12, 12, 8))
  # Every tower, and the logits [B, B(1+K)] = [4, 16].
  assert obj.step_flops(CFG, global_batch_size=4, lengths=lengths) == 3.0 * (towers + 2 * 4 * 16 * CFG.output_dim)
  # K = 1 is today's count; without a negative length, no negative tower.
  one = contrastive.Contrastive()
  three_towers = {"inputs": 16, "targets": 12, "negative_targets": 12}
  assert one.step_flops(CFG, global_batch_size=4, lengths=three_towers) == 3.0 * (
      sum(4 * flops.encoder_forward_flops(CFG, L) for L in (16, 12, 12)) + 2 * 4 * 8 * CFG.output_dim)
  assert set(one.features({"inputs": 16, "targets": 12})) == {features.LEFT, features.RIGHT}


@pytest.mark.parametrize("bad", [0, -1, 65, True, 2.0])
def test_a_bad_number_of_negatives_is_one_clear_line(bad):
  from st5_jax.objectives import ObjectiveConfigError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ObjectiveConfigError, match=r"Contrastive.num_negatives must be an int in 1\.\.64") as e:
    contrastive.Contrastive(num_negatives=bad)
  assert "\n" not in str(e.value)


def test_k_negatives_without_their_length_or_in_the_batch_are_clear_errors():
  from st5_jax.objectives import ObjectiveConfigError  # pylint: disable=g-import-not-at-top
  obj = contrastive.Contrastive(num_negatives=3)
  with pytest.raises(ObjectiveConfigError, match="needs a 'negative_targets' length"):
    obj.required_lengths({"inputs": 8, "targets": 8})
  neg = features.RIGHT_NEG
  with pytest.raises(ValueError, match=r"the batch has only \['right_negative_encoder_input_tokens'\]"):
    contrastive.negative_sides({neg: 0}, 3)
  with pytest.raises(ValueError, match="The batch has 3 hard negatives per example.*set Contrastive.num_negatives"):
    contrastive.negative_sides({neg: 0, f"{neg}_1": 0, f"{neg}_2": 0}, 1)
  assert contrastive.negative_sides({features.LEFT: 0}, 3) == []
