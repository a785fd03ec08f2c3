"""Sentence-T5: a T5 tower pooled into one L2-normalised sentence embedding.

Poolings (paper section 3): `enc_first` (encoder output of the first token),
`enc_mean` (mean of encoder outputs over non-padding tokens), `encdec_first` (the
first output of a decoder fed only the start token 0, after the final decoder norm and
before any logits), `layer_attention` (layer-wise attention pooling over the states of
every encoder layer, st5_jax/model/layer_attention.py). Then an optional bias-free projection to `embedding_dim`
(`embedding_dim=None` is the raw mode) and L2 normalisation in float32. A dual encoder
applies the same module (same parameters) to both sides.

Parameter paths match t5x_retrieval's dual encoder: `token_embedder`, `encoder`,
`decoder` (encdec_first only) and `projection_layer/kernel` [embed, affinity];
`layer_attention/` holds the pooling head of layer_attention models. The tower holds no
training head: an objective that needs one adds it (st5_jax/objectives/).

Hooks for input augmentation (st5_jax/objectives/consert), all optional and absent by default:
`embeddings_BxLxD` replaces the token-embedding output entering encoder block 0,
`positions_BxL` gives per-example token positions for the relative-position bias, and
`attention_mask_BxL` replaces the key mask (pooling still averages over `tokens > 0`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from st5_jax.configs import ST5Config
from st5_jax.model import t5
from st5_jax.model.layer_attention import LayerAttentionPooling
from st5_jax.vocab import DECODER_START_ID

Array = jax.Array


def l2_normalize(x_BxD: Array, eps: float = 1e-12) -> Array:
  """x / max(||x||, eps), as torch.nn.functional.normalize (sentence-transformers)."""
  norm = jnp.sqrt(jnp.sum(jnp.square(x_BxD), axis=-1, keepdims=True))
  return x_BxD / jnp.maximum(norm, eps)


def mean_pool(x_BxLxD: Array, mask_BxL: Array) -> Array:
  """Mean over positions where mask is True, in float32 (zero for an all-pad row)."""
  m = mask_BxL.astype(jnp.float32)[..., None]
  total_BxD = jnp.sum(x_BxLxD.astype(jnp.float32) * m, axis=1)
  return total_BxD / jnp.maximum(jnp.sum(m, axis=1), 1e-9)


class SentenceT5(nn.Module):
  """tokens [B, L] (pad 0, EOS-terminated) -> embeddings [B, output_dim] float32."""

  config: ST5Config

  def setup(self):
    cfg = self.config.t5
    self.token_embedder = t5.Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
    self.encoder = t5.Encoder(cfg)
    if self.config.uses_decoder:
      self.decoder = t5.Decoder(cfg)
    if self.config.pooling == "layer_attention":
      self.layer_attention = LayerAttentionPooling(self.config.layer_attention_token)
    if self.config.embedding_dim is not None:
      self.projection_layer = t5.Dense(self.config.embedding_dim, axes=("embed", "affinity"),
                                       dtype=jnp.float32)

  def embed_tokens(self, tokens_BxL: Array) -> Array:
    """The token-embedding output [B, L, D] that enters encoder block 0."""
    return self.token_embedder(tokens_BxL)

  def encode(self, tokens_BxL: Array, *, deterministic: bool = True, embeddings_BxLxD: Array | None = None,
             positions_BxL: Array | None = None, attention_mask_BxL: Array | None = None) -> Array:
    """Final-normed encoder outputs [B, L, D]."""
    x_BxLxD = self.token_embedder(tokens_BxL) if embeddings_BxLxD is None else embeddings_BxLxD
    mask_BxL = tokens_BxL > 0 if attention_mask_BxL is None else attention_mask_BxL
    return self.encoder(x_BxLxD, mask_BxL, deterministic=deterministic, positions_BxL=positions_BxL)

  def pool(self, tokens_BxL: Array, *, deterministic: bool = True, **hooks) -> Array:
    """Pooled T5 representation [B, D] before projection, float32. `hooks`: see module doc."""
    if self.config.pooling == "layer_attention":
      x_BxLxD = hooks.get("embeddings_BxLxD")
      x_BxLxD = self.token_embedder(tokens_BxL) if x_BxLxD is None else x_BxLxD
      key_mask_BxL = hooks.get("attention_mask_BxL")
      key_mask_BxL = tokens_BxL > 0 if key_mask_BxL is None else key_mask_BxL
      _, states_NxBxLxD = self.encoder(x_BxLxD, key_mask_BxL, deterministic=deterministic,
                                       positions_BxL=hooks.get("positions_BxL"), return_hidden_states=True,
                                       norm_hidden_states=self.config.layer_attention_norm)
      return self.layer_attention(states_NxBxLxD, tokens_BxL > 0, deterministic=deterministic)
    encoded_BxLxD = self.encode(tokens_BxL, deterministic=deterministic, **hooks)
    return self.pool_encoded(encoded_BxLxD, tokens_BxL, deterministic=deterministic,
                             attention_mask_BxL=hooks.get("attention_mask_BxL"))

  def pool_encoded(self, encoded_BxLxD: Array, tokens_BxL: Array, *, deterministic: bool = True,
                   attention_mask_BxL: Array | None = None) -> Array:
    """`pool` of encoder outputs already computed (one encoder pass shared with other heads).

    Mean pooling averages over the tokens' own mask even when `attention_mask_BxL`
    (ConSERT's span cutoff) hides keys, as the official ConSERT code does.
    layer_attention reads every layer, not the final outputs: use `pool`.
    """
    mask_BxL = tokens_BxL > 0
    pooling = self.config.pooling
    if pooling == "enc_first":
      return encoded_BxLxD[:, 0].astype(jnp.float32)
    if pooling == "enc_mean":
      return mean_pool(encoded_BxLxD, mask_BxL)
    if pooling == "encdec_first":
      start_Bx1 = jnp.full((tokens_BxL.shape[0], 1), DECODER_START_ID, jnp.int32)
      decoded_Bx1xD = self.decoder(self.token_embedder(start_Bx1), encoded_BxLxD,
                                   mask_BxL if attention_mask_BxL is None else attention_mask_BxL,
                                   deterministic=deterministic)
      return decoded_Bx1xD[:, 0].astype(jnp.float32)
    raise ValueError(f"pooling {pooling!r} is not a function of the final encoder outputs")

  def project(self, tokens_BxL: Array, *, deterministic: bool = True, **hooks) -> Array:
    """The pooled (and projected) vector before L2 normalisation (ConSERT's NLI head reads it)."""
    x_BxD = self.pool(tokens_BxL, deterministic=deterministic, **hooks)
    if self.config.embedding_dim is not None:
      x_BxD = self.projection_layer(x_BxD)
    return nn.with_logical_constraint(x_BxD, ("batch", "affinity"))

  def __call__(self, tokens_BxL: Array, *, deterministic: bool = True, **hooks) -> Array:
    x_BxD = self.project(tokens_BxL, deterministic=deterministic, **hooks)
    return l2_normalize(x_BxD) if self.config.normalize else x_BxD


def init_params(config: ST5Config, rng: Array, *, length: int = 8):
  """Boxed (logically partitioned) parameters of a fresh model."""
  model = SentenceT5(config)
  return model.init(rng, jnp.ones((1, length), jnp.int32))["params"]


def abstract_params(config: ST5Config, *, length: int = 8):
  """Shapes and logical axes of the parameters, without allocating them."""
  return jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), length=length))
