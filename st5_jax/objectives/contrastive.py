"""The paper's objective: in-batch softmax contrastive loss over the dual encoder's towers.

    L = -1/B sum_i log( exp(sim(q_i, p_i)/tau) / sum_j exp(sim(q_i, p_j)/tau) )

over every positive and hard negative of the global batch (Sentence-T5 eqs. 13-14,
st5_jax.losses.in_batch_softmax_loss), optionally bidirectional and label-smoothed.
`loss='simcse'` is SimCSE's supervised form (LayerAttPooler's): cosine logits and
`hard_negative_weight` added to each query's logit against its own hard negative
(SimCSE 0, LayerAttPooler 1.0; their temperature is 0.05). Batches: LEFT, RIGHT and,
with a `negative_targets` length, `num_negatives` = K hard-negative towers per example
(st5_jax.features.negative_features: RIGHT_NEG, then RIGHT_NEG_1 ... RIGHT_NEG_{K-1});
each query is scored against all B positives and all B*K negatives of the global batch,
logits [B, B*(1+K)] (st5_jax.losses: how K meets `bidirectional` and `hard_negative_weight`).

Matryoshka (`matryoshka_dims`, `matryoshka_weights`; sentence-transformers' MatryoshkaLoss): the
same loss on the first d dimensions of every tower's embedding, re-normalised, for each d, weighted
and summed (st5_jax.losses.matryoshka_loss), so a shipped model's embeddings can be cut to any of
those sizes. It sits inside the loss over embeddings, so it holds with hard negatives, in both
directions, with SimCSE's loss and with GradCache. gin: `gin/objectives/matryoshka.gin`.

Asymmetric towers (ST5Config.towers, st5_jax/model/st5.py): LEFT encodes with the query side, RIGHT and
every hard negative with the document side (`make_embed`, `tower_side`), also under GradCache; the bidirectional
loss then scores document-side positives against query-side queries in both directions.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, ClassVar, Mapping, Sequence

import jax
import jax.numpy as jnp

from st5_jax import flops, losses
from st5_jax.configs import ST5Config
from st5_jax.features import LEFT, MAX_NEGATIVES, NEGATIVE_TARGETS, RIGHT, RIGHT_NEG, negative_features
from st5_jax.model.st5 import SIDES, SentenceT5
from st5_jax.objectives import grad_cache
from st5_jax.objectives.base import Feature, Objective, ObjectiveConfigError, ValueAndGrad, rebox, register

log = logging.getLogger(__name__)
Array = jax.Array
LOSSES = ("st5", "simcse")
# (params, tokens_BxL, dropout key) -> emb_BxD
EmbedFn = Callable[[Any, Array, Array], Array]


def make_embed_fn(model: SentenceT5, boxed_params: Any | None = None, side: str | None = None) -> EmbedFn:
  """The training-mode tower (of `side`, for asymmetric towers); `boxed_params` re-boxes the parameters
  (st5_jax.objectives.base.rebox)."""
  side_kw = {} if side is None else {"side": side}

  def embed(params, tokens_BxL, key):
    return model.apply({"params": rebox(boxed_params, params)}, tokens_BxL, deterministic=False,
                       rngs={"dropout": key}, **side_kw)

  return embed


def make_embed(model: SentenceT5, boxed_params: Any | None, model_config: ST5Config) -> EmbedFn | dict[str, EmbedFn]:
  """The training-mode tower: one EmbedFn for a shared tower, {side: EmbedFn} for asymmetric towers (a stand-in
  tower with no config, model_config None, is shared)."""
  if not getattr(model_config, "asymmetric", False):
    return make_embed_fn(model, boxed_params)
  return {side: make_embed_fn(model, boxed_params, side) for side in SIDES}


def tower_side(feature: str) -> str:
  """The side a batch feature encodes with: LEFT the query side, RIGHT and the negatives the document side."""
  return "query" if feature == LEFT else "document"


def by_feature(embed: EmbedFn | Mapping[str, EmbedFn], features: Sequence[str]) -> EmbedFn | dict[str, EmbedFn]:
  """`embed` as grad_cache.value_and_grad takes it: unchanged for a shared tower, else {feature: its side's}."""
  if callable(embed):
    return embed
  return {f: embed[tower_side(f)] for f in features}


def embed_towers(embed: EmbedFn | Mapping[str, EmbedFn], params: Any, tokens: Mapping[str, Array],
                 key: Array) -> dict[str, Array]:
  """Embeddings of every tower (side -> tokens [B, L]) with one forward per distinct token shape.

  Shared towers (the default) share their weights, so sides of the same shape go through the model as one
  batch: fewer, larger matmuls, the weights read once, and one weight-gradient
  accumulation instead of one per tower (profile in docs/performance.md). They are stacked
  on axis 1 ([B, k, L] -> [B*k, L]), so each device's rows of the merged batch are its own
  rows of every tower: no data movement on a batch-sharded mesh. Rows are independent,
  so this equals one forward per tower (dropout masks come from one key per group).

  `embed` by side (asymmetric towers, `make_embed`): one group per side and shape, each through its side.
  """
  if not callable(embed):
    keys = jax.random.split(key, len(SIDES))
    out = {}
    for side, k in zip(SIDES, keys):
      mine = {f: t for f, t in tokens.items() if tower_side(f) == side}
      if mine:
        out.update(embed_towers(embed[side], params, mine, k))
    return out
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


def negative_sides(batch: Mapping[str, Any], num_negatives: int = 1) -> list[str]:
  """The batch's hard-negative towers, in order: none, or all `num_negatives` of them."""
  sides = [model_key for _, model_key in negative_features(num_negatives)]
  present = [s for s in sides if s in batch]
  if present and present != sides:
    raise ValueError(f"Contrastive.num_negatives = {num_negatives} reads the batch features {sides}; the batch "
                     f"has only {present}: give the task {num_negatives} negatives per example, or lower it")
  extra = sorted(s for s in batch if s.startswith(RIGHT_NEG) and s not in sides)
  if extra:
    raise ValueError(f"The batch has {len(present) + len(extra)} hard negatives per example ({extra} beyond "
                     f"Contrastive.num_negatives = {num_negatives}); set Contrastive.num_negatives to match")
  return present


def in_batch_loss(emb: Mapping[str, Array], negatives: list[str], loss_kw: Mapping[str, Any],
                  matryoshka: Sequence[tuple[int, float]] = ()):
  """The in-batch softmax loss over the towers' embeddings; the K negatives as a list of [B, D].

  matryoshka: (dimension, weight) pairs; when given, the weighted sum of the loss at each
  dimension (st5_jax.losses.matryoshka_loss).
  """
  def loss_on(e):
    return losses.in_batch_softmax_loss(e[LEFT], e[RIGHT], [e[s] for s in negatives] or None, **loss_kw)

  towers = {s: emb[s] for s in [LEFT, RIGHT] + list(negatives)}
  if not matryoshka:
    return loss_on(towers)
  dims, weights = zip(*matryoshka)
  return losses.matryoshka_loss(loss_on, towers, dims=dims, weights=weights)


def grad_cache_value_and_grad(embed: EmbedFn | Mapping[str, EmbedFn], params: Any, batch: Mapping[str, Array],
                              key: Array, *, chunks: int, loss_kw: Mapping[str, Any], num_negatives: int = 1,
                              matryoshka: Sequence[tuple[int, float]] = ()) -> tuple[tuple[Array, dict], Any]:
  """GradCache (st5_jax/objectives/grad_cache.py) of the in-batch softmax loss: one key per side.

  The sides are LEFT, RIGHT and the K negative towers, each with its own dropout key
  (split(key, 2 + K): K = 1 keeps the keys of the three-tower step).
  """
  negatives = negative_sides(batch, num_negatives)
  all_sides = [LEFT, RIGHT] + [model_key for _, model_key in negative_features(num_negatives)]
  side_keys = dict(zip(all_sides, jax.random.split(key, len(all_sides))))
  sides = [s for s in (LEFT, RIGHT) if s in batch] + negatives

  def loss_on(e, params_, batch_):
    del params_, batch_
    return in_batch_loss(e, negatives, loss_kw, matryoshka)

  return grad_cache.value_and_grad(by_feature(embed, sides), loss_on, params, batch,
                                   {s: (batch[s], side_keys[s]) for s in sides}, chunks=chunks)


def negative_lengths(lengths: Mapping[str, int], num_negatives: int = 1) -> list[tuple[str, str]]:
  """(model feature, length key) of the K negative towers; each has its own length or the `negative_targets` one."""
  if NEGATIVE_TARGETS not in lengths:
    return []
  return [(model_key, task_key if task_key in lengths else NEGATIVE_TARGETS)
          for task_key, model_key in negative_features(num_negatives)]


def contrastive_step_flops(config: ST5Config, *, global_batch_size: int, lengths: Mapping[str, int],
                           num_negatives: int = 1, matryoshka_dims: Sequence[int] = ()) -> float:
  """Forward + backward (3x forward) FLOPs: every tower, and the [B, B(1+K)] similarity logits (once per
  Matryoshka dimension, on that many dimensions)."""
  B = global_batch_size
  towers = [lengths["inputs"], lengths["targets"]] + [lengths[k] for _, k in negative_lengths(lengths, num_negatives)]
  forward = sum(B * flops.encoder_forward_flops(config, L) for L in towers)
  candidates = B * (len(towers) - 1)  # B positives and B*K negatives
  forward += 2 * B * candidates * (sum(matryoshka_dims) or config.output_dim)  # similarity logits
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
  # K: hard negatives per example the batch holds (st5_jax.features.negative_features); with
  # a `negative_targets` length the query is scored against all B*K negatives of the batch.
  num_negatives: int = 1
  # Matryoshka: the loss also (or only) on the first d dimensions of the embeddings, re-normalised, for
  # each d, weighted by matryoshka_weights (default 1.0 each) and summed. () is off.
  matryoshka_dims: tuple[int, ...] = ()
  matryoshka_weights: tuple[float, ...] = ()

  def __post_init__(self):
    # gin writes lists as often as tuples; the objective stays hashable and its config JSON the same.
    object.__setattr__(self, "matryoshka_dims", tuple(self.matryoshka_dims))
    object.__setattr__(self, "matryoshka_weights", tuple(self.matryoshka_weights))
    self._check_matryoshka()
    if isinstance(self.num_negatives, bool) or not isinstance(self.num_negatives, int) \
        or not 1 <= self.num_negatives <= MAX_NEGATIVES:
      raise ObjectiveConfigError(f"Contrastive.num_negatives must be an int in 1..{MAX_NEGATIVES} (hard negatives "
                                 f"per example), got {self.num_negatives!r}")
    if self.loss not in LOSSES:
      raise ObjectiveConfigError(f"Contrastive.loss must be one of {LOSSES}, got {self.loss!r}")
    if self.loss == "st5" and self.hard_negative_weight:
      raise ObjectiveConfigError("Contrastive.hard_negative_weight belongs to the SimCSE loss; set "
                                 "Contrastive.loss = 'simcse' to use it (the ST5 loss has no hard-negative weight).")

  def _check_matryoshka(self) -> None:
    dims, weights = self.matryoshka_dims, self.matryoshka_weights
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
      raise ObjectiveConfigError(f"Contrastive.matryoshka_dims must be positive ints (embedding sizes), got {dims!r}")
    if len(set(dims)) != len(dims):
      raise ObjectiveConfigError(f"Contrastive.matryoshka_dims lists a dimension twice: {dims!r}")
    if weights and not dims:
      raise ObjectiveConfigError("Contrastive.matryoshka_weights is set without Contrastive.matryoshka_dims")
    if weights and len(weights) != len(dims):
      raise ObjectiveConfigError(f"Contrastive.matryoshka_weights needs one weight per dimension of "
                                 f"matryoshka_dims {dims!r}, got {weights!r}")
    if any(isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0 for w in weights):
      raise ObjectiveConfigError(f"Contrastive.matryoshka_weights must be numbers >= 0, got {weights!r}")

  def matryoshka(self) -> tuple[tuple[int, float], ...]:
    """(dimension, weight) pairs of the Matryoshka loss; () when it is off."""
    weights = self.matryoshka_weights or (1.0,) * len(self.matryoshka_dims)
    return tuple((int(d), float(w)) for d, w in zip(self.matryoshka_dims, weights))

  def check(self, model_config, train_config) -> None:
    del train_config
    if not self.matryoshka_dims:
      return
    D = model_config.output_dim
    if max(self.matryoshka_dims) > D:
      raise ObjectiveConfigError(f"Contrastive.matryoshka_dims {self.matryoshka_dims} has dimensions larger than the "
                                 f"model's {D}-d embeddings; use dimensions <= {D} or raise st5_model.embedding_dim")
    if max(self.matryoshka_dims) < D:
      log.warning("Contrastive.matryoshka_dims %s stops below the model's %d dimensions: the last %d get no "
                  "gradient from the loss (list %d as well to train the whole embedding)",
                  self.matryoshka_dims, D, D - max(self.matryoshka_dims), D)

  def loss_kwargs(self) -> dict[str, Any]:
    """Keyword arguments of losses.in_batch_softmax_loss for this objective."""
    kw = dict(temperature=self.temperature, bidirectional=self.bidirectional, label_smoothing=self.label_smoothing)
    if self.loss == "simcse":
      kw.update(similarity="cosine", hard_negative_weight=self.hard_negative_weight)
    return kw

  def features(self, lengths: Mapping[str, int]) -> dict[str, Feature]:
    out = {LEFT: Feature("inputs"), RIGHT: Feature("targets")}
    if self.num_negatives > 1:
      lengths[NEGATIVE_TARGETS]  # noqa: B018  (KeyError: K > 1 negatives need their length)
    out.update({model_key: Feature(k) for model_key, k in negative_lengths(lengths, self.num_negatives)})
    for f in out.values():
      lengths[f.length_key]  # noqa: B018  (KeyError: a length the data config must give)
    return out

  def make_value_and_grad(self, model, boxed_params, model_config, train_config) -> ValueAndGrad:
    embed = make_embed(model, boxed_params, model_config)
    loss_kw, matryoshka = self.loss_kwargs(), self.matryoshka()
    chunks, K = train_config.grad_cache_chunks, self.num_negatives

    def loss_fn(params, batch, key):
      negatives = negative_sides(batch, K)
      # Towers of one length (the K negatives, and the positives when theirs is the same) are one forward.
      emb = embed_towers(embed, params, {s: batch[s] for s in [LEFT, RIGHT] + negatives}, key)
      return in_batch_loss(emb, negatives, loss_kw, matryoshka)

    def value_and_grad(params, batch, key):
      if chunks > 1:
        return grad_cache_value_and_grad(embed, params, batch, key, chunks=chunks, loss_kw=loss_kw, num_negatives=K,
                                         matryoshka=matryoshka)
      return jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key)

    return value_and_grad

  def step_flops(self, model_config, *, global_batch_size, lengths) -> float:
    return contrastive_step_flops(model_config, global_batch_size=global_batch_size, lengths=lengths,
                                  num_negatives=self.num_negatives, matryoshka_dims=self.matryoshka_dims)
