"""Model shapes, logical axes, scan equivalence and relative position buckets."""

import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from st5_jax import configs
from st5_jax.checkpoints import tree
from st5_jax.model import SentenceT5, abstract_params, t5 as t5_lib

LOGICAL_AXES = {"embed", "mlp", "heads", "kv", "joined_kv", "vocab", "relpos_buckets", "layers", "affinity"}


def _count(cfg):
  return sum(math.prod(x.shape) for x in jax.tree.leaves(nn.unbox(abstract_params(cfg))))


@pytest.mark.parametrize("size,pooling,expected,rel", [
    ("t5_11b", "enc_mean", 4.86e9, 0.005),
    ("t5_11b", "encdec_first", 11.3e9, 0.005),
    ("t5_base", "enc_mean", 110e6, 0.01),
    ("t5_3b", "enc_mean", 1.24e9, 0.01),
])
def test_parameter_counts_without_allocation(size, pooling, expected, rel):
  cfg = configs.ST5Config(t5=configs.t5_size(size), pooling=pooling, embedding_dim=None)
  assert _count(cfg) == pytest.approx(expected, rel=rel)


def test_projection_adds_embed_by_768():
  base = configs.ST5Config(t5=configs.t5_size("t5_base"), embedding_dim=None)
  assert _count(base.replace(embedding_dim=768)) - _count(base) == 768 * 768


@pytest.mark.parametrize("scan", [False, True])
def test_every_parameter_has_logical_axes(scan):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_1_1_tiny", scan_layers=scan), pooling="encdec_first")
  boxed = abstract_params(cfg)
  specs = flatten_specs(nn.get_partition_spec(boxed))
  shapes = tree.flatten(nn.unbox(boxed))
  assert specs.keys() == shapes.keys()
  for name, spec in specs.items():
    assert len(spec) == len(shapes[name].shape), name
    assert set(spec) <= LOGICAL_AXES, (name, spec)
    if scan and "/layers/" in name:
      assert spec[0] == "layers", name


def flatten_specs(specs):
  return {k: tuple(v) for k, v in tree.flatten(specs).items()}


@pytest.mark.parametrize("pooling", ["enc_first", "enc_mean", "encdec_first"])
def test_scan_and_remat_match_unrolled_layers(pooling):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling=pooling, embedding_dim=16)
  cfg_scan = cfg.replace(t5=cfg.t5.replace(scan_layers=True, remat_policy="full"))
  params = nn.unbox(SentenceT5(cfg).init(jax.random.PRNGKey(1), jnp.ones((1, 4), jnp.int32))["params"])
  flat = {k: np.asarray(v) for k, v in tree.flatten(params).items()}
  scanned = tree.unflatten(tree.stack_layers(flat))
  tokens = jnp.array([[37, 1782, 5, 1, 0, 0], [100, 1, 0, 0, 0, 0]])
  a = SentenceT5(cfg).apply({"params": params}, tokens)
  b = SentenceT5(cfg_scan).apply({"params": scanned}, tokens)
  np.testing.assert_allclose(a, b, atol=1e-6)
  # Gradients through scan+remat equal the unrolled ones too.
  ga = jax.grad(lambda p: SentenceT5(cfg).apply({"params": p}, tokens).sum())(params)
  gb = jax.grad(lambda p: SentenceT5(cfg_scan).apply({"params": p}, tokens).sum())(scanned)
  gb_flat = tree.unstack_layers({k: np.asarray(v) for k, v in tree.flatten(gb).items()})
  for k, v in tree.flatten(ga).items():
    np.testing.assert_allclose(v, gb_flat[k], atol=1e-5, err_msg=k)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (4, 128)])
def test_relative_position_buckets_match_transformers(bidirectional, num_buckets, max_distance):
  q, k = 300, 310
  ours = t5_lib.relative_position_buckets(q, k, bidirectional=bidirectional, num_buckets=num_buckets,
                                          max_distance=max_distance)
  rel = torch.arange(k)[None, :] - torch.arange(q)[:, None]
  ref = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                              max_distance=max_distance).numpy()
  np.testing.assert_array_equal(ours, ref)
  assert ours.min() >= 0 and ours.max() < num_buckets


def test_padding_does_not_change_embeddings():
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=8)
  model = SentenceT5(cfg)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])
  short = model.apply({"params": params}, jnp.array([[37, 1782, 1]]))
  long = model.apply({"params": params}, jnp.array([[37, 1782, 1, 0, 0, 0, 0, 0]]))
  np.testing.assert_allclose(short, long, atol=1e-6)
  assert np.all(np.isfinite(model.apply({"params": params}, jnp.zeros((2, 4), jnp.int32))))


def test_pooled_representations_before_projection():
  """enc_mean is the mean over non-padding positions, enc_first position 0 (before any L2 norm,
  which would hide a per-example scale such as dividing by the padded length)."""
  tokens = jnp.array([[37, 1782, 5, 1, 0, 0], [37, 1, 0, 0, 0, 0]])
  mask = np.asarray(tokens > 0)
  for pooling in ("enc_mean", "enc_first"):
    model = SentenceT5(configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling=pooling, embedding_dim=8))
    params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])
    enc = np.asarray(model.apply({"params": params}, tokens, method=SentenceT5.encode))
    want = (enc * mask[..., None]).sum(1) / mask.sum(1, keepdims=True) if pooling == "enc_mean" else enc[:, 0]
    np.testing.assert_allclose(model.apply({"params": params}, tokens, method=SentenceT5.pool), want, atol=1e-6,
                               err_msg=pooling)


def test_bfloat16_activations_keep_float32_params_and_output():
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny", dtype="bfloat16"), embedding_dim=8)
  model = SentenceT5(cfg)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  tokens = jnp.array([[37, 1782, 5, 9, 1], [37, 1, 0, 0, 0]])
  out, state = model.apply({"params": params}, tokens, capture_intermediates=True)
  ref = SentenceT5(cfg.replace(t5=cfg.t5.replace(dtype="float32"))).apply({"params": params}, tokens)
  assert out.dtype == jnp.float32
  # The compute really is bfloat16: every projection inside the tower outputs bf16...
  dense = {"/".join(k): v[0] for k, v in flax.traverse_util.flatten_dict(state["intermediates"]).items()
           if len(k) > 2 and k[-2] in ("query", "key", "value", "out", "wi", "wo")}
  assert len(dense) == 6 * cfg.t5.num_encoder_layers and all(v.dtype == jnp.bfloat16 for v in dense.values()), {
      k: v.dtype for k, v in dense.items()}
  # ...so the unit-norm output differs from float32 by bf16 rounding (8 mantissa bits: ~1e-2
  # relative per op), not by nothing and not by more than a few percent.
  err = np.abs(np.asarray(out) - np.asarray(ref)).max()
  assert 1e-4 < err < 2e-2, err
  np.testing.assert_allclose(np.sum(np.asarray(out) * np.asarray(ref), axis=-1), 1.0, atol=1e-3)


def test_dropout_is_active_only_in_training():
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.5), embedding_dim=8)
  model = SentenceT5(cfg)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])
  tokens = jnp.array([[37, 1782, 5, 1]])
  det = model.apply({"params": params}, tokens)
  np.testing.assert_allclose(det, model.apply({"params": params}, tokens), atol=0)
  drop1 = model.apply({"params": params}, tokens, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
  drop2 = model.apply({"params": params}, tokens, deterministic=False, rngs={"dropout": jax.random.PRNGKey(2)})
  assert not np.allclose(drop1, det) and not np.allclose(drop1, drop2)


def test_bad_config_values_are_rejected():
  with pytest.raises(ValueError, match="pooling"):
    configs.ST5Config(pooling="cls")
  with pytest.raises(ValueError, match="remat_policy"):
    configs.T5Config(remat_policy="sometimes")
  with pytest.raises(ValueError, match="Unknown T5 size"):
    configs.t5_size("t5_huge")
  cfg = configs.ST5Config(t5=configs.t5_size("t5_1_1_xl"), pooling="encdec_first")
  assert configs.ST5Config.from_dict(cfg.to_dict()) == cfg
