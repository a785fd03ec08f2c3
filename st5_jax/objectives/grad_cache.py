"""Gradient caching (Gao et al., 2021): a full-batch loss over embeddings on small memory.

A loss that couples every example of the global batch (in-batch softmax, NT-Xent)
cannot simply be split into micro-batches. GradCache splits the *backward* pass instead:

  1. embed the batch chunk by chunk without keeping activations;
  2. compute the loss on the full batch of embeddings and its gradient with respect to
     the embeddings (cheap: [B, D] arrays) and to the parameters the loss reads itself
     (a classifier head);
  3. for each chunk, recompute its embeddings and back-propagate that chunk's slice of
     the embedding gradient into the parameters, accumulating.

Peak activation memory is one chunk's; the gradient equals the full-batch gradient
(same dropout masks in steps 1 and 3, so also with dropout). Chunks interleave rows
(chunk c holds rows c, c+C, ...), so each chunk stays spread over every device of the
batch axes. One implementation for every objective whose loss is over per-example
embeddings: it says how to embed one tower's inputs, and the loss on all towers.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

Array = jax.Array
# (params, inputs of one tower (a pytree with a leading batch axis), dropout key) -> emb_bxD
EmbedFn = Callable[[Any, Any, Array], Array]
# (embeddings by tower, params, batch) -> (loss, metrics)
LossOnEmbeddings = Callable[[Mapping[str, Array], Any, Mapping[str, Array]], tuple[Array, dict]]


def split(x, chunks: int):
  """[B, ...] -> [C, B/C, ...] with chunk c = rows c, c+C, c+2C, ..."""
  B = x.shape[0]
  if B % chunks:
    raise ValueError(f"GradCache: batch {B} is not divisible into {chunks} chunks")
  return x.reshape(B // chunks, chunks, *x.shape[1:]).swapaxes(0, 1)


def merge(x):
  """Inverse of `split`."""
  C, b = x.shape[:2]
  return x.swapaxes(0, 1).reshape(C * b, *x.shape[2:])


def value_and_grad(embed: EmbedFn | Mapping[str, EmbedFn], loss_on: LossOnEmbeddings, params: Any,
                   batch: Mapping[str, Array], towers: Mapping[str, tuple[Any, Array]], *,
                   chunks: int) -> tuple[tuple[Array, dict], Any]:
  """((loss, metrics), grads) of `loss_on` over the towers' embeddings, computed chunk by chunk.

  towers: {name: (inputs, dropout key)}; each chunk of a tower gets its own key from
  `jax.random.split(key, chunks)`, in steps 1 and 3 alike. `embed`: one EmbedFn, or one per tower name
  (asymmetric towers: each side its own parameters).
  """
  embed_of = dict(embed) if isinstance(embed, Mapping) else {name: embed for name in towers}
  parts = {name: (jax.tree.map(lambda x: split(x, chunks), inputs), jax.random.split(k, chunks))
           for name, (inputs, k) in towers.items()}

  # 1. Embeddings of every chunk, no activations kept.
  frozen = jax.lax.stop_gradient(params)
  embs = {name: merge(jax.lax.map(lambda a, f=embed_of[name]: f(frozen, *a), part)) for name, part in parts.items()}

  # 2. Loss on the full batch; its gradient w.r.t. the embeddings and the parameters it reads itself.
  (loss, metrics), (emb_grads, grads) = jax.value_and_grad(loss_on, argnums=(0, 1), has_aux=True)(
      embs, params, batch)

  # 3. Chunk-wise backward: vjp of each chunk's embedding with its slice of the gradient.
  for name, part in parts.items():
    def body(acc, a, f=embed_of[name]):
      inputs_b, k, g_bxD = a
      _, vjp = jax.vjp(lambda p: f(p, inputs_b, k), params)
      (g_params,) = vjp(g_bxD)
      return jax.tree.map(jnp.add, acc, g_params), None

    grads, _ = jax.lax.scan(body, grads, (*part, split(emb_grads[name], chunks)))
  return (loss, metrics), grads
