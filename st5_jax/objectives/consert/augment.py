"""ConSERT's input augmentations on the token-embedding output, as pure functions.

Each augmentation acts on the embeddings entering encoder block 0 (T5's counterpart of
BERT's embedding output, where yym6472/ConSERT applies them), per example, with
`mask_BxL` (True = real token, EOS included) and a PRNG key. Counts use Python's
`int(x * rate)` on each example's number of real tokens n, exactly as the official
code (modeling_bert.py `_cutoff_embeddings`, `_replace_position_ids`, `_sample_span`):

  shuffle         a random permutation pi of each example's real positions; token j is
                  placed at position pi(j), so the relative-position bias of (query i,
                  key j) is bucket(pi(j) - pi(i)) (ConSERT permutes BERT's position ids
                  and leaves token ids in place). Padding keeps its positions.
  token_cutoff    int(n * rate) random real rows zeroed (paper 0.15; 0.1 in `joint`).
  feature_cutoff  int(d * rate) random hidden dimensions zeroed at every real position (0.2).
  span_cutoff     one random contiguous span of max(int(n * (1 - rate)), 1) real tokens
                  kept; the rest become padding (token 0) and are masked as attention keys.
                  The official Pooling still averages over the original mask. This differs
                  from the official code on purpose: there the attention mask is built
                  before the cutoff, so the cut positions stay attended (as zeroed
                  embeddings that keep their positions). Here the view is the span alone, a
                  shorter sentence, which is what the paper describes ("cutoff ... a span
                  of tokens"); no shipped recipe uses span cutoff (the official scripts do
                  not either), so no published number depends on the choice.
  dropout         exactly int(n * d * rate) random elements of the real rows zeroed,
                  with no 1 / (1 - rate) rescaling (0.2).
  adversarial     FGV (supervised objectives only): emb + eps * g / ||g||, g the gradient
                  of the NLI loss w.r.t. the embeddings, normalised per token.

Padding rows are never touched (the official feature cutoff also zeroes padding rows;
padded positions are masked keys and never pooled, so outputs are the same).

Every augmentation is split into a *plan* sampled from (mask, key) -- positions or keep
masks, independent of the parameters -- and its application to the embeddings, so a
GradCache chunk can recompute its rows' views exactly (st5_jax/consert/objective.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

VIEWS = ("none", "shuffle", "token_cutoff", "feature_cutoff", "span_cutoff", "dropout", "adversarial")
RATED_VIEWS = ("token_cutoff", "feature_cutoff", "span_cutoff", "dropout")


def _count(max_n: int, fn, n_B: Array) -> Array:
  """fn(n_B) as int32, fn evaluated in Python float64 (like the official code) for n = 0..max_n."""
  table_N = jnp.asarray(np.array([fn(n) for n in range(max_n + 1)], np.int32))
  return _lookup(table_N, n_B)


def _lookup(table_N: Array, index_B: Array) -> Array:
  # One-hot selection rather than a gather: every op of the plans stays per example, so
  # the SPMD partitioner keeps them on the batch shards (no all-gathers; see _random_ranks).
  hit_BxN = index_B[:, None] == jnp.arange(table_N.shape[0])[None, :]
  return jnp.sum(jnp.where(hit_BxN, table_N[None, :], 0), axis=-1)


def _random_ranks(eligible_BxN: Array, key: Array) -> Array:
  """Per row, a uniformly random order of the eligible entries: ranks 0..k-1 (k eligible);
  ineligible entries rank after them. Exact counts (ties broken by index, no thresholds).

  Two sorts along the row, no gather or scatter with computed indices: the partitioner
  keeps rows on their batch shards instead of all-gathering them.
  """
  u_BxN = jax.random.uniform(key, eligible_BxN.shape)
  order_BxN = jnp.argsort(jnp.where(eligible_BxN, u_BxN, 2.0), axis=-1, stable=True)
  return jnp.argsort(order_BxN, axis=-1, stable=True).astype(jnp.int32)


# ------------------------------------------------------------------------------- plans


def shuffle_positions(mask_BxL: Array, key: Array) -> Array:
  """positions_BxL: the position pi(j) of token j; a random permutation of each row's real
  positions among themselves, padding positions fixed."""
  L = mask_BxL.shape[1]
  idx_L = jnp.arange(L, dtype=jnp.int32)
  ranks_BxL = _random_ranks(mask_BxL, key)
  ordinal_BxL = jnp.cumsum(mask_BxL, axis=-1, dtype=jnp.int32) - 1  # index among the real positions
  # pi(j) = the real position p whose ordinal is rank(j) (one-hot over p, no gather).
  hit_BxJxP = mask_BxL[:, None, :] & (ordinal_BxL[:, None, :] == ranks_BxL[:, :, None])
  shuffled_BxL = jnp.sum(jnp.where(hit_BxJxP, idx_L[None, None, :], 0), axis=-1)
  return jnp.where(mask_BxL, shuffled_BxL, idx_L[None, :])


def token_cutoff_keep(mask_BxL: Array, key: Array, *, rate: float) -> Array:
  """keep_BxL: False on int(n * rate) random real positions."""
  L = mask_BxL.shape[1]
  k_B = _count(L, lambda n: int(n * rate), jnp.sum(mask_BxL, axis=-1))
  return ~(mask_BxL & (_random_ranks(mask_BxL, key) < k_B[:, None]))


def feature_cutoff_keep(mask_BxL: Array, key: Array, *, dim: int, rate: float) -> Array:
  """keep_BxD: False on int(dim * rate) random hidden dimensions of each example."""
  B = mask_BxL.shape[0]
  ranks_BxD = _random_ranks(jnp.ones((B, dim), bool), key)
  return ranks_BxD >= int(dim * rate)


def dropout_keep(mask_BxL: Array, key: Array, *, dim: int, rate: float) -> Array:
  """keep_BxLxD: False on exactly int(n * dim * rate) random elements of the real rows."""
  B, L = mask_BxL.shape
  eligible_BxLD = jnp.repeat(mask_BxL, dim, axis=1)  # row-major [L, D] flattened
  k_B = _count(L, lambda n: int(n * dim * rate), jnp.sum(mask_BxL, axis=-1))
  drop_BxLD = eligible_BxLD & (_random_ranks(eligible_BxLD, key) < k_B[:, None])
  return ~drop_BxLD.reshape(B, L, dim)


def span_keep(mask_BxL: Array, key: Array, *, rate: float) -> Array:
  """keep_BxL: True on one contiguous span of max(int(n * (1 - rate)), 1) real tokens, start
  uniform over the n - span + 1 choices (counted among the real positions)."""
  L = mask_BxL.shape[1]
  n_B = jnp.sum(mask_BxL, axis=-1)
  span_B = jnp.minimum(_count(L, lambda n: max(int(n * (1 - rate)), 1), n_B), n_B)
  choices_B = n_B - span_B + 1
  start_B = jnp.minimum(jnp.floor(jax.random.uniform(key, n_B.shape) * choices_B).astype(jnp.int32),
                        jnp.maximum(choices_B - 1, 0))
  ordinal_BxL = jnp.cumsum(mask_BxL, axis=-1) - 1  # index among the real tokens
  return mask_BxL & (ordinal_BxL >= start_B[:, None]) & (ordinal_BxL < (start_B + span_B)[:, None])


def sample_plan(view: str, mask_BxL: Array, key: Array, *, rate: float, dim: int) -> dict[str, Array]:
  """The parameter-free part of a view: {} (none), {"positions"} (shuffle), {"row_keep"},
  {"col_keep"}, {"elem_keep"} or {"span_keep"}. `adversarial` needs gradients: no plan."""
  if view == "none":
    return {}
  if view == "shuffle":
    return {"positions": shuffle_positions(mask_BxL, key)}
  if view == "token_cutoff":
    return {"row_keep": token_cutoff_keep(mask_BxL, key, rate=rate)}
  if view == "feature_cutoff":
    return {"col_keep": feature_cutoff_keep(mask_BxL, key, dim=dim, rate=rate)}
  if view == "dropout":
    return {"elem_keep": dropout_keep(mask_BxL, key, dim=dim, rate=rate)}
  if view == "span_cutoff":
    return {"span_keep": span_keep(mask_BxL, key, rate=rate)}
  raise ValueError(f"No plan for view {view!r}; views with plans: {VIEWS[:-1]}")


def apply_keep(x_BxLxD: Array, mask_BxL: Array, plan: dict[str, Array]) -> Array:
  """Zeroes what a cutoff/dropout plan drops (padding rows untouched); other plans: x."""
  keep = None
  if "row_keep" in plan:
    keep = plan["row_keep"][:, :, None]
  elif "col_keep" in plan:
    keep = plan["col_keep"][:, None, :] | ~mask_BxL[:, :, None]
  elif "elem_keep" in plan:
    keep = plan["elem_keep"]
  return x_BxLxD if keep is None else x_BxLxD * keep.astype(x_BxLxD.dtype)


# ---------------------------------------------------------------- pure augmentations


def _augment(view: str, x_BxLxD: Array, mask_BxL: Array, key: Array, rate: float) -> Array:
  plan = sample_plan(view, mask_BxL, key, rate=rate, dim=x_BxLxD.shape[-1])
  return apply_keep(x_BxLxD, mask_BxL, plan)


def token_cutoff(x_BxLxD: Array, mask_BxL: Array, key: Array, *, rate: float) -> Array:
  return _augment("token_cutoff", x_BxLxD, mask_BxL, key, rate)


def feature_cutoff(x_BxLxD: Array, mask_BxL: Array, key: Array, *, rate: float) -> Array:
  return _augment("feature_cutoff", x_BxLxD, mask_BxL, key, rate)


def dropout(x_BxLxD: Array, mask_BxL: Array, key: Array, *, rate: float) -> Array:
  return _augment("dropout", x_BxLxD, mask_BxL, key, rate)


def span_cutoff(x_BxLxD: Array, mask_BxL: Array, key: Array, *, rate: float,
                pad_embedding_D: Array) -> tuple[Array, Array]:
  """(embeddings, attention key mask): rows outside the span become the padding token's
  embedding and are masked as keys (the official code sets their token ids to 0)."""
  keep_BxL = span_keep(mask_BxL, key, rate=rate)
  return jnp.where(keep_BxL[:, :, None], x_BxLxD, pad_embedding_D.astype(x_BxLxD.dtype)), keep_BxL


def fgv_noise(grad_BxLxD: Array, mask_BxL: Array, *, eps: float) -> Array:
  """FGV perturbation eps * g / (||g|| + 1e-10) per token (official `noise_norm`), 0 on padding."""
  g = grad_BxLxD.astype(jnp.float32)
  norm_BxLx1 = jnp.linalg.norm(g, axis=-1, keepdims=True)
  return jnp.where(mask_BxL[:, :, None], eps * g / (norm_BxLx1 + 1e-10), 0.0)


def permute_tokens(tokens_BxL: Array, positions_BxL: Array) -> Array:
  """The physically shuffled sequence: token j moved to position positions[b, j].

  The cheap form of the shuffle: equal to the faithful one (per-example relative bias)
  for mean pooling and for the first decoder output (encdec_first), since the encoder is
  permutation-equivariant given the bias and both poolings see its outputs as a set
  (the decoder's cross-attention has no position bias); not for enc_first, whose first
  output becomes another token's (tests/test_consert.py shows all three).
  """
  L = tokens_BxL.shape[1]
  hit_BxJxI = positions_BxL[:, :, None] == jnp.arange(L)[None, None, :]  # one-hot, no scatter
  return jnp.sum(jnp.where(hit_BxJxI, tokens_BxL[:, :, None], 0), axis=1).astype(tokens_BxL.dtype)
