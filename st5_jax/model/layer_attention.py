"""Layer-wise attention pooling (Oh et al. 2022, "Don't Judge a Language Model by Its Last Layer").

As the official code computes it (nlpods/LayerAttPooler, cl/models.py: `AttentionLayer`,
`MLPLayer`), from the N = L + 1 hidden states h^0..h^L of the encoder (h^0 the embedding
output, h^L the encoder output):

  c_l = h^l at the query token ("[CLS]": T5's first token, or its EOS)
  m_l = mean of h^l over non-padding tokens
  Q_q = RReLU(W_Q c_q)    K_l = RReLU(W_K m_l)    V_l = RReLU(W_V m_l)    (D x D, no bias)
  s_{q,l} = K_l . Q_q / N          (divided by the number of layers, not sqrt(D))
  alpha_q = softmax_l(s_q)         o_q = sum_l alpha_{q,l} V_l          o = mean_q o_q
  z = tanh(W [c_L ; o] + b)        (W: 2D -> D, with bias)

z is the pooled vector; SentenceT5 then applies its projection and L2 normalisation.
RReLU is torch.nn.RReLU's default: x for x >= 0, a x otherwise, with a ~ U(1/8, 1/3) drawn
per element in training (from the "dropout" rng stream: like dropout it is training
noise) and a = (1/8 + 1/3) / 2 = 11/48 at inference. As in the official loop over
queries, in training K and V get a fresh draw for every query q.

Parameters (under `layer_attention/`): `query_kernel`, `key_kernel`, `value_kernel`
[embed, joined_kv] (named as the attention projections of a T5 layer), `dense_kernel`
[joined_kv, embed] (rows: c_L then o) and `dense_bias` [embed]. Computed in float32 (a few [B, N, D] arrays; the encoder dominates).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

RRELU_LOWER = 1.0 / 8.0
RRELU_UPPER = 1.0 / 3.0
RRELU_EVAL_SLOPE = (RRELU_LOWER + RRELU_UPPER) / 2.0  # 11/48
QUERY_TOKENS = ("first", "eos")


def rrelu(x: Array, *, key: Array | None) -> Array:
  """Randomised leaky ReLU: random negative slopes with `key`, the mean slope 11/48 without."""
  if key is None:
    slope = RRELU_EVAL_SLOPE
  else:
    slope = jax.random.uniform(key, x.shape, jnp.float32, RRELU_LOWER, RRELU_UPPER)
  return jnp.where(x >= 0, x, x * slope)


def query_token_index(mask_BxL: Array, query_token: str) -> Array:
  """Index [B] of the token read as each layer's "[CLS]": 0, or the EOS (last non-padding token)."""
  if query_token == "first":
    return jnp.zeros(mask_BxL.shape[:1], jnp.int32)
  if query_token == "eos":
    return jnp.maximum(jnp.sum(mask_BxL.astype(jnp.int32), axis=1) - 1, 0)
  raise ValueError(f"query_token must be one of {QUERY_TOKENS}, got {query_token!r}")


class LayerAttentionPooling(nn.Module):
  """states [N, B, L, D] (h^0..h^L) + mask [B, L] -> pooled z [B, D] float32."""

  query_token: str = "first"

  @nn.compact
  def __call__(self, states_NxBxLxD: Array, mask_BxL: Array, *, deterministic: bool = True) -> Array:
    N, B, _, D = states_NxBxLxD.shape
    states = states_NxBxLxD.astype(jnp.float32)
    m = mask_BxL.astype(jnp.float32)
    idx_B = query_token_index(mask_BxL, self.query_token)
    c_NxBxD = jnp.take_along_axis(states, idx_B[None, :, None, None], axis=2)[:, :, 0]
    mean_NxBxD = jnp.einsum("nbld,bl->nbd", states, m) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)[None, :, None]
    # Without these constraints XLA's SPMD partitioner computed wrong gradients for the
    # states on a data x fsdp x model = 2x2x2 mesh (c_L reaching z both directly and
    # through the queries; tests/test_layer_attention.py checks sharded == unsharded).
    c_NxBxD = nn.with_logical_constraint(c_NxBxD, ("layers", "batch", "embed"))
    mean_NxBxD = nn.with_logical_constraint(mean_NxBxD, ("layers", "batch", "embed"))
    c_BxNxD = jnp.swapaxes(c_NxBxD, 0, 1)
    mean_BxNxD = jnp.swapaxes(mean_NxBxD, 0, 1)

    def kernel(name):
      return self.param(f"{name}_kernel", nn.with_logical_partitioning(
          nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"), ("embed", "joined_kv")),
          (D, D), jnp.float32)

    q_pre_BxNxD = jnp.einsum("bnd,de->bne", c_BxNxD, kernel("query"))
    k_pre_BxNxD = jnp.einsum("bnd,de->bne", mean_BxNxD, kernel("key"))
    v_pre_BxNxD = jnp.einsum("bnd,de->bne", mean_BxNxD, kernel("value"))
    if deterministic:
      q_BxNxD, k_BxNxD, v_BxNxD = (rrelu(x, key=None) for x in (q_pre_BxNxD, k_pre_BxNxD, v_pre_BxNxD))
      scores_BxQxN = jnp.einsum("bqd,bnd->bqn", q_BxNxD, k_BxNxD) / N
      alpha_BxQxN = jax.nn.softmax(scores_BxQxN, axis=-1)
      o_BxQxD = jnp.einsum("bqn,bnd->bqd", alpha_BxQxN, v_BxNxD)
    else:
      # The official code recomputes K and V inside its loop over the queries, so each
      # query sees its own RReLU draw of them: [B, Q, N, D] slopes (the same at inference).
      key = self.make_rng("dropout")
      self.sow("intermediates", "rrelu_key", key)
      k_q, k_k, k_v = jax.random.split(key, 3)
      q_BxNxD = rrelu(q_pre_BxNxD, key=k_q)
      k_BxQxNxD = rrelu(jnp.broadcast_to(k_pre_BxNxD[:, None], (B, N, N, D)), key=k_k)
      v_BxQxNxD = rrelu(jnp.broadcast_to(v_pre_BxNxD[:, None], (B, N, N, D)), key=k_v)
      scores_BxQxN = jnp.einsum("bqd,bqnd->bqn", q_BxNxD, k_BxQxNxD) / N
      alpha_BxQxN = jax.nn.softmax(scores_BxQxN, axis=-1)
      o_BxQxD = jnp.einsum("bqn,bqnd->bqd", alpha_BxQxN, v_BxQxNxD)
    self.sow("intermediates", "alpha", alpha_BxQxN)
    o_BxD = nn.with_logical_constraint(jnp.mean(o_BxQxD, axis=1), ("batch", "joined_kv"))

    w_2DxD = self.param("dense_kernel", nn.with_logical_partitioning(
        nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"), ("joined_kv", "embed")),
        (2 * D, D), jnp.float32)
    b_D = self.param("dense_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                     (D,), jnp.float32)
    cat_Bx2D = jnp.concatenate([c_NxBxD[-1], o_BxD], axis=-1)
    z_BxD = jnp.tanh(cat_Bx2D @ w_2DxD + b_D)
    return nn.with_logical_constraint(z_BxD, ("batch", "embed"))
