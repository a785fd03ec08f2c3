"""Where the logical-axis rules put each parameter on a mesh with model > 1 (every shipped run has model = 1,
so nothing else would notice a rule pointing at the wrong mesh axis)."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

import synthetic
from st5_jax import configs, optim, partitioning, train
from st5_jax.checkpoints import tree

TINY = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)
# (data, fsdp, model) = (2, 2, 2): every rule has an axis of size 2 to land on.
WANT = {
    "encoder/layers_0/attention/query/kernel": P("fsdp", "model"),  # embed x joined_kv (heads x kv)
    "encoder/layers_0/attention/key/kernel": P("fsdp", "model"),
    "encoder/layers_0/attention/value/kernel": P("fsdp", "model"),
    "encoder/layers_0/attention/out/kernel": P("model", "fsdp"),
    "encoder/relpos_bias/rel_embedding": P("model", None),  # heads x buckets
    "encoder/layers_0/mlp/wi/kernel": P("fsdp", "model"),  # embed x mlp
    "encoder/layers_0/mlp/wo/kernel": P("model", "fsdp"),
    "token_embedder/embedding": P("model", "fsdp"),  # vocab x embed
    "encoder/encoder_norm/scale": P("fsdp"),
    "projection_layer/kernel": P("fsdp", None),  # embed x affinity
}


def _spec(spec):
  """The spec without trailing Nones (P('a', None) and P('a') place an array the same way)."""
  entries = tuple(spec)
  while entries and entries[-1] is None:
    entries = entries[:-1]
  return P(*entries)


def test_parameters_land_on_the_mesh_axes_their_logical_axes_name():
  mesh = partitioning.make_mesh(partitioning.MeshConfig(2, 2, 2))
  setup = train.build(TINY, train.TrainConfig(num_train_steps=2, global_batch_size=16, eval_every=-1,
                                              optimizer=optim.OptimizerConfig(learning_rate=1e-2)), mesh)
  with jax.set_mesh(mesh):
    state = train.init_state(setup, TINY, seed=0)
    state, _ = setup.step_fn(state, next(synthetic.SyntheticPairs(mesh, 16, 0)))  # the compiled step's outputs
  params = tree.flatten(state.params)
  for name, want in WANT.items():
    x = params[name]
    want_padded = P(*(tuple(want) + (None,) * (x.ndim - len(want))))
    assert _spec(x.sharding.spec) == _spec(want), name
    # And each device holds the slice that spec implies (e.g. half of the heads of the position table).
    shard = x.addressable_shards[0].data.shape
    expect = tuple(d // (mesh.shape[a] if a else 1) for d, a in zip(x.shape, tuple(want_padded)))
    assert shard == expect, (name, shard, expect)
  heads = TINY.t5.num_heads
  assert params["encoder/relpos_bias/rel_embedding"].addressable_shards[0].data.shape[0] == heads // 2


def test_a_dimension_that_does_not_divide_by_its_mesh_axis_is_named_before_compiling():
  # model = 8: the relative-position table has num_heads = 4 rows ("heads" -> model), which cannot split 8 ways.
  from st5_jax.model.st5 import abstract_params
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 8))
  heads = TINY.t5.num_heads
  assert heads % 8
  with pytest.raises(partitioning.PartitioningError,
                     match=rf"relpos_bias'\]\['rel_embedding'\] dim {heads} over mesh axis model \(size 8\)"):
    partitioning.param_shardings(abstract_params(TINY), mesh)
  partitioning.param_shardings(abstract_params(TINY), partitioning.make_mesh(partitioning.MeshConfig(2, 2, 2)))
