"""The paper's objective: in-batch softmax contrastive loss over the dual encoder's towers.

    L = -1/B sum_i log( exp(sim(q_i, p_i)/tau) / sum_j exp(sim(q_i, p_j)/tau) )

over every positive and hard negative of the global batch (Sentence-T5 eqs. 13-14,
st5_jax.losses.in_batch_softmax_loss), optionally bidirectional and label-smoothed.
`loss='simcse'` is SimCSE's supervised form (LayerAttPooler's): cosine logits and
`hard_negative_weight` added to each query's logit against its own hard negative
(SimCSE 0, LayerAttPooler 1.0; their temperature is 0.05). Batches: LEFT, RIGHT and,
with a `negative_targets` length, RIGHT_NEG (st5_jax.features).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping

import jax
import jax.numpy as jnp

from st5_jax import flops, losses
from st5_jax.configs import ST5Config
from st5_jax.features import LEFT, RIGHT, RIGHT_NEG
from st5_jax.model.st5 import SentenceT5
from st5_jax.objectives import grad_cache
from st5_jax.objectives.base import Feature, Objective, ObjectiveConfigError, ValueAndGrad, rebox, register

Array = jax.Array
LOSSES = ("st5", "simcse")
# (params, tokens_BxL, dropout key) -> emb_BxD
EmbedFn = Callable[[Any, Array, Array], Array]


def make_embed_fn(model: SentenceT5, boxed_params: Any | None = None) -> EmbedFn:
  """The training-mode tower; `boxed_params` re-boxes the parameters (st5_jax.objectives.base.rebox)."""

  def embed(params, tokens_BxL, key):
    return model.apply({"params": rebox(boxed_params, params)}, tokens_BxL, deterministic=False,
                       rngs={"dropout": key})

  return embed


def embed_towers(embed: EmbedFn, params: Any, tokens: Mapping[str, Array], key: Array) -> dict[str, Array]:
  """Embeddings of every tower (side -> tokens [B, L]) with one forward per distinct token shape.

  The towers share their weights, so sides of the same shape go through the model as one
  batch: fewer, larger matmuls, the weights read once, and one weight-gradient
  accumulation instead of one per tower (profile in docs/performance.md). They are stacked
  on axis 1 ([B, k, L] -> [B*k, L]), so each device's rows of the merged batch are its own
  rows of every tower: no data movement on a batch-sharded mesh. Rows are independent,
  so this equals one forward per tower (dropout masks come from one key per group).
  """
  groups: dict[tuple[int, ...], list[str]] = {}
  for side, t in tokens.items():
    groups.setdefault(tuple(t.shape), []).append(side)
  keys = jax.random.split(key, len(groups))
  out = {}
  for (shape, sides), k in zip(groups.items(), keys):
    if len(sides) == 1:
      out[sides[0]] = embed(params, tokens[sides[0]], k)
      continue
    B = shape[0]
    stacked_BxkxL = jnp.stack([tokens[s] for s in sides], axis=1)
    emb_BkxD = embed(params, stacked_BxkxL.reshape(B * len(sides), *shape[1:]), k)
    emb_BxkxD = emb_BkxD.reshape(B, len(sides), -1)
    out.update({s: emb_BxkxD[:, i] for i, s in enumerate(sides)})
  return out


def grad_cache_value_and_grad(embed: EmbedFn, params: Any, batch: Mapping[str, Array], key: Array, *, chunks: int,
                              loss_kw: Mapping[str, Any]) -> tuple[tuple[Array, dict], Any]:
  """GradCache (st5_jax/objectives/grad_cache.py) of the in-batch softmax loss: one key per side."""
  sides = [s for s in (LEFT, RIGHT, RIGHT_NEG) if s in batch]
  side_keys = dict(zip((LEFT, RIGHT, RIGHT_NEG), jax.random.split(key, 3)))

  def loss_on(e, params_, batch_):
    del params_, batch_
    return losses.in_batch_softmax_loss(e[LEFT], e[RIGHT], e.get(RIGHT_NEG), **loss_kw)

  return grad_cache.value_and_grad(embed, loss_on, params, batch, {s: (batch[s], side_keys[s]) for s in sides},
                                   chunks=chunks)


def contrastive_step_flops(config: ST5Config, *, global_batch_size: int, lengths: Mapping[str, int]) -> float:
  """Forward + backward (3x forward) FLOPs: every tower, and the [B, B(+B)] similarity logits."""
  B = global_batch_size
  towers = [lengths["inputs"], lengths["targets"]]
  if "negative_targets" in lengths:
    towers.append(lengths["negative_targets"])
  forward = sum(B * flops.encoder_forward_flops(config, L) for L in towers)
  candidates = B * (len(towers) - 1)
  forward += 2 * B * candidates * config.output_dim  # similarity logits
  return 3.0 * forward


@register
@dataclasses.dataclass(frozen=True)
class Contrastive(Objective):
  """The in-batch softmax loss (the paper's, or SimCSE's with `loss='simcse'`); gin `@Contrastive()`."""

  name: ClassVar[str] = "contrastive"
  example_gin: ClassVar[str] = "st5_tiny_cpu.gin"
  task_modules: ClassVar[tuple[str, ...]] = ("st5_jax.data.tasks",)

  temperature: float = 0.01
  bidirectional: bool = False
  label_smoothing: float = 0.0
  # "st5": the paper's in-batch softmax on dot products. "simcse": cosine logits and
  # `hard_negative_weight` added to each query's logit against its own hard negative.
  loss: str = "st5"
  hard_negative_weight: float = 0.0

  def __post_init__(self):
    if self.loss not in LOSSES:
      raise ObjectiveConfigError(f"Contrastive.loss must be one of {LOSSES}, got {self.loss!r}")
    if self.loss == "st5" and self.hard_negative_weight:
      raise ObjectiveConfigError("Contrastive.hard_negative_weight belongs to the SimCSE loss; set "
                                 "Contrastive.loss = 'simcse' to use it (the ST5 loss has no hard-negative weight).")

  def loss_kwargs(self) -> dict[str, Any]:
    """Keyword arguments of losses.in_batch_softmax_loss for this objective."""
    kw = dict(temperature=self.temperature, bidirectional=self.bidirectional, label_smoothing=self.label_smoothing)
    if self.loss == "simcse":
      kw.update(similarity="cosine", hard_negative_weight=self.hard_negative_weight)
    return kw

  def features(self, lengths: Mapping[str, int]) -> dict[str, Feature]:
    out = {LEFT: Feature("inputs"), RIGHT: Feature("targets")}
    if "negative_targets" in lengths:
      out[RIGHT_NEG] = Feature("negative_targets")
    for f in out.values():
      lengths[f.length_key]  # noqa: B018  (KeyError: a length the data config must give)
    return out

  def make_value_and_grad(self, model, boxed_params, model_config, train_config) -> ValueAndGrad:
    embed = make_embed_fn(model, boxed_params)
    loss_kw = self.loss_kwargs()
    chunks = train_config.grad_cache_chunks

    def loss_fn(params, batch, key):
      emb = embed_towers(embed, params, {s: batch[s] for s in (LEFT, RIGHT, RIGHT_NEG) if s in batch}, key)
      return losses.in_batch_softmax_loss(emb[LEFT], emb[RIGHT], emb.get(RIGHT_NEG), **loss_kw)

    def value_and_grad(params, batch, key):
      if chunks > 1:
        return grad_cache_value_and_grad(embed, params, batch, key, chunks=chunks, loss_kw=loss_kw)
      return jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key)

    return value_and_grad

  def step_flops(self, model_config, *, global_batch_size, lengths) -> float:
    return contrastive_step_flops(model_config, global_batch_size=global_batch_size, lengths=lengths)
