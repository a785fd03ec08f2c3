"""Gradient caching (Gao et al., 2021): the paper's batch sizes on small memory.

The in-batch softmax couples every example of the global batch, so the batch cannot
simply be split into micro-batches. GradCache splits the *backward* pass instead:

  1. embed the batch chunk by chunk without keeping activations;
  2. compute the contrastive loss on the full batch of embeddings and its gradient
     with respect to the embeddings (cheap: [B, D] arrays);
  3. for each chunk, recompute its embeddings and back-propagate that chunk's slice of
     the embedding gradient into the parameters, accumulating.

Peak activation memory is one chunk's; the gradient equals the full-batch gradient
(same dropout masks in steps 1 and 3, so also with dropout). Chunks interleave rows
(chunk c holds rows c, c+C, ...), so each chunk stays spread over every device of the
batch axes.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from st5_jax import losses
from st5_jax.features import LEFT, RIGHT, RIGHT_NEG


def _split(x, chunks: int):
  """[B, ...] -> [C, B/C, ...] with chunk c = rows c, c+C, c+2C, ..."""
  B = x.shape[0]
  if B % chunks:
    raise ValueError(f"GradCache: batch {B} is not divisible into {chunks} chunks")
  return x.reshape(B // chunks, chunks, *x.shape[1:]).swapaxes(0, 1)


def _merge(x):
  """Inverse of `_split`."""
  C, b = x.shape[:2]
  return x.swapaxes(0, 1).reshape(C * b, *x.shape[2:])


def value_and_grad(embed, params: Any, batch: Mapping[str, jax.Array], key: jax.Array, *, chunks: int,
                   loss_kw: Mapping[str, Any]) -> tuple[tuple[jax.Array, dict], Any]:
  """((loss, metrics), grads) of the in-batch softmax loss, computed chunk by chunk.

  embed(params, tokens_bxL, dropout_key) -> emb_bxD is the training-mode tower
  (st5_jax.train.make_embed_fn).
  """
  sides = [s for s in (LEFT, RIGHT, RIGHT_NEG) if s in batch]
  side_keys = dict(zip((LEFT, RIGHT, RIGHT_NEG), jax.random.split(key, 3)))

  tokens = {s: _split(batch[s], chunks) for s in sides}
  keys = {s: jax.random.split(side_keys[s], chunks) for s in sides}

  # 1. Embeddings of every chunk, no activations kept.
  frozen = jax.lax.stop_gradient(params)
  emb = {s: _merge(jax.lax.map(lambda a: embed(frozen, *a), (tokens[s], keys[s]))) for s in sides}

  # 2. Loss on the full batch and its gradient w.r.t. the embeddings.
  def loss_on(e):
    return losses.in_batch_softmax_loss(e[LEFT], e[RIGHT], e.get(RIGHT_NEG), **loss_kw)

  (loss, metrics), emb_grads = jax.value_and_grad(loss_on, has_aux=True)(emb)

  # 3. Chunk-wise backward: vjp of each chunk's embedding with its slice of the gradient.
  grads = jax.tree.map(jnp.zeros_like, params)
  for s in sides:
    def body(acc, a):
      tok_bxL, k, g_bxD = a
      _, vjp = jax.vjp(lambda p: embed(p, tok_bxL, k), params)
      (g_params,) = vjp(g_bxD)
      return jax.tree.map(jnp.add, acc, g_params), None

    grads, _ = jax.lax.scan(body, grads, (tokens[s], keys[s], _split(emb_grads[s], chunks)))
  return (loss, metrics), grads
