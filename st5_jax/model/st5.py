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

Asymmetric towers (`ST5Config.towers`; gin `st5_model.towers`, gin/objectives/towers_*.gin): the query side
(`inputs`) and the document side (`targets`, hard negatives) encode with different parameters, named
as t5x_retrieval's asymmetric dual encoder (ADE) names its left (query) and right (document) parts:

  "shared"      one tower (the default; the tree above)
  "projection"  one T5 (`token_embedder`, `encoder`, ...), `left_projection_layer/kernel` and
                `right_projection_layer/kernel` [embed, affinity]
  "separate"    `left_tower/` and `right_tower/`, each a whole tower with the tree above

`__call__(tokens, side="query" | "document")` encodes one side; the module's `side` attribute is the
default (an inference tower of one side). An asymmetric model called without a side refuses, except at
`init`, which creates every side's parameters. Hooks and `encode` / `pool` are the shared tower's
(the objectives that read them refuse asymmetric towers).
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from st5_jax.configs import ST5Config, TOWERS
from st5_jax.model import t5
from st5_jax.model.layer_attention import LayerAttentionPooling
from st5_jax.vocab import DECODER_START_ID

Array = jax.Array
SIDES = ("query", "document")
# ADE's names of the sides: left = query, right = document.
SIDE_PREFIX = {"query": "left", "document": "right"}


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
  # The side encoded when a call names none (one side's inference tower of an asymmetric model). Keyword-only:
  # subclasses (ConSERT's, SEED-Encoder's modules) add positional fields after `config`.
  side: str | None = dataclasses.field(default=None, kw_only=True)

  def setup(self):
    if self.config.towers == "separate":
      one = self.config.replace(towers="shared")
      self.left_tower = SentenceT5(one)
      self.right_tower = SentenceT5(one)
      return
    cfg = self.config.t5
    self.token_embedder = t5.Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
    self.encoder = t5.Encoder(cfg)
    if self.config.uses_decoder:
      self.decoder = t5.Decoder(cfg)
    if self.config.pooling == "layer_attention":
      self.layer_attention = LayerAttentionPooling(self.config.layer_attention_token)
    if self.config.embedding_dim is not None:
      names = ["left_projection_layer", "right_projection_layer"] if self.config.towers == "projection" \
          else ["projection_layer"]
      for name in names:
        setattr(self, name, t5.Dense(self.config.embedding_dim, axes=("embed", "affinity"), dtype=jnp.float32))

  def resolve_side(self, side: str | None) -> str | None:
    """The side a call encodes: `side`, else the module's; None for a shared tower."""
    side = side if side is not None else self.side
    if side is not None and side not in SIDES:
      raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    if not self.config.asymmetric:
      return None
    if side is None:
      raise ValueError(f"this model has asymmetric towers (towers={self.config.towers!r}): encode with "
                       f"side='query' or side='document'")
    return side

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

  def project(self, tokens_BxL: Array, *, side: str | None = None, deterministic: bool = True, **hooks) -> Array:
    """The pooled (and projected) vector of `side` before L2 normalisation (ConSERT's NLI head reads it)."""
    side = self.resolve_side(side)
    if self.config.towers == "separate":
      tower = self.left_tower if side == "query" else self.right_tower
      return tower.project(tokens_BxL, deterministic=deterministic, **hooks)
    x_BxD = self.pool(tokens_BxL, deterministic=deterministic, **hooks)
    if self.config.embedding_dim is not None:
      projection = self.projection_layer if side is None else getattr(self, f"{SIDE_PREFIX[side]}_projection_layer")
      x_BxD = projection(x_BxD)
    return nn.with_logical_constraint(x_BxD, ("batch", "affinity"))

  def __call__(self, tokens_BxL: Array, *, side: str | None = None, deterministic: bool = True, **hooks) -> Array:
    """Embeddings [B, output_dim] of `side` ("query" / "document"; ignored by a shared tower)."""
    if self.config.asymmetric and side is None and self.side is None and self.is_initializing():
      for s in SIDES[::-1]:  # init creates both sides' parameters; returns the query side's embeddings
        out_BxD = self(tokens_BxL, side=s, deterministic=deterministic, **hooks)
      return out_BxD
    x_BxD = self.project(tokens_BxL, side=side, deterministic=deterministic, **hooks)
    return l2_normalize(x_BxD) if self.config.normalize else x_BxD


def init_params(config: ST5Config, rng: Array, *, length: int = 8):
  """Boxed (logically partitioned) parameters of a fresh model."""
  model = SentenceT5(config)
  return model.init(rng, jnp.ones((1, length), jnp.int32))["params"]


def abstract_params(config: ST5Config, *, length: int = 8):
  """Shapes and logical axes of the parameters, without allocating them."""
  return jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), length=length))


def side_param_keys(config: ST5Config, side: str) -> tuple[str, ...]:
  """The top-level parameter subtrees `side` reads (all of them for a shared tower)."""
  if side not in SIDES:
    raise ValueError(f"side must be one of {SIDES}, got {side!r}")
  if config.towers == "separate":
    return (f"{SIDE_PREFIX[side]}_tower",)
  other = SIDE_PREFIX["document" if side == "query" else "query"]
  return tuple(k for k in _top_level_keys(config) if k != f"{other}_projection_layer")


@functools.lru_cache(maxsize=16)
def _top_level_keys(config: ST5Config) -> tuple[str, ...]:
  # One trace of the model per config: callers ask for each side's keys several times at start-up.
  return tuple(abstract_params(config))


def strip_tower(name: str) -> str:
  """A flat parameter name without its `left_tower/` / `right_tower/` prefix (towers="separate")."""
  return name.split("/", 1)[1] if name.startswith(("left_tower/", "right_tower/")) else name


def is_projection_name(name: str) -> bool:
  """A flat parameter name of a projection, in any tower layout."""
  return name.split("/")[0] in ("projection_layer", "left_projection_layer", "right_projection_layer") or \
      name.startswith(("left_tower/projection_layer/", "right_tower/projection_layer/"))


def split_towers(flat: dict[str, Array], towers: str) -> dict[str, Array]:
  """A shared tower's flat (T5X-named) arrays in the layout of `towers`, both sides the same arrays: how an
  asymmetric model starts from one checkpoint (as ADE starts both towers from one T5)."""
  if towers not in TOWERS:
    raise ValueError(f"towers must be one of {TOWERS}, got {towers!r}")
  if towers == "shared":
    return dict(flat)
  if towers == "separate":
    return {f"{p}_tower/{k}": v for p in ("left", "right") for k, v in flat.items()}
  out = {k: v for k, v in flat.items() if not k.startswith("projection_layer/")}
  for k, v in flat.items():
    if k.startswith("projection_layer/"):
      out[f"left_{k}"], out[f"right_{k}"] = v, v
  return out


def side_flat(flat: dict[str, Array], config: ST5Config, side: str) -> dict[str, Array]:
  """The flat arrays of one side's tower, named as a shared tower (`projection_layer/kernel`, `encoder/...`):
  what exports one side (a sentence-transformers route)."""
  if side not in SIDES:
    raise ValueError(f"side must be one of {SIDES}, got {side!r}")
  if config.towers == "shared":
    return dict(flat)
  p = SIDE_PREFIX[side]
  if config.towers == "separate":
    return {k[len(p) + 7:]: v for k, v in flat.items() if k.startswith(f"{p}_tower/")}
  out = {k: v for k, v in flat.items() if not k.startswith(("left_projection_layer/", "right_projection_layer/"))}
  out.update({k[len(p) + 1:]: v for k, v in flat.items() if k.startswith(f"{p}_projection_layer/")})
  return out
