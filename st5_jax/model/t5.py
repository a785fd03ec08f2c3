"""T5 1.0 / T5.1.1 encoder and decoder in Flax linen.

Why linen: t5x, flaxformer and the public T5X checkpoints all use linen's parameter
tree and its logical-partitioning metadata (`nn.with_logical_partitioning`,
`nn.scan` with a "layers" axis, `nn.logical_to_mesh_sharding`), so parameter paths
here are T5X's (`encoder/layers_0/attention/query/kernel`) and import is a rename-free
copy. nnx would need its own partitioning and scan plumbing for no gain here.

Parameters are float32 and carry logical axis names only; st5_jax/partitioning.py owns
the rules that map them to a mesh. Activations are computed in `config.dtype`; layer
norms, attention logits and softmax stay in float32.

Math (as in Mesh TF T5, T5X and Hugging Face): RMS layer norm without bias or mean
subtraction; no 1/sqrt(head_dim) scaling of attention logits (T5 folds it into the
query initialisation); relative position buckets shared by all layers of a stack
(bidirectional in the encoder, causal in the decoder); pre-norm residual blocks.
"""

from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from st5_jax.configs import T5Config

Array = jax.Array

# Masked attention positions get this bias: large enough to zero a softmax weight, small
# enough that bias + mask never overflows to -inf (a fully padded row stays finite).
MASK_BIAS = -1e10

_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": nn.relu,
    "gelu": functools.partial(nn.gelu, approximate=True),  # HF "gelu_new" / T5X "gelu"
    "gelu_exact": functools.partial(nn.gelu, approximate=False),
    "linear": lambda x: x,
    "silu": nn.silu,
}

_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_with_no_batch_dims": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


# Attention kernel, read at trace time. "einsum" (the default, and the numerics every test
# and checkpoint was made with): the two einsums below. Opt-in (benchmarks/gpu_compare.py's
# A/B; not a config field, so no saved config changes): "xla" is jax.nn.dot_product_attention
# fed the same float32 bias (relative position + key mask), the same math in one op XLA may
# fuse; "cudnn" is its cuDNN flash kernel (GPU only, bf16/fp16) with that bias cast to the
# activation dtype. Neither drops attention weights, so with dropout active the einsum path
# is used whatever is set.
ATTENTION_IMPLS = ("einsum", "xla", "cudnn")
_attention_impl = "einsum"


def set_attention_impl(name: str) -> str:
  """Sets the attention kernel for models traced from now on; returns the previous one."""
  global _attention_impl
  if name not in ATTENTION_IMPLS:
    raise ValueError(f"attention impl must be one of {ATTENTION_IMPLS}, got {name!r}")
  prev, _attention_impl = _attention_impl, name
  return prev


def _param(module: nn.Module, name: str, init, shape, axes):
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


def _constrain(x: Array, axes: tuple[str, ...]) -> Array:
  # A no-op without logical axis rules and a mesh in context (e.g. plain CPU inference).
  return nn.with_logical_constraint(x, axes)


class LayerNorm(nn.Module):
  """T5 RMS norm: x / rms(x) * scale, computed in float32, no bias."""

  epsilon: float = 1e-6
  dtype: str = "float32"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    scale = _param(self, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",))
    return (x32 * jax.lax.rsqrt(var + self.epsilon) * scale).astype(self.dtype)


class Dense(nn.Module):
  """Bias-free projection of the last axis, kernel [in, out] named by `axes`."""

  features: int
  axes: tuple[str, str]
  dtype: str = "float32"
  init_scale: float = 1.0
  kernel_init_mode: str = "fan_in"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    init = nn.initializers.variance_scaling(self.init_scale, self.kernel_init_mode, "truncated_normal")
    kernel = _param(self, "kernel", init, (x.shape[-1], self.features), self.axes)
    return jnp.einsum("...d,df->...f", x.astype(self.dtype), kernel.astype(self.dtype))


class Embed(nn.Module):
  """The shared token embedding [vocab, embed]."""

  num_embeddings: int
  features: int
  dtype: str = "float32"

  def setup(self):
    self.embedding = _param(self, "embedding", nn.initializers.normal(stddev=1.0),
                            (self.num_embeddings, self.features), ("vocab", "embed"))

  def __call__(self, tokens_BxL: Array) -> Array:
    return jnp.take(self.embedding, tokens_BxL, axis=0).astype(self.dtype)

  def attend(self, x_BxLxD: Array) -> Array:
    """Tied output logits (T5 1.0), float32."""
    return jnp.einsum("bld,vd->blv", x_BxLxD.astype(jnp.float32), self.embedding)


def relative_position_buckets(q_len, k_len, *, bidirectional: bool, num_buckets: int,
                              max_distance: int) -> Array:
  """Bucket ids [q_len, k_len] of key-minus-query offsets.

  Half the buckets are exact offsets, the rest log-spaced up to `max_distance`; in the
  bidirectional case the upper half of the buckets is for keys after the query.
  Float32 logs, as Mesh TF and Hugging Face compute them. jnp (not NumPy) so that
  lengths may be symbolic (shape-polymorphic export); XLA folds it to a constant
  when they are static.
  """
  rel_QxK = jnp.arange(k_len)[None, :] - jnp.arange(q_len)[:, None]
  return bucket_offsets(rel_QxK, bidirectional=bidirectional, num_buckets=num_buckets,
                        max_distance=max_distance)


def bucket_offsets(rel: Array, *, bidirectional: bool, num_buckets: int, max_distance: int) -> Array:
  """Bucket ids of key-minus-query offsets `rel` (any shape), as `relative_position_buckets`."""
  buckets = jnp.zeros_like(rel)
  if bidirectional:
    num_buckets //= 2
    buckets += (rel > 0).astype(jnp.int32) * num_buckets
    n = jnp.abs(rel)
  else:
    n = -jnp.minimum(rel, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  # max(n, 1) keeps log() finite where the small branch is taken anyway.
  scaled = (jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / jnp.float32(max_exact)) /
            jnp.float32(np.log(max_distance / max_exact)) * jnp.float32(num_buckets - max_exact))
  large = jnp.minimum(max_exact + scaled.astype(jnp.int32), num_buckets - 1)
  return (buckets + jnp.where(is_small, n, large)).astype(jnp.int32)


class RelativePositionBiases(nn.Module):
  """One [heads, buckets] bias table per stack, looked up per (query, key) offset."""

  num_heads: int
  num_buckets: int
  max_distance: int
  bidirectional: bool

  @nn.compact
  def __call__(self, q_len: int, k_len: int, positions_BxL: Array | None = None) -> Array:
    """[1, H, Q, K]; or [B, H, L, L] from per-example positions (offsets positions[k] - positions[q])."""
    table_HxR = _param(self, "rel_embedding",
                       nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                       (self.num_heads, self.num_buckets), ("heads", "relpos_buckets"))
    if positions_BxL is not None:
      # ConSERT's token shuffle: token j sits at position positions[b, j] (st5_jax/objectives/consert).
      rel_BxQxK = positions_BxL[:, None, :] - positions_BxL[:, :, None]
      buckets_BxQxK = bucket_offsets(rel_BxQxK, bidirectional=self.bidirectional,
                                     num_buckets=self.num_buckets, max_distance=self.max_distance)
      return jnp.take(table_HxR, buckets_BxQxK, axis=1).transpose(1, 0, 2, 3)
    buckets_QxK = relative_position_buckets(q_len, k_len, bidirectional=self.bidirectional,
                                            num_buckets=self.num_buckets,
                                            max_distance=self.max_distance)
    bias_HxQxK = jnp.take(table_HxR, buckets_QxK, axis=1)
    return bias_HxQxK[None]  # [1, H, Q, K]


def mask_to_bias(mask: Array) -> Array:
  """Boolean attention mask (True = attend) -> additive float32 bias of the same shape."""
  return jnp.where(mask, 0.0, MASK_BIAS).astype(jnp.float32)


class MultiHeadAttention(nn.Module):
  """Multi-head dot-product attention without logit scaling; kernels [embed, joined_kv]."""

  config: T5Config
  deterministic: bool = True

  @nn.compact
  def __call__(self, x_BxQxD: Array, kv_BxKxD: Array, bias_BxHxQxK: Array) -> Array:
    cfg = self.config
    H, K = cfg.num_heads, cfg.head_dim
    dense = functools.partial(Dense, features=H * K, axes=("embed", "joined_kv"), dtype=cfg.dtype)
    # T5 does not scale logits by 1/sqrt(K); it scales the query initialisation instead.
    q = dense(name="query", init_scale=1.0 / K)(x_BxQxD)
    k = dense(name="key")(kv_BxKxD)
    v = dense(name="value")(kv_BxKxD)
    B, Q, _ = q.shape
    q_BxQxHxK = _constrain(q.reshape(B, Q, H, K), ("batch", "length", "heads", "kv"))
    k_BxTxHxK = _constrain(k.reshape(B, -1, H, K), ("batch", "length", "heads", "kv"))
    v_BxTxHxK = _constrain(v.reshape(B, -1, H, K), ("batch", "length", "heads", "kv"))
    dropping = cfg.dropout_rate > 0 and not self.deterministic
    if _attention_impl == "einsum" or dropping:
      logits_BxHxQxT = jnp.einsum("bqhk,bthk->bhqt", q_BxQxHxK, k_BxTxHxK,
                                  preferred_element_type=jnp.float32)
      weights = jax.nn.softmax(logits_BxHxQxT + bias_BxHxQxK, axis=-1)
      weights = nn.Dropout(cfg.dropout_rate)(weights, deterministic=self.deterministic)
      out_BxQxHxK = jnp.einsum("bhqt,bthk->bqhk", weights.astype(cfg.dtype), v_BxTxHxK)
    elif _attention_impl == "xla":
      # scale=1: T5 does not scale logits (see above).
      out_BxQxHxK = jax.nn.dot_product_attention(q_BxQxHxK, k_BxTxHxK, v_BxTxHxK, bias=bias_BxHxQxK,
                                                 scale=1.0, implementation="xla")
    else:  # cuDNN takes the bias in the activation dtype (bfloat16 holds -1e10) and returns its gradient
      out_BxQxHxK = jax.nn.dot_product_attention(q_BxQxHxK, k_BxTxHxK, v_BxTxHxK,
                                                 bias=bias_BxHxQxK.astype(cfg.dtype), scale=1.0,
                                                 implementation="cudnn")
    out = Dense(cfg.emb_dim, axes=("joined_kv", "embed"), dtype=cfg.dtype, name="out")(
        out_BxQxHxK.reshape(B, Q, H * K))
    return _constrain(out, ("batch", "length", "embed"))


class MlpBlock(nn.Module):
  """ReLU MLP (T5 1.0: `wi`) or gated GELU (T5.1.1: `wi_0` * `wi_1`), then `wo`."""

  config: T5Config
  deterministic: bool = True

  @nn.compact
  def __call__(self, x_BxLxD: Array) -> Array:
    cfg = self.config
    acts = cfg.mlp_activations
    h = None
    for i, act in enumerate(acts):
      name = "wi" if len(acts) == 1 else f"wi_{i}"
      branch = _ACTIVATIONS[act](Dense(cfg.mlp_dim, axes=("embed", "mlp"), dtype=cfg.dtype, name=name)(x_BxLxD))
      h = branch if h is None else h * branch
    h_BxLxF = _constrain(h, ("batch", "length", "mlp"))
    h_BxLxF = nn.Dropout(cfg.dropout_rate)(h_BxLxF, deterministic=self.deterministic)
    return Dense(cfg.emb_dim, axes=("mlp", "embed"), dtype=cfg.dtype, name="wo")(h_BxLxF)


class EncoderLayer(nn.Module):
  config: T5Config
  deterministic: bool = True

  @nn.compact
  def __call__(self, x_BxLxD: Array, bias_BxHxLxL: Array):
    cfg = self.config
    norm = functools.partial(LayerNorm, epsilon=cfg.layer_norm_epsilon, dtype=cfg.dtype)
    drop = functools.partial(nn.Dropout(cfg.dropout_rate), deterministic=self.deterministic)
    y = norm(name="pre_attention_layer_norm")(x_BxLxD)
    y = MultiHeadAttention(cfg, self.deterministic, name="attention")(y, y, bias_BxHxLxL)
    x = x_BxLxD + drop(y)
    y = norm(name="pre_mlp_layer_norm")(x)
    y = MlpBlock(cfg, self.deterministic, name="mlp")(y)
    x = _constrain(x + drop(y), ("batch", "length", "embed"))
    return x, None  # (carry, output) so the layer can be scanned


class DecoderLayer(nn.Module):
  config: T5Config
  deterministic: bool = True

  @nn.compact
  def __call__(self, y_BxTxD: Array, encoded_BxLxD: Array, self_bias_BxHxTxT: Array,
               cross_bias_BxHxTxL: Array):
    cfg = self.config
    norm = functools.partial(LayerNorm, epsilon=cfg.layer_norm_epsilon, dtype=cfg.dtype)
    drop = functools.partial(nn.Dropout(cfg.dropout_rate), deterministic=self.deterministic)
    h = norm(name="pre_self_attention_layer_norm")(y_BxTxD)
    h = MultiHeadAttention(cfg, self.deterministic, name="self_attention")(h, h, self_bias_BxHxTxT)
    y = y_BxTxD + drop(h)
    h = norm(name="pre_cross_attention_layer_norm")(y)
    h = MultiHeadAttention(cfg, self.deterministic, name="encoder_decoder_attention")(
        h, encoded_BxLxD, cross_bias_BxHxTxL)
    y = y + drop(h)
    h = norm(name="pre_mlp_layer_norm")(y)
    h = MlpBlock(cfg, self.deterministic, name="mlp")(h)
    y = _constrain(y + drop(h), ("batch", "length", "embed"))
    return y, None


def _collecting(layer_cls):
  """The layer, also returning its input as the per-step output (the stack's h^0..h^{L-1})."""

  class Collecting(layer_cls):
    def __call__(self, x, *args):
      y, _ = super().__call__(x, *args)
      return y, x

  Collecting.__name__ = Collecting.__qualname__ = layer_cls.__name__
  return Collecting


def _stack(layer_cls, cfg: T5Config, deterministic: bool, num_layers: int, num_broadcast: int,
           collect: bool = False):
  """Returns a callable building the layer stack: a python loop or one nn.scan.

  With `collect`, the callable returns (output, inputs_NxBxLxD): the input of every
  layer stacked on a leading axis (scan's per-step outputs), i.e. h^0..h^{N-1}.
  """
  if collect:
    layer_cls = _collecting(layer_cls)
  if cfg.remat_policy != "none":
    # prevent_cse is only needed outside scan (scan already blocks CSE across steps).
    layer_cls = nn.remat(layer_cls, policy=_REMAT_POLICIES[cfg.remat_policy],
                         prevent_cse=not cfg.scan_layers)
  if cfg.scan_layers:
    scanned = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                      in_axes=(nn.broadcast,) * num_broadcast, length=num_layers,
                      metadata_params={nn.PARTITION_NAME: "layers"})

    def run(x, *args):
      x, inputs = scanned(cfg, deterministic, name="layers")(x, *args)
      return (x, inputs) if collect else x
  else:
    def run(x, *args):
      inputs = []
      for i in range(num_layers):
        x, x_in = layer_cls(cfg, deterministic, name=f"layers_{i}")(x, *args)
        inputs.append(x_in)
      return (x, jnp.stack(inputs)) if collect else x
  return run


class Encoder(nn.Module):
  """Embedded tokens -> final-normed encoder outputs [B, L, D].

  With `return_hidden_states`, returns (outputs, states_NxBxLxD) with N = layers + 1:
  h^0 (the embedding output, after dropout), the residual stream after each layer, and
  last the outputs themselves. `norm_hidden_states` passes h^0..h^{N-2} through the
  final `encoder_norm` too (pre-norm residual streams grow in scale with depth);
  without it the states are what Hugging Face's `output_hidden_states` returns.
  """

  config: T5Config

  @nn.compact
  def __call__(self, x_BxLxD: Array, mask_BxL: Array, *, deterministic: bool = True,
               positions_BxL: Array | None = None, return_hidden_states: bool = False,
               norm_hidden_states: bool = True):
    """`positions_BxL` (optional): per-example token positions for the relative bias."""
    cfg = self.config
    L = x_BxLxD.shape[1]
    bias = RelativePositionBiases(cfg.num_heads, cfg.relative_attention_num_buckets,
                                  cfg.relative_attention_max_distance, bidirectional=True,
                                  name="relpos_bias")(L, L, positions_BxL)
    # Only keys are masked (as in Hugging Face): outputs at padded positions are
    # well-defined, finite, and ignored by pooling.
    bias_BxHxLxL = bias + mask_to_bias(mask_BxL[:, None, None, :])
    x = nn.Dropout(cfg.dropout_rate)(x_BxLxD, deterministic=deterministic)
    x = _constrain(x, ("batch", "length", "embed"))
    stack = _stack(EncoderLayer, cfg, deterministic, cfg.num_encoder_layers, 1, collect=return_hidden_states)
    if not return_hidden_states:
      x = stack(x, bias_BxHxLxL)
      x = LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, name="encoder_norm")(x)
      return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
    x, inputs_NxBxLxD = stack(x, bias_BxHxLxL)
    final_norm = LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, name="encoder_norm")
    x = nn.Dropout(cfg.dropout_rate)(final_norm(x), deterministic=deterministic)
    if norm_hidden_states:
      inputs_NxBxLxD = final_norm(inputs_NxBxLxD)
    states = jnp.concatenate([inputs_NxBxLxD.astype(x.dtype), x[None]], axis=0)
    return x, _constrain(states, ("layers", "batch", "length", "embed"))


class Decoder(nn.Module):
  """Embedded decoder inputs + encoder outputs -> final-normed decoder outputs [B, T, D]."""

  config: T5Config

  @nn.compact
  def __call__(self, y_BxTxD: Array, encoded_BxLxD: Array, encoder_mask_BxL: Array, *,
               decoder_mask_BxT: Array | None = None, deterministic: bool = True,
               logits_embedder: "Embed | None" = None, return_logits: bool = False) -> Array:
    """Decoder outputs [B, T, D], or vocabulary logits [B, T, V] with `return_logits`."""
    cfg = self.config
    T = y_BxTxD.shape[1]
    bias = RelativePositionBiases(cfg.num_heads, cfg.relative_attention_num_buckets,
                                  cfg.relative_attention_max_distance, bidirectional=False,
                                  name="relpos_bias")(T, T)
    # Every position attends to itself and earlier positions. The decoder start token
    # is 0 (= pad), so padding of decoder inputs cannot come from the tokens.
    self_mask_BxTxT = jnp.tril(jnp.ones((1, T, T), bool))
    if decoder_mask_BxT is not None:
      self_mask_BxTxT = self_mask_BxTxT & decoder_mask_BxT[:, None, :]
    self_bias = bias + mask_to_bias(self_mask_BxTxT[:, None])
    cross_bias = mask_to_bias(encoder_mask_BxL[:, None, None, :])
    y = nn.Dropout(cfg.dropout_rate)(y_BxTxD, deterministic=deterministic)
    y = _constrain(y, ("batch", "length", "embed"))
    y = _stack(DecoderLayer, cfg, deterministic, cfg.num_decoder_layers, 3)(
        y, encoded_BxLxD, self_bias, cross_bias)
    y = LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, name="decoder_norm")(y)
    y = nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)
    if not return_logits:
      return y
    if cfg.logits_via_embedding:
      # Tied embeddings: rescale as Mesh TF / T5X / Hugging Face do.
      return logits_embedder.attend(y) / jnp.sqrt(jnp.float32(y.shape[-1]))
    return Dense(cfg.vocab_size, axes=("embed", "vocab"), dtype=jnp.float32, name="logits_dense")(y)


class T5(nn.Module):
  """Full T5: shared embedding, encoder, decoder and output logits (for LM use and tests)."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
    self.encoder = Encoder(cfg)
    self.decoder = Decoder(cfg)

  def encode(self, tokens_BxL: Array, *, deterministic: bool = True) -> Array:
    return self.encoder(self.token_embedder(tokens_BxL), tokens_BxL > 0, deterministic=deterministic)

  def decode(self, encoded_BxLxD: Array, encoder_tokens_BxL: Array, decoder_input_tokens_BxT: Array, *,
             deterministic: bool = True, return_logits: bool = False) -> Array:
    return self.decoder(self.token_embedder(decoder_input_tokens_BxT), encoded_BxLxD,
                        encoder_tokens_BxL > 0, deterministic=deterministic,
                        logits_embedder=self.token_embedder, return_logits=return_logits)

  def __call__(self, encoder_tokens_BxL: Array, decoder_input_tokens_BxT: Array, *,
               deterministic: bool = True) -> Array:
    """Teacher-forced logits [B, T, V]."""
    encoded = self.encode(encoder_tokens_BxL, deterministic=deterministic)
    return self.decode(encoded, encoder_tokens_BxL, decoder_input_tokens_BxT, deterministic=deterministic,
                       return_logits=True)
