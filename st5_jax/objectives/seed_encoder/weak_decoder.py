"""SEED-Encoder's weak decoder, and the pre-training model that carries it beside ST5.

SEED-Encoder (Lu et al. 2021; microsoft/SEED-Encoder) pre-trains an encoder with an
auto-encoding loss through a deliberately weak decoder, so that reconstruction has to
come from the encoder's single vector rather than from the decoder's own context:

- the same width as the encoder (T5 decoder layers: self-attention, cross-attention,
  MLP, pre-norm), few layers (the paper: 3);
- self-attention restricted to a window: query i attends keys i-k < j <= i and
  position 0 (the start token), in every layer (official `buffered_future_mask`), so
  with one layer and k = 2 the prediction of x_t sees x_{t-1}, x_{t-2} and the start
  token only; L layers see L*(k-1) tokens back;
- cross-attention over a memory of length 1, the pooled vector of the encoder pass;
- token embeddings shared with the encoder, output projection tied to them (with T5's
  1/sqrt(d) rescaling of tied logits).

`SeedEncoderPretrainer` is `SentenceT5` (same parameter names: `token_embedder`,
`encoder`, `decoder`, `projection_layer`) whose T5 decoder always exists (span
corruption needs it) plus `weak_decoder/`. Its work dirs load into ST5 runs with
`run.init_from`: the weak decoder is reported unused and dropped.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from st5_jax.configs import ST5Config, T5Config
from st5_jax.model import t5
from st5_jax.model.st5 import SentenceT5

Array = jax.Array


def window_mask(length: int, window: int) -> Array:
  """[T, T] bool, True where query i attends key j: i - window < j <= i, or j == 0."""
  i_Tx1 = jnp.arange(length)[:, None]
  j_1xT = jnp.arange(length)[None, :]
  return (j_1xT <= i_Tx1) & ((j_1xT > i_Tx1 - window) | (j_1xT == 0))


class WeakDecoder(nn.Module):
  """Embedded decoder inputs [B, T, D] + one memory vector [B, M] -> tied logits [B, T, V] (float32)."""

  config: T5Config
  num_layers: int
  window: int

  @nn.compact
  def __call__(self, y_BxTxD: Array, memory_BxM: Array, *, embedder: t5.Embed,
               deterministic: bool = True) -> Array:
    cfg = self.config
    T = y_BxTxD.shape[1]
    bias = t5.RelativePositionBiases(cfg.num_heads, cfg.relative_attention_num_buckets,
                                     cfg.relative_attention_max_distance, bidirectional=False,
                                     name="relpos_bias")(T, T)
    self_bias_1xHxTxT = bias + t5.mask_to_bias(window_mask(T, self.window)[None, None])
    # One memory slot, always visible: the cross-attention softmax is over a single key.
    memory_Bx1xM = memory_BxM[:, None, :]
    cross_bias_1x1xTx1 = jnp.zeros((1, 1, T, 1), jnp.float32)
    y = nn.Dropout(cfg.dropout_rate)(y_BxTxD, deterministic=deterministic)
    y = nn.with_logical_constraint(y, ("batch", "length", "embed"))
    y = t5._stack(t5.DecoderLayer, cfg, deterministic, self.num_layers, 3)(  # pylint: disable=protected-access
        y, memory_Bx1xM, self_bias_1xHxTxT, cross_bias_1x1xTx1)
    y = t5.LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, name="decoder_norm")(y)
    y = nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)
    logits_BxTxV = embedder.attend(y) / jnp.sqrt(jnp.float32(y.shape[-1]))
    return nn.with_logical_constraint(logits_BxTxV, ("batch", "length", "vocab"))


class SeedEncoderPretrainer(SentenceT5):
  """SentenceT5's parameters (with the T5 decoder) + `weak_decoder`; returns teacher-forced logits."""

  # The SeedEncoder objective (st5_jax/objectives/seed_encoder/objective.py): num_layers, window, memory.
  seed: Any = None

  def setup(self):
    super().setup()
    if self.seed.memory == "projected" and self.config.embedding_dim is None:
      raise ValueError("SeedEncoder.memory='projected' needs a projection; set ST5Config.embedding_dim "
                       "or use memory='pooled'.")
    if not self.config.uses_decoder:
      self.decoder = t5.Decoder(self.config.t5)
    self.weak_decoder = WeakDecoder(self.config.t5, self.seed.num_layers, self.seed.window)

  def memory(self, encoded_BxLxD: Array, tokens_BxL: Array, *, deterministic: bool = True) -> Array:
    """The weak decoder's memory vector [B, M], float32 (ST5's pooled vector of this encoder pass)."""
    pooled_BxD = self.pool_encoded(encoded_BxLxD, tokens_BxL, deterministic=deterministic)
    projected_BxE = self.projection_layer(pooled_BxD) if self.config.embedding_dim is not None else None
    return projected_BxE if self.seed.memory == "projected" else pooled_BxD

  def __call__(self, tokens_BxL: Array, *, decoder_input_tokens_BxT: Array | None = None,
               weak_decoder_input_tokens_BxS: Array | None = None,
               deterministic: bool = True) -> tuple[Array | None, Array | None]:
    """(span-corruption logits [B, T, V], weak-decoder logits [B, S, V]), float32.

    `tokens_BxL` is the (corrupted) encoder input; each decoder runs when its inputs are
    given (None is returned otherwise). With neither, as at `init`, both run on
    `tokens_BxL` so that every parameter is created.
    """
    if decoder_input_tokens_BxT is None and weak_decoder_input_tokens_BxS is None:
      decoder_input_tokens_BxT = weak_decoder_input_tokens_BxS = tokens_BxL
    mask_BxL = tokens_BxL > 0
    encoded_BxLxD = self.encode(tokens_BxL, deterministic=deterministic)
    span_logits = weak_logits = None
    if decoder_input_tokens_BxT is not None:
      span_logits = self.decoder(self.token_embedder(decoder_input_tokens_BxT), encoded_BxLxD, mask_BxL,
                                 deterministic=deterministic, logits_embedder=self.token_embedder,
                                 return_logits=True)
      span_logits = nn.with_logical_constraint(span_logits, ("batch", "length", "vocab"))
    # The memory (and so the projection) is also computed without the weak decoder, so
    # that the parameter tree is always SentenceT5's; unused values are compiled away.
    memory_BxM = self.memory(encoded_BxLxD, tokens_BxL, deterministic=deterministic)
    if weak_decoder_input_tokens_BxS is not None:
      weak_logits = self.weak_decoder(self.token_embedder(weak_decoder_input_tokens_BxS), memory_BxM,
                                      embedder=self.token_embedder, deterministic=deterministic)
    return span_logits, weak_logits


def init_params(config: ST5Config, seed: Any, rng: Array, *, length: int = 8):
  """Boxed (logically partitioned) parameters of a fresh pre-training model."""
  return SeedEncoderPretrainer(config, seed).init(rng, jnp.ones((1, length), jnp.int32))["params"]


def abstract_params(config: ST5Config, seed: Any, *, length: int = 8):
  """Shapes and logical axes of the pre-training model's parameters, without allocating them."""
  return jax.eval_shape(lambda: init_params(config, seed, jax.random.PRNGKey(0), length=length))
